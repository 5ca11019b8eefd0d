import pytest

from specbench.run import metrics


def rec(qid, subtask, tokens, time, accept):
    return {"question_id": qid, "subtask": subtask,
            "turns": [{"new_tokens": tokens, "wall_time": time, "prefill_time": 0.5, "accept_lengths": accept}]}


def test_speed_mat_and_speedup_follow_spec_bench():
    ar = [rec(1, "qa", 10, 1.0, [1] * 10), rec(2, "rag", 20, 4.0, [1] * 20)]
    m = [rec(1, "qa", 10, 0.5, [2] * 5), rec(2, "rag", 20, 1.0, [3, 3, 4])]
    assert metrics.tokens_per_s(ar) == pytest.approx((10 + 5) / 2)
    assert metrics.tokens_per_s(m) == pytest.approx((20 + 20) / 2)
    assert metrics.mat(m) == pytest.approx((2 * 5 + 3 + 3 + 4) / 8)
    sp = metrics.speedup(m, ar)
    assert sp["overall"] == pytest.approx(20 / 7.5)  # mean of speeds over mean of speeds
    assert sp["qa"] == pytest.approx(2.0) and sp["rag"] == pytest.approx(4.0)


def test_decode_only_excludes_prefill():
    r = rec(1, "qa", 10, 2.5, [1] * 10)
    assert metrics.question_speed(r, decode_only=True) == pytest.approx(10 / 2.0)


def test_multi_turn_question_speed_sums_turns():
    r = {"question_id": 1, "subtask": "mt", "turns": [
        {"new_tokens": 10, "wall_time": 1.0, "prefill_time": 0.1, "accept_lengths": [1]},
        {"new_tokens": 30, "wall_time": 3.0, "prefill_time": 0.1, "accept_lengths": [1]}]}
    assert metrics.question_speed(r) == pytest.approx(40 / 4.0)


def turn(accept, drafted=None, times=None, tokens=None, wall=1.0, prefill=0.1):
    t = {"new_tokens": tokens if tokens is not None else 1 + sum(accept), "wall_time": wall,
         "prefill_time": prefill, "accept_lengths": accept}
    if drafted is not None:
        t["step_drafted"] = drafted
    if times is not None:
        t["step_times"] = times
    return t


def q(qid, *turns, subtask="qa"):
    return {"question_id": qid, "subtask": subtask, "turns": list(turns)}


def test_accept_length_histogram_counts_steps_per_length():
    recs = [q(1, turn([3, 1, 1]), turn([4])), q(2, turn([1, 3]))]
    assert metrics.accept_length_histogram(recs) == {1: 3, 3: 2, 4: 1}
    assert list(metrics.accept_length_histogram(recs)) == [1, 3, 4]


def test_acceptance_by_depth_over_drafted_steps_only():
    # drafted steps accept 0, 1, 2, 2 draft tokens; the plain step (drafted 0) is left out
    recs = [q(1, turn([1, 2, 3, 3, 1], drafted=[4, 4, 4, 4, 0]))]
    d = metrics.acceptance_by_depth(recs)
    assert d["steps"] == 4
    assert d["marginal"] == pytest.approx([3 / 4, 2 / 4])
    assert d["conditional"] == pytest.approx([3 / 4, 2 / 3])


def test_drafted_token_acceptance_rate():
    recs = [q(1, turn([1, 2, 3, 1], drafted=[4, 4, 2, 0])), q(2, turn([4], drafted=[10]))]
    assert metrics.drafted_acceptance_rate(recs) == pytest.approx((0 + 1 + 2 + 0 + 3) / 20)
    assert metrics.drafted_acceptance_rate([q(1, turn([1, 1], drafted=[0, 0]))]) is None  # AR drafts nothing


def test_figures_that_need_step_fields_are_none_for_older_records():
    old = [q(1, turn([2, 3]))]
    mixed = old + [q(2, turn([2], drafted=[3], times=[0.1]))]
    for recs in (old, mixed):
        assert metrics.acceptance_by_depth(recs) is None
        assert metrics.drafted_acceptance_rate(recs) is None
        assert metrics.per_token_latency(recs) is None
    # the rest still reports
    assert metrics.ttft(old)["p50"] == pytest.approx(0.1) and metrics.tpot(old) is not None


