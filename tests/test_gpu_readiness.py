"""What a GPU user's run depends on, checked on this CPU: host-device synchronisations per decoding
step (counted by SyncAudit, specbench/tools/sync_audit.py), TR's matrix writes whatever order the
device applies duplicates in, the compiled CUDA path's cache capacity, attention kernel and recompile
limit, the results' device identity, loading Vicuna's published layout, the dtype a GPU run defaults
to and the GPU sweep's defaults. The CUDA-only counterparts at the end run where a GPU is."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest
import torch
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import TorchDispatchMode

from specbench.decoding.engine import Engine
from specbench.tools.sync_audit import SyncAudit
from specbench.speculation.cost import CostCurve
from specbench.registry import available_methods, build_drafter

ROOT = Path(__file__).resolve().parents[1]
# A prompt that repeats itself, so retrieval (PLD, tr_fused's chain) matches and trees are accepted deep
COPY_PROMPT = [{"role": "user", "content": "Repeat this list exactly, twice: apple, banana, cherry, date, "
                                           "elderberry, fig, grape, honeydew, kiwi, lemon, mango."}]
# Synchronisations per greedy step: the accepted path coming back (every method), and for tr_fused the
# template's tokens read for merging the retrieval chain (steps with a match only). The others: what
# their method reads on the host each step (Lookahead its Jacobi window's guesses and the root's row,
# REST and PLD nothing beyond the path: their drafts go to the device in one queued copy; EAGLE-2 its
# candidates' confidences, to build the tree it keeps).
BUDGET = {"ar": 1, "tr": 1, "tr_fused": 2, "tr_adaptive": 1, "pld": 1, "rest": 1, "medusa": 1, "lookahead": 3,
          "eagle": 2}
# accelerator defaults where they differ from the CPU's: no per-step confidences
ACCELERATOR_SETTINGS = {"tr_adaptive": {"confidence": False}, "tr_fused": {"confidence": False},
                        # the prompt's rows in the matrix: TR's trees are accepted deep from the start
                        "tr": {"prefill_update": True}}


def audited_generation(method: str, real_model, max_new: int = 32):
    from specbench.inputs.chat import prompt_ids

    model, tok, eos = real_model
    with SyncAudit(model) as audit:  # the drafter is built inside: its tensors are seen being made
        drafter = build_drafter(method, vocab_size=model.get_output_embeddings().weight.shape[0], model=model,
                                device=model.device, model_name="smollm2-135m", dtype_name="float32",
                                hardware_curve=CostCurve(widths=[1, 128], times=[0.02, 0.025]),
                                **ACCELERATOR_SETTINGS.get(method, {}))
        for part in vars(drafter).values():  # modules moved with Module.to keep their Parameter objects
            if isinstance(part, torch.nn.Module):
                audit.mark(*part.parameters(), *part.buffers())
        propose = drafter.propose

        def labelled(state):
            audit.step = state.step
            return propose(state)

        drafter.propose = labelled
        out = Engine(model, eos).generate(prompt_ids(tok, COPY_PROMPT), drafter, max_new)
    return audit, drafter, out


@pytest.mark.parametrize("method", [m for m in BUDGET if m in available_methods()])
def test_a_decoding_step_synchronises_within_its_budget(method, real_model):
    audit, drafter, out = audited_generation(method, real_model)
    assert out.decoding_steps >= 5
    over = {s: audit.syncs(s) for s in range(out.decoding_steps) if len(audit.syncs(s)) > BUDGET[method]}
    assert not over, f"{method}: steps over the budget of {BUDGET[method]}: {over}"
    assert not audit.early_reads(), audit.early_reads()
    if method in ("tr", "tr_fused"):  # accepted paths left the first rows, so compaction gathered rows
        assert max(out.accept_lengths) >= 3
    if method == "tr_fused":  # the merge (the read that must wait for its copy) happened
        assert drafter.take_statistics()["retrieval_steps"] > 0


def test_the_audit_sees_what_a_gpu_would_wait_for():
    """SyncAudit's own rules, so the budget test cannot pass by missing a synchronisation."""
    from specbench.decoding.transfers import HostCopy, to_device

    weight = torch.nn.Linear(4, 4)
    with SyncAudit(weight) as audit:
        audit.step = 0
        x = weight(torch.ones(1, 4))  # host input, device weights: an implicit copy
        audit.step = 1
        int(x.argmax())
        x.tolist()
        x[x > 0]  # a boolean mask: its size is read back
        torch.tensor([1, 2], device=torch.device("cpu"))  # host data to the device, blocking
        x[torch.zeros(1, dtype=torch.long, device=torch.device("cpu"))] = 1.0  # a number copied in, blocking
        x[0, :2] = 0.0  # basic indices: a fill, no copy
        audit.step = 2
        y = to_device([1, 2, 3], torch.device("cpu"))  # queued from pinned memory: free
        copy = HostCopy(x)
        copy.wait()  # waits on a copy under way: a synchronisation
        audit.step = 3
        early = HostCopy(y)
        early._host.tolist()  # read before anything synchronised: an error on CUDA
    assert len(audit.syncs(0)) == 1 and len(audit.syncs(1)) == 5
    assert audit.syncs(2) == ["HostCopy.wait (copy still under way)"]
    assert len(audit.early_reads()) == 1


