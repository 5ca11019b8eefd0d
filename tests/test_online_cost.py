"""Rows priced from the run's own steps (speculation/online_cost.py): the correction's arithmetic, the
tables a chooser reads, the engine's timed forward reaching the drafter, and the choice it moves."""

import pytest
import torch

from specbench.speculation.cost import CostCurve, StepTimes
from specbench.speculation.goodput import choose_nodes
from specbench.speculation.online_cost import PRIOR_STEPS, REFRESH, RowCostCorrection


def test_nothing_measured_leaves_the_curve_alone():
    assert RowCostCorrection(5).factors() == [1.0] * 5


def test_a_width_measured_dearer_than_the_curve_says_is_priced_so_relative_to_one_row():
    c = RowCostCorrection(8, half_life=1e9, prior_steps=0.0)
    for _ in range(10):
        c.add(1, 0.022, 0.020)  # one row: 10% over the curve
        c.add(4, 0.033, 0.025)  # four rows: 32% over it
    f = c.factors()
    assert f[0] == 1.0
    assert f[3] == pytest.approx(1.32 / 1.10)
    assert f[1] == pytest.approx(1 + (1.32 / 1.10 - 1) / 3)  # widths between are interpolated
    assert f[4:] == pytest.approx([1.32 / 1.10] * 4)  # and held flat beyond the widest measured


def test_the_prior_pulls_a_width_with_few_steps_towards_the_curve():
    c = RowCostCorrection(2, half_life=1e9)
    c.add(1, 1.0, 1.0)
    c.add(2, 2.0, 1.0)  # one step at twice the curve's time
    assert c.factors()[1] == pytest.approx((PRIOR_STEPS + 2.0) / (PRIOR_STEPS + 1.0))


def test_old_steps_fade():
    c = RowCostCorrection(2, half_life=10, prior_steps=0.0)
    for _ in range(200):
        c.add(1, 1.0, 1.0)
        c.add(2, 2.0, 1.0)
    for _ in range(200):
        c.add(1, 1.0, 1.0)
        c.add(2, 1.2, 1.0)
    assert c.factors()[1] == pytest.approx(1.2, abs=1e-3)


def test_a_step_without_a_clock_teaches_nothing():
    c = RowCostCorrection(3)
    c.add(2, 0.0, 1.0)
    c.add(2, 1.0, 0.0)
    assert c.steps == 0 and c.factors() == [1.0] * 3


def flat_curve() -> CostCurve:
    return CostCurve(widths=[1, 16], times=[0.020, 0.021])


def test_step_times_take_the_correction_every_refresh_and_stay_non_decreasing():
    times = StepTimes(flat_curve(), 8, online=True)
    before, version = times.at(300), times.version
    for i in range(REFRESH - 1):
        times.learn(1 if i % 2 else 6, 300, 0.020 if i % 2 else 0.040)
    assert times.at(300) == before and times.version == version  # not before the refresh
    times.learn(1, 300, 0.020)
    after = times.at(300)
    assert times.version == version + 1
    assert after[0] == pytest.approx(before[0]) and after[5] > 1.5 * before[5]
    assert all(a <= b for a, b in zip(after, after[1:]))
    times.forget()
    assert times.at(300) == before


def test_without_online_nothing_is_learnt():
    times = StepTimes(flat_curve(), 8)
    before = times.at(None)
    for _ in range(2 * REFRESH):
        times.learn(6, None, 0.5)
    assert times.at(None) == before and times.version == 0


def test_rows_measured_dear_are_bought_less():
    """On a flat curve a likely tree is worth its rows; once the run's steps show rows cost twice a
    plain step's time, the same estimates buy a smaller tree."""
    p, parents = [0.9, 0.8, 0.7, 0.6, 0.5, 0.4], [0, 1, 2, 3, 4, 5]
    times = StepTimes(flat_curve(), 7, online=True)
    wide = choose_nodes(p, parents, times.at(None), 0.05)
    for i in range(4 * REFRESH):
        rows = 1 + (i % 7)
        times.learn(rows, None, 0.020 * (1 + 0.5 * (rows - 1)))  # each row half a plain step more
    narrow = choose_nodes(p, parents, times.at(None), 0.05)
    assert len(wide) == 6 and len(narrow) < len(wide)


def test_the_engine_hands_a_cpu_forward_its_time(tiny_llama):
    """Each step's outcome carries the forward's seconds on a CPU target."""
    from specbench.decoding.engine import Engine
    from specbench.draft import Draft, DraftTree

    from specbench.drafter import Drafter

    class Chain(Drafter):
        def __init__(self):
            super().__init__()
            self.seen = []

        def propose(self, state):
            return Draft(tokens=torch.tensor([5, 6]), tree=DraftTree.chain(2))

        def observe(self, outcome):
            self.seen.append(outcome.forward_seconds)

    drafter = Chain()
    Engine(tiny_llama, eos_token_ids=[]).generate([1, 2, 3, 4], drafter, 6)
    assert drafter.seen and all(s is not None and s > 0 for s in drafter.seen)