def test_mat_per_step_pools_steps_mat_per_question_averages_questions():
    recs = [q(1, turn([1] * 8)), q(2, turn([3, 5]))]
    assert metrics.mat(recs) == pytest.approx(16 / 10)
    assert metrics.mat_per_question(recs) == pytest.approx((1 + 4) / 2)
    assert metrics.mat_per_question(recs + [q(3, turn([]))]) == pytest.approx(2.5)  # no step: left out


def test_percentile_is_linear_between_ranks():
    assert metrics.percentile([4, 1, 3, 2], 50) == pytest.approx(2.5)
    assert metrics.percentile([1, 2, 3, 4, 5], 90) == pytest.approx(4.6)
    assert metrics.percentile([7], 99) == 7


def test_ttft_is_the_prefill_time_of_every_turn():
    recs = [q(1, turn([1], prefill=0.1), turn([1], prefill=0.3)), q(2, turn([1], prefill=0.2))]
    t = metrics.ttft(recs)
    assert t["mean"] == pytest.approx(0.2) and t["p50"] == pytest.approx(0.2)
    assert t["p90"] == pytest.approx(0.28) and t["p99"] == pytest.approx(0.298)


def test_per_token_latency_gives_each_emitted_token_its_steps_share():
    # a step of 0.3 s emitting 3 tokens: three tokens at 0.1 s; a step of 0.5 s emitting 1: one at 0.5
    recs = [q(1, turn([3, 1], times=[0.3, 0.5]))]
    lat = metrics.per_token_latency(recs)
    assert lat["p50"] == pytest.approx(0.1)
    assert lat["p90"] == pytest.approx(0.1 + 0.4 * 0.7) and lat["p99"] == pytest.approx(0.1 + 0.4 * 0.97)


def test_tpot_per_question_leaves_each_turns_first_token_to_prefill():
    recs = [q(1, turn([1], tokens=11, wall=1.1, prefill=0.1), turn([1], tokens=5, wall=0.5, prefill=0.1)),
            q(2, turn([1], tokens=3, wall=0.5, prefill=0.1)), q(3, turn([], tokens=1, wall=0.1, prefill=0.1))]
    assert metrics.tpot(recs) == pytest.approx(((1.0 + 0.4) / 14 + 0.4 / 2) / 2)  # q3: no second token


def test_speedup_ci_brackets_the_speedup_and_is_seeded():
    ar = [rec(i, "qa", 10, 1.0, [1] * 10) for i in range(20)]
    m = [rec(i, "qa", 10, 1.0 / (1.5 + 0.05 * (i % 5)), [2] * 5) for i in range(20)]
    lo, hi = metrics.speedup_ci(m, ar)
    assert lo < metrics.speedup(m, ar)["overall"] < hi and 1.5 <= lo < hi <= 1.7
    assert metrics.speedup_ci(m, ar) == (lo, hi)  # seeded: the same interval every time
    same = [rec(i, "qa", 10, 0.5, [2] * 5) for i in range(20)]
    assert metrics.speedup_ci(same, ar) == pytest.approx((2.0, 2.0))  # no spread, no width
    assert metrics.speedup_ci(m[:1], ar) is None  # one question: nothing to resample
    assert metrics.speedup_ci(m, ar[10:]) == metrics.speedup_ci(m[10:], ar[10:])  # shared questions only


def test_repeated_speedup_ci_resamples_a_questions_runs_together():
    ar = [rec(i, "qa", 10, 1.0, [1] * 10) for i in range(20)]
    m1 = [rec(i, "qa", 10, 1.0 / (1.5 + 0.05 * (i % 5)), [2] * 5) for i in range(20)]
    m2 = [rec(i, "qa", 10, 1.0 / (1.7 + 0.05 * (i % 5)), [2] * 5) for i in range(20)]  # 0.2 faster on each
    one, two = metrics.question_speeds(m1, ar), metrics.question_speeds(m2, ar)
    lo, hi = metrics.speedup_ci(m1, ar)
    assert metrics.repeated_speedup_ci([one]) == (lo, hi)  # one run: that run's interval
    assert metrics.repeated_speedup_ci([one, one]) == (lo, hi)  # the same run twice: no wider
    # each resample averages the runs' speedups on the same questions: the interval moves by half the gap
    assert metrics.repeated_speedup_ci([one, two]) == pytest.approx((lo + 0.1, hi + 0.1))
    # only the questions every run answered
    partial = metrics.question_speeds(m2[:10], ar)
    assert metrics.repeated_speedup_ci([one, partial]) == metrics.repeated_speedup_ci(
        [metrics.question_speeds(m1[:10], ar), partial])
    assert metrics.repeated_speedup_ci([]) is None
    assert metrics.repeated_speedup_ci([one, metrics.question_speeds(m2[:1], ar)]) is None