class OpCounter(TorchFunctionMode):
    def __init__(self):
        super().__init__()
        self.count = Counter()

    def __torch_function__(self, func, types, args=(), kwargs=None):
        self.count[getattr(func, "__name__", str(func))] += 1
        return func(*args, **(kwargs or {}))


class ReversedDuplicateWrites(TorchDispatchMode):
    """CUDA's `index_put_` leaves the order of duplicate indices undefined; this applies them in reverse,
    so code relying on "the last write wins" gets the first."""

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func is torch.ops.aten.index_put_.default and not (args[3] if len(args) > 3 else False):
            dst, (index,), values = args[0], args[1], args[2]
            if values.dim() == 0:
                values = values.expand(index.shape)
            return func(dst, (index.flip(0),), values.flip(0) if values.shape[:1] == index.shape else values)
        return func(*args, **kwargs)


@pytest.mark.parametrize("method", ["tr", "tr_adaptive"])
def test_matrix_rows_come_from_each_tokens_last_row_in_any_write_order(method):
    torch.use_deterministic_algorithms(True)
    try:
        adaptive = {"confidence": True, "hardware_curve": CostCurve(widths=[1, 8], times=[1.0, 1.1])}
        drafter = build_drafter(method, vocab_size=11, k=2, tree=[[2], [1, 1]],
                                **(adaptive if method == "tr_adaptive" else {}))
        tokens = torch.tensor([3, 5, 3, 3])
        logits = torch.randn(4, 11, generator=torch.Generator().manual_seed(0))
        with ReversedDuplicateWrites():
            drafter.source.write_rows(tokens, logits)
    finally:
        torch.use_deterministic_algorithms(False)
    want = logits[3].topk(2).indices.int()
    assert torch.equal(drafter.matrix[3], want) and torch.equal(drafter.matrix[5], logits[1].topk(2).indices.int())
    if method == "tr_adaptive":
        p = logits[3].softmax(-1)[want.long()]
        assert torch.allclose(drafter.probs[3], p)


def test_a_fixed_shape_run_keeps_one_reserved_capacity(tiny_llama, monkeypatch):
    """CUDA's fixed shapes (here on CPU without graphs): the runner reserves the longest turn's capacity
    and every shorter turn uses it, instead of a new capacity (graphs and buffers) mid-run."""
    from specbench.decoding.compiled import CompiledForward

    monkeypatch.setattr(CompiledForward, "prepare", lambda self, cache, hidden: None)  # shapes, not graphs
    engine = Engine(tiny_llama, eos_token_ids=[])
    engine.compiled = CompiledForward(tiny_llama, engine._mask, fixed_shapes=True)
    engine.new_cache(3000, 128, reserve=True)  # the longest prompt of the run
    for prompt_len in (20, 700, 2900):
        engine.new_cache(prompt_len, 128)
    assert list(engine.compiled._caches) == [engine.compiled.reserved]


def test_the_runner_reserves_a_capacity_for_fixed_shapes_too(tiny_llama, real_model, monkeypatch):
    from specbench.run.prompts import reserve_compiled_cache
    from specbench.decoding.compiled import CompiledForward
    from specbench.inputs.questions import Question
    from specbench.methods.ar import Autoregressive

    monkeypatch.setattr(CompiledForward, "prepare", lambda self, cache, hidden: None)
    engine = Engine(tiny_llama, eos_token_ids=[])
    engine.compiled = CompiledForward(tiny_llama, engine._mask, fixed_shapes=True)
    questions = [Question(question_id=1, category="qa", turns=["word " * 1500])]
    reserve_compiled_cache(engine, [Autoregressive], real_model[1], questions, "auto", 64)
    assert engine.compiled.reserved is not None and engine.compiled.reserved >= 1500


