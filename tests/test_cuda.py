"""On a CUDA GPU only (skipped elsewhere; scripts/gpu_check.py runs them on a lent GPU): the engine's
eager and compiled (CUDA graphs) forwards in float16 and bfloat16 decode what eager AR decodes, the
compiled forward does not fall back to eager, TR's matrix update is the same whatever order the GPU
applies duplicate writes in, a compiled step synchronises within its budget, and the fixed-shape step's
CUDA graphs: replayed logits within the rounding band of eager's, a grown cache captured again, and
EAGLE's and Medusa's hidden-state graphs."""

from __future__ import annotations

import copy
import warnings
from collections import Counter
from pathlib import Path

import pytest
import torch
from transformers import DynamicCache

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
        tr.source.write(tokens, logits)
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


# -- the fixed-shape step on static buffers, its forward captured as CUDA graphs (static_step.py) ----

def _tree_logits(engine, model, prefix, draft, root, hidden=False, cache=None):
    """One verification forward over `draft` after `prefix` (prefilled eagerly into the engine's cache)."""
    from specbench.decoding.kv_cache import with_cache

    cache = engine.new_cache(len(prefix), 16, hidden) if cache is None else cache
    with torch.inference_mode():
        model(input_ids=torch.tensor([prefix], device="cuda"), **with_cache(model, cache), use_cache=True)
    return engine.forward_rows(cache, len(prefix), draft, root, hidden), cache


def _within_band(got, want, dtype):
    """Every row's top margins moved by rounding only: at most the band the lossless check allows."""
    from specbench.run.rounding_band import margin_spread, rounding_band

    name = str(dtype).replace("torch.", "")
    spread = margin_spread(want, got)
    bands = torch.tensor([rounding_band(float(m), name) for m in want.float().abs().amax(dim=-1)], device=spread.device)
    return bool((spread <= bands).all()), (spread - bands).max().item()


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_replayed_logits_equal_eager_within_the_band(tiny_llama, dtype):
    """The graph replays on the bucket's buffers: no dynamo guard, no new tensor, logits in the graph's
    own output buffer; tree rows' logits equal the eager forward's within the rounding band."""
    from specbench.draft import Draft, DraftTree

    model = on_cuda(tiny_llama, dtype)
    engine = Engine(model, eos_token_ids=[], compiled=True)
    g = torch.Generator().manual_seed(0)
    prefix = torch.randint(0, 97, (20,), generator=g).tolist()
    tree = DraftTree((0, 0, 1, 1, 2, 3))
    draft = Draft(tokens=torch.randint(0, 97, (len(tree),), generator=g).cuda(), tree=tree)
    (got, _), cache = _tree_logits(engine, model, prefix, draft, 5)
    assert engine.compiled.runners.captured, f"no graph captured: {engine.compiled.runners.failed}"
    (want, _), _ = _tree_logits(Engine(model, eos_token_ids=[]), model, prefix, draft, 5, cache=DynamicCache())
    ok, over = _within_band(got, want, dtype)
    assert ok, f"replayed logits outside the band by {over}"
    replay = engine.compiled.runners.get((cache.layers[0].max_cache_len, 16, False))
    assert replay(cache)[0].data_ptr() == replay(cache)[0].data_ptr()  # the graph's own buffer, every replay


def test_a_growing_cache_recaptures_for_the_larger_capacity(tiny_llama):
    from specbench.draft import Draft, DraftTree

    model = on_cuda(tiny_llama, torch.float16)
    engine = Engine(model, eos_token_ids=[], compiled=True)
    engine.context_length = 4096  # the tiny model's rotary positions run past its declared 256
    cache = engine.new_cache(10, 10)
    cap = cache.layers[0].max_cache_len
    prefix = [1 + i % 96 for i in range(cap - 12)]  # a 16-row bucket no longer fits
    draft = Draft(tokens=torch.arange(1, 7, device="cuda"), tree=DraftTree.chain(6))
    (got, _), _ = _tree_logits(engine, model, prefix, draft, 7, cache=cache)
    bigger = cache.layers[0].max_cache_len
    assert bigger > cap and (bigger, 16, False) in engine.compiled.runners.captured
    (want, _), _ = _tree_logits(Engine(model, eos_token_ids=[]), model, prefix, draft, 7, cache=DynamicCache())
    assert _within_band(got, want, torch.float16)[0]


@pytest.mark.parametrize("method", ["eagle", "medusa"])
def test_hidden_state_drafters_decode_as_ar_through_captured_graphs(real_model, method):
    """EAGLE and Medusa read the target's last hidden states: the graphs with hidden states are captured
    and replayed, and the method decodes what AR decodes (float32, so no near-tie flips)."""
    from specbench.inputs.chat import prompt_ids
    from specbench.registry import build_drafter

    base, tok, eos = real_model
    model = copy.deepcopy(base).to("cuda")
    ids = prompt_ids(tok, [{"role": "user", "content": "Repeat exactly: red, green, blue, red, green, blue."}])
    ar = Engine(model, eos).generate(ids, Autoregressive(), 48)
    engine = Engine(model, eos, compiled=True)
    drafter = build_drafter(method, vocab_size=model.get_output_embeddings().weight.shape[0], model=model,
                            device=model.device, model_name="smollm2-135m", dtype_name="float32")
    out = engine.generate(ids, drafter, 48)
    assert out.tokens == ar.tokens
    assert any(key[2] for key in engine.compiled.runners.captured), engine.compiled.runners.failed
    assert not engine.compiled.runners.failed and max(out.accept_lengths) > 1
