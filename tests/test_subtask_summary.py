"""A run's summary and console tables per subtask (specbench/run/single.py): task=long's buckets in their
order, the prefill apart from decode, and the memory of the largest turn."""

import pytest

from specbench.report.console import format_bytes, format_table, subtask_table
from specbench.run.summary import summarize
from tests.test_config import plan_of
from tests.test_tables import BUCKETS, bucket_record

CFG = plan_of({"method": {"name": "pld"}, "model": {"name": "smollm2-135m"}, "task": {"name": "long"},
               "dtype": "float32", "max_new_tokens": 16, "warmup": 0}, device_name="cpu")


def runs():
    """PLD 2x AR's speed on 1k, as fast on 8k; each bucket one prompt."""
    speed = {"1k": 20.0, "2k": 15.0, "4k": 12.5, "8k": 10.0}
    mine = [bucket_record(f"q-{b}", b, "pld", speed[b], n) for b, n in BUCKETS.items()]
    base = [bucket_record(f"q-{b}", b, "ar", 10.0, n) for b, n in BUCKETS.items()]
    return mine, base


def test_summary_per_bucket():
    mine, base = runs()
    s = summarize(CFG, mine, base, [])
    assert s["subtasks"] == ["1k", "2k", "4k", "8k"] and list(s["subtask_mat"]) == s["subtasks"]
    assert list(s["speedup"]) == ["overall", *s["subtasks"]] and list(s["decode_speedup"]) == list(s["speedup"])
    eight = s["by_subtask"]["8k"]
    assert eight["input_tokens"] == 7500 and eight["speedup"] == pytest.approx(1.0)
    assert eight["prefill_time"] == pytest.approx(0.4) and s["by_subtask"]["1k"]["prefill_time"] == pytest.approx(0.2)
    assert eight["kv_cache_bytes"] == 46080 * 7515 and eight["drafter_state_bytes"] == 400
    assert eight["peak_device_bytes"] is None  # no CUDA here
    assert s["memory"] == {"kv_cache_bytes": 46080 * 7515, "drafter_state_bytes": 400, "peak_device_bytes": None}


def test_console_tables_name_the_buckets():
    mine, base = runs()
    s = summarize(CFG, mine, base, [])
    assert format_table(s).splitlines()[0].split("|")[2:6] == [" 1k    ", " 2k    ", " 4k    ", " 8k    "]
    lines = subtask_table(s).splitlines()
    assert [c.strip() for c in lines[0].split("|")[1:-1]] == [
        "subtask", "questions", "input tokens", "speedup", "decode", "MAT", "acc. rate", "prefill ms (method / AR)",
        "KV cache", "drafter state"]
    assert [c.strip() for c in lines[5].split("|")[1:-1]] == [
        "8k", "1", "7500", "1.00x", "1.00x", "2.00", "25.0%", "400 / 400", "330.2 MiB", "400 B"]


def test_bytes_read_in_their_unit():
    assert [format_bytes(n) for n in (None, 400, 1536, 2 ** 20, 3 * 2 ** 30 // 2)] == [
        "-", "400 B", "1.5 KiB", "1.0 MiB", "1.5 GiB"]


def test_the_step_split_is_ms_per_decoding_step_by_phase_over_every_turn():
    from specbench.run.summary import step_split_ms

    records = [{"turns": [{"decoding_steps": 2, "phase_seconds": {"propose": 0.002, "forward": 0.004}},
                          {"decoding_steps": 2, "phase_seconds": {"propose": 0.002, "forward": 0.008}}]},
               {"turns": [{"decoding_steps": 5}]}]  # an older record without phases: left out
    assert step_split_ms(records) == {"propose": 1.0, "forward": 3.0}
    assert step_split_ms([{"turns": [{"decoding_steps": 3}]}]) is None
