"""Warm-up leaks nothing: after the runner's warm-up every registered drafter is in its freshly
built state, so a learning drafter (hot-start TR) meets the first measured question knowing only
what measured questions taught it. Spec-Bench's protocol (warmup_on=first_question) stays on offer."""

from __future__ import annotations

import random
import types
from collections import deque

import pytest
import torch

from specbench.run.question_loop import warm_up
from specbench.decoding.engine import Engine
from specbench.draft import DraftTree
from specbench.speculation.cost import CostCurve, StepTimes
from specbench.inputs.tasks import MINI, WARMUP_QUESTION
from specbench.registry import available_methods, build_drafter


def state_of(obj, depth: int = 0):
    """A comparable snapshot of a drafter's attributes (tensors by value, containers recursively)."""
    if depth > 6:
        return repr(type(obj))
    if isinstance(obj, torch.Tensor):
        return ("tensor", str(obj.dtype), tuple(obj.shape), obj.detach().cpu().flatten().tolist())
    if isinstance(obj, (list, tuple, deque)):
        return (type(obj).__name__, [state_of(v, depth + 1) for v in obj])
    if isinstance(obj, dict):
        return {repr(k): state_of(v, depth + 1) for k, v in obj.items()}
    if isinstance(obj, random.Random):
        return obj.getstate()
    if isinstance(obj, (int, float, str, bool, type(None))):
        return obj
    if isinstance(obj, torch.nn.Module):  # weights (Medusa heads) are loaded, never learnt
        return type(obj).__name__
    if isinstance(obj, types.BuiltinFunctionType):  # a kernel bound to the drafter's arrays, compared through them
        return ("bound", obj.__name__)
    if isinstance(obj, DraftTree):  # a tree is its parents; masks and child lists are lazy caches
        return ("DraftTree", obj.parents)
    if isinstance(obj, StepTimes):  # t(w) per context bucket, tabled on first use: a lazy cache
        return ("StepTimes", state_of(obj.curve, depth + 1), obj.rows)
    if hasattr(obj, "__dict__"):
        return (type(obj).__name__, state_of(vars(obj), depth + 1))
    return repr(obj)


def _build(name, model):
    return build_drafter(name, vocab_size=model.get_output_embeddings().weight.shape[0], device="cpu",
                         model=model, model_name="smollm2-135m", dtype_name="float32",
                         hardware_curve=CostCurve(widths=[1, 128], times=[0.05, 0.05]))


def test_warmup_prompt_is_in_no_task():
    texts = {t for q in MINI for t in q.turns}
    assert not set(WARMUP_QUESTION.turns) & texts


@pytest.mark.parametrize("method", available_methods())
def test_after_warmup_every_drafter_equals_a_fresh_one(method, real_model):
    model, tok, eos = real_model
    engine = Engine(model, eos)
    fresh, warmed = _build(method, model), _build(method, model)
    warm_up(1, "builtin", engine, [warmed], tok, list(MINI), "auto", 12, None)
    assert state_of(warmed) == state_of(fresh), f"{method} keeps state from the warm-up"


def test_first_question_warmup_is_spec_bench_s_and_leaks(real_model):
    """The reference protocol warms up on all turns of the first question and keeps what it learnt."""
    model, tok, eos = real_model
    engine = Engine(model, eos)
    tr = _build("tr", model)
    warm_up(1, "first_question", engine, [tr], tok, [MINI[0]], "auto", 8, None)
    assert int(tr.matrix.count_nonzero()) > 0