def test_a_fixed_shape_cache_compacts_every_layer_in_one_operation(tiny_llama):
    """CUDA's static cache: the layers' buffers are views of one stacked tensor each, and compaction
    moves the kept rows of all of them at once, exactly as layer by layer would."""
    from specbench.decoding.compiled import CompiledForward
    from specbench.decoding.kv_cache import compact_kv_cache

    forward = CompiledForward(tiny_llama, Engine(tiny_llama, eos_token_ids=[])._mask, fixed_shapes=True)
    cache = forward.cache_for(8, 8)
    g = torch.Generator().manual_seed(0)
    for layer in cache.layers:
        layer.keys.copy_(torch.randn(layer.keys.shape, generator=g))
        layer.values.copy_(torch.randn(layer.values.shape, generator=g))
        layer.cumulative_length.fill_(20)
    want = [(layer.keys.clone(), layer.values.clone()) for layer in cache.layers]
    keep = [0, 2, 5, 6]
    with OpCounter() as ops:
        compact_kv_cache(cache, 12, keep)
    assert ops.count["index_select"] == ops.count["index_copy_"] == 2  # keys and values, all layers'
    assert ops.count["fill_"] == 1
    for layer, (k, v) in zip(cache.layers, want):
        assert torch.equal(layer.keys[..., 12:16, :], k[..., [12 + r for r in keep], :])
        assert torch.equal(layer.values[..., :12, :], v[..., :12, :]) and int(layer.cumulative_length) == 16
    assert len({id(layer.stacked) for layer in cache.layers}) == 1


def test_grouped_query_attention_inside_sdpa_only_where_it_is_fast():
    from specbench.decoding.compiled import sdpa_gqa_with_mask

    assert sdpa_gqa_with_mask("cpu") and not sdpa_gqa_with_mask("cuda") and not sdpa_gqa_with_mask("cuda:1")


def test_a_recompile_past_the_limit_fails_the_run_instead_of_going_eager(tiny_llama):
    from specbench.decoding.compiled import CompiledForward, RecompileLimitError
    from specbench.draft import Draft, DraftTree

    engine = Engine(tiny_llama, eos_token_ids=[])
    engine.compiled = CompiledForward(tiny_llama, engine._mask, margin_rows=16, fixed_shapes=True)
    torch._dynamo.reset()
    chain = Draft(tokens=torch.tensor([1, 2]), tree=DraftTree.chain(2))
    with torch.inference_mode():
        cache = engine.compiled.cache_for(8, 8)
        with torch._dynamo.config.patch(recompile_limit=1):
            engine.compiled.step(cache, 1, 1, None, engine.tree_tensors, False)  # the 1-row graph
            with pytest.raises(RecompileLimitError, match="recompile limit"):  # a 16-row one: over the limit
                engine.compiled.step(cache, 1, 1, chain, engine.tree_tensors, False)
    torch._dynamo.reset()


def test_results_identity_names_the_gpu():
    from specbench.run.plan import identity
    from tests.test_config import plan_of

    cfg = {"model": {"name": "vicuna-7b"}, "task": {"name": "spec_bench"}, "max_new_tokens": 8, "dtype": "float16"}
    a100 = identity(plan_of(cfg, "NVIDIA A100-SXM4-80GB", device="cuda"))
    h100 = identity(plan_of(cfg, "NVIDIA H100 80GB HBM3", device="cuda"))
    assert a100 != h100
    cpu = identity(plan_of(cfg, "x86_64 (2 threads)", device="cpu"))
    assert "device_name" not in cpu  # the CPU's results keep the identity they were made with