def test_the_mean_interval_is_students_t():
    from scipy import stats

    for values in ([0.95, 1.05, 0.97, 1.03], [1.2, 1.1], list(range(40))):
        low, high = metrics.mean_interval_95(values)
        m, se = sum(values) / len(values), stats.sem(values)
        t = stats.t.ppf(0.975, len(values) - 1) if len(values) <= 31 else 1.960
        assert (low, high) == pytest.approx((m - t * se, m + t * se), rel=1e-3)
    assert metrics.mean_interval_95([1.0]) is None


# -- per subtask: the order, and the figures of input-length buckets ----------------------------------

def test_subtasks_keep_spec_bench_order_else_first_appearance():
    assert metrics.ordered_subtasks(["rag", "mt", "qa", "rag"]) == ["mt", "qa", "rag"]  # the leaderboard's order
    assert metrics.ordered_subtasks(["1k", "2k", "4k", "8k", "1k"]) == ["1k", "2k", "4k", "8k"]
    assert metrics.ordered_subtasks(["8k", "1k", "qa"]) == ["8k", "1k", "qa"]  # not all Spec-Bench's: as they come
    recs = [rec(i, s, 10, 1.0, [1]) for i, s in enumerate(["2k", "1k", "2k"])]
    assert metrics.subtasks(recs) == ["2k", "1k"]
    assert list(metrics.speedup(recs, recs)) == ["overall", "2k", "1k"]


def bucket(qid, sub, tokens_in, wall, prefill, **memory):
    t = turn([2] * 5, drafted=[4] * 5, wall=wall, prefill=prefill)
    return {"question_id": qid, "subtask": sub, "turns": [dict(t, input_tokens=tokens_in, **memory)]}


def test_subtask_figures_hold_prefill_apart_input_tokens_and_memory_peaks():
    base = [bucket(1, "1k", 1000, 2.0, 0.4), bucket(2, "1k", 1010, 2.0, 0.6), bucket(3, "8k", 7500, 8.0, 4.0)]
    mine = [bucket(1, "1k", 1000, 1.0, 0.4, kv_cache_bytes=10, drafter_state_bytes=3),
            bucket(2, "1k", 1010, 1.0, 0.6, kv_cache_bytes=12, drafter_state_bytes=2),
            bucket(3, "8k", 7500, 6.0, 4.0, kv_cache_bytes=70, drafter_state_bytes=5)]
    fig = metrics.subtask_figures(mine, base)
    assert list(fig) == ["1k", "8k"]
    one, eight = fig["1k"], fig["8k"]
    assert one["questions"] == 2 and one["input_tokens"] == pytest.approx(1005)
    assert one["speedup"] == pytest.approx(2.0) and eight["speedup"] == pytest.approx(8 / 6)
    assert eight["decode_speedup"] == pytest.approx((11 / 2.0) / (11 / 4.0))  # prefill left out on both sides
    assert one["prefill_time"] == pytest.approx(0.5) and one["baseline_prefill_time"] == pytest.approx(0.5)
    assert one["mat"] == 2 and one["drafted_token_rate"] == pytest.approx(5 / 20)
    assert (one["kv_cache_bytes"], one["drafter_state_bytes"], one["peak_device_bytes"]) == (12, 3, None)
    # older answers: no input tokens, no memory; no baseline: no speedups
    old = metrics.subtask_figures([rec(1, "qa", 10, 1.0, [1])], [])["qa"]
    assert old["input_tokens"] is None and old["kv_cache_bytes"] is None and old["speedup"] is None
    assert metrics.memory_peak(mine, "kv_cache_bytes") == 70 and metrics.prefill_time([]) is None
