"""The drafting benchmark's replay (scripts/bench_drafting.py): a recorded decoding replayed into a fresh
drafter drafts the same, step for step, and a replay that drafts otherwise is counted as such."""

import sys
from dataclasses import replace
from pathlib import Path

import pytest
import torch

from specbench.decoding.engine import Engine
from specbench.speculation.cost import CostCurve

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "scripts"))
import bench_drafting  # noqa: E402

FLAT = CostCurve(widths=[1, 100], times=[1.0, 1.3], device="cpu", dtype="float32")


@pytest.mark.parametrize("temperature", [0.0, 0.7])
def test_a_recorded_decoding_replays_to_the_same_drafts(tiny_llama, temperature):
    engine = Engine(tiny_llama, eos_token_ids=[])
    questions = [(f"q{i}", list(range(3 + i, 13 + i))) for i in range(3)]
    events: list = []
    r = bench_drafting.replay("tr_fused", temperature, tiny_llama, engine, FLAT, questions, 24, events=events,
                              evict_mb=1)
    assert r["steps"] > 0 and r["replay_steps"] == r["steps"]
    assert r["replay_same_drafts"] == r["steps"]
    assert r["evicted_same_drafts"] == r["steps"]  # the caches swept between calls: the same decoding
    assert {e[0] for e in events} == {"start", "propose", "observe"}
    # one recorded draft changed: the replay no longer matches it at that step
    i = next(i for i, e in enumerate(events) if e[0] == "propose" and e[2] is not None and
             any(s[0] == "start" and s[2] for s in events[:i]))
    _, state, draft = events[i]
    events[i] = ("propose", state, replace(draft, tokens=draft.tokens + 1))
    again = bench_drafting.replay_recorded("tr_fused", temperature, tiny_llama, FLAT, events)
    assert again["same_drafts"] == r["steps"] - 1