def write_vicuna_layout(folder: Path) -> Path:
    """A tiny Llama in Vicuna v1.3's published layout: sharded `pytorch_model-*.bin` with their index,
    a SentencePiece `tokenizer.model` (LlamaTokenizer) and a float16 config."""
    import io

    import sentencepiece as spm
    from transformers import LlamaConfig, LlamaForCausalLM

    folder.mkdir(parents=True, exist_ok=True)
    text = ["A chat between a curious user and an artificial intelligence assistant.",
            "USER: What is the capital of France? ASSISTANT: Paris is the capital of France.",
            "The quick brown fox jumps over the lazy dog. 0123456789"] * 20
    model_file = io.BytesIO()
    spm.SentencePieceTrainer.train(sentence_iterator=iter(text), model_writer=model_file, vocab_size=400,
                                   model_type="bpe", bos_id=1, eos_id=2, unk_id=0, pad_id=-1, byte_fallback=True,
                                   character_coverage=1.0, minloglevel=2)
    (folder / "tokenizer.model").write_bytes(model_file.getvalue())
    (folder / "tokenizer_config.json").write_text(json.dumps(
        {"tokenizer_class": "LlamaTokenizer", "bos_token": "<s>", "eos_token": "</s>", "unk_token": "<unk>",
         "add_bos_token": True, "legacy": False}))
    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=400, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=4, bos_token_id=1, eos_token_id=2)
    state = LlamaForCausalLM(config).state_dict()
    keys = list(state)
    weight_map = {}
    for i, part in enumerate((keys[: len(keys) // 2], keys[len(keys) // 2 :])):
        name = f"pytorch_model-0000{i + 1}-of-00002.bin"
        torch.save({k: state[k].half() for k in part}, folder / name)
        weight_map.update({k: name for k in part})
    (folder / "pytorch_model.bin.index.json").write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))
    config_json = config.to_dict()
    config_json.pop("dtype", None)
    config_json["torch_dtype"] = "float16"  # as Vicuna v1.3's config.json says
    (folder / "config.json").write_text(json.dumps(config_json))
    return folder


def test_a_model_in_vicunas_published_layout_loads_and_decodes(tmp_path):
    from specbench.inputs.models import load_model, model_config, run_dtype

    folder = write_vicuna_layout(tmp_path / "tiny-vicuna")
    cfg = {"name": "tiny-vicuna", "path": str(folder), "chat_template": "vicuna"}
    assert run_dtype("auto", "cuda", model_config(cfg)) == "float16"  # a GPU run takes the published dtype
    assert run_dtype("auto", "cpu", model_config(cfg)) == "float32"
    model, tok = load_model(cfg, torch.device("cpu"), torch.float32)
    assert type(tok).__name__ == "LlamaTokenizer" and tok("USER: Paris").input_ids[0] == 1
    out = Engine(model, [2]).generate(tok("USER: Paris").input_ids, build_drafter("pld"), 8)
    want = Engine(model, [2]).generate(tok("USER: Paris").input_ids, build_drafter("ar"), 8)
    assert out.tokens == want.tokens and len(out.tokens) >= 1


def test_without_sentencepiece_the_loader_says_what_to_install(tmp_path, monkeypatch):
    import importlib.util

    from specbench.errors import ModelLoadError
    from specbench.inputs.models import load_model

    folder = tmp_path / "m"
    folder.mkdir()
    (folder / "tokenizer.model").write_bytes(b"")
    find_spec = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda n, *a: None if n == "sentencepiece" else find_spec(n, *a))
    with pytest.raises(ModelLoadError, match=r'pip install -e "\.\[gpu\]"'):
        load_model({"name": "m", "path": str(folder), "chat_template": "vicuna"}, torch.device("cpu"), torch.float32)


def test_dtype_auto_is_float32_on_the_cpu_and_float16_for_a_gguf_model_on_a_gpu():
    from specbench.inputs.models import model_config, named_model_config, run_dtype

    smol = model_config(named_model_config("smollm2-135m"))
    assert run_dtype("auto", "cpu", smol) == "float32"
    assert run_dtype("auto", "cuda", smol) == "float16"
    assert run_dtype("bfloat16", "cuda", None) == "bfloat16"


def test_the_gpu_sweep_runs_every_method_eager_and_compiled_on_the_largest_model_in_float16():
    env = {**os.environ, "DRY_RUN": "1", "QUESTIONS": str(ROOT / "tests/fixtures/spec_bench_sample.jsonl"),
           "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"}  # this venv's python
    done = subprocess.run(["bash", "scripts/gpu_sweep.sh"], cwd=ROOT, env=env, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    runs = [line for line in done.stdout.splitlines() if line.startswith("+ python run.py")]
    for compile_setting in ("off", "on"):
        methods = {r.split("method=")[1].split()[0] for r in runs if f"compile={compile_setting}" in r}
        assert methods == set(available_methods()), compile_setting
    assert all("model=gemma3-270m" in r and "dtype=float16" in r for r in runs)


# -- on a GPU ------------------------------------------------------------------------------------

cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")


@cuda
@pytest.mark.parametrize("method", ["ar", "tr", "tr_fused"])
def test_on_cuda_a_step_synchronises_within_its_budget(method, real_model):
    """torch's own sync detector on the real device: every synchronising call warns; counted per step."""
    import copy
    import warnings

    from specbench.inputs.chat import prompt_ids

    model = copy.deepcopy(real_model[0]).cuda()
    drafter = build_drafter(method, vocab_size=model.get_output_embeddings().weight.shape[0], model=model,
                            device=model.device, model_name="smollm2-135m", dtype_name="float32",
                            hardware_curve=CostCurve(widths=[1, 128], times=[0.02, 0.025]))
    engine = Engine(model, real_model[2])
    prompt = prompt_ids(real_model[1], COPY_PROMPT)
    engine.generate(prompt, drafter, 8)  # warm-up: lazy initialisations synchronise once
    torch.cuda.set_sync_debug_mode("warn")
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            out = engine.generate(prompt, drafter, 24)
    finally:
        torch.cuda.set_sync_debug_mode(0)
    syncs = [w for w in caught if "synchroniz" in str(w.message)]
    # prefill's first token and the turn's end are one each; the rest is the steps'
    # the warning names no operation: where it was raised does (the Python line that called it)
    where = sorted({f"{Path(w.filename).name}:{w.lineno}" for w in syncs})
    assert len(syncs) <= BUDGET[method] * out.decoding_steps + 2, (len(syncs), out.decoding_steps, where)
