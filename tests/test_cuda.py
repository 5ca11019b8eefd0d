"""On a CUDA GPU only (skipped elsewhere; scripts/gpu_check.py runs them on a lent GPU): the engine's
eager and compiled (CUDA graphs) forwards in float16 and bfloat16 decode what eager AR decodes, the
compiled forward does not fall back to eager, TR's matrix update is the same whatever order the GPU
applies duplicate writes in, and a compiled step synchronises within its budget."""

from __future__ import annotations

import copy
import warnings
from collections import Counter
from pathlib import Path

import pytest
import torch

from specbench.decoding.engine import Engine
from specbench.methods.ar import Autoregressive
from specbench.methods.tr.base import TokenRecycling

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
DTYPES = [torch.float32, torch.float16, torch.bfloat16]
PROMPT = list(range(3, 20))


def on_cuda(model, dtype):
    return copy.deepcopy(model).to("cuda", dtype)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_compiled_tr_equals_eager_ar(tiny_llama, dtype):
    model = on_cuda(tiny_llama, dtype)
    ar = Engine(model, eos_token_ids=[]).generate(PROMPT, Autoregressive(), 40)
    engine = Engine(model, eos_token_ids=[], compiled=True)
    assert engine.compiled is not None, "the compiled CUDA forward fell back to eager"
    tr = TokenRecycling(vocab_size=97, device="cuda")
    for _ in range(2):  # the second time with TR's matrix warm: deeper trees through the same graphs
        out = engine.generate(PROMPT, tr, 40)
        assert out.tokens == ar.tokens
    assert engine.forward_name == "compiled"
    assert max(out.accept_lengths) > 1


@pytest.mark.parametrize("dtype", DTYPES[1:], ids=str)
def test_compiled_ar_equals_eager_ar_on_a_sliding_window_model(tiny_gemma, dtype):
    model = on_cuda(tiny_gemma, dtype)
    eager = Engine(model, eos_token_ids=[]).generate(PROMPT, Autoregressive(), 24)
    compiled = Engine(model, eos_token_ids=[], compiled=True)
    assert compiled.compiled is not None
    assert compiled.generate(PROMPT, Autoregressive(), 24).tokens == eager.tokens


def test_tr_matrix_update_is_deterministic_on_cuda():
    """Duplicate tokens in one write: the last row wins on the GPU too, run after run."""
    tokens = torch.tensor([3, 5, 3, 3], device="cuda")
    logits = torch.randn(4, 11, generator=torch.Generator().manual_seed(0)).cuda()
    rows = []
    for _ in range(3):
        tr = TokenRecycling(vocab_size=11, device="cuda", k=2, tree=[[2], [1, 1]])
        tr._write(tokens, logits)
        rows.append(tr.matrix.clone())
    assert all(torch.equal(r, rows[0]) for r in rows)
    assert torch.equal(rows[0][3], logits[3].topk(2).indices.int())
    assert torch.equal(rows[0][5], logits[1].topk(2).indices.int())


def test_a_compiled_step_synchronises_once(tiny_llama):
    """torch's sync detector on CUDA graphs: the accepted path coming back is the step's one sync."""
    model = on_cuda(tiny_llama, torch.float16)
    engine = Engine(model, eos_token_ids=[], compiled=True)
    tr = TokenRecycling(vocab_size=97, device="cuda")
    engine.generate(PROMPT, tr, 16)  # recording and lazy initialisations synchronise once
    torch.cuda.set_sync_debug_mode("warn")
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            out = engine.generate(PROMPT, tr, 32)
    finally:
        torch.cuda.set_sync_debug_mode(0)
    syncs = [w for w in caught if "synchroniz" in str(w.message)]
    where = Counter(f"{Path(w.filename).name}:{w.lineno}" for w in syncs)  # the message names no operation
    # one a step (the path read back), plus the prefill's three a turn: the prompt's copy to the device,
    # transformers' mask check and the first token read back (the H200 found exactly these)
    prefill_syncs = sum(n for line, n in where.items() if not line.startswith("engine.py"))
    assert len(syncs) - prefill_syncs == out.decoding_steps, (out.decoding_steps, where)
    assert prefill_syncs <= 3, where
