"""The README's GPU table from a slot's gpu_check output (specbench/report/gpu_table.py), and the
rounds' statistics it and the node's summary use (specbench/intervals.py)."""

import json

import pytest

from specbench.intervals import round_stats
from specbench.report import gpu_table


def test_round_stats_give_a_mean_range_and_interval():
    st = round_stats([1.0, 1.2, 1.1])
    assert st["n"] == 3 and st["mean"] == pytest.approx(1.1) and (st["min"], st["max"]) == (1.0, 1.2)
    assert st["interval"] == pytest.approx([1.1 - 4.303 * 0.1 / 3 ** 0.5, 1.1 + 4.303 * 0.1 / 3 ** 0.5], abs=1e-4)
    assert "interval" not in round_stats([1.3]) and round_stats([]) is None


def row(method, speedup, rnd=1, ci=None, status="ok"):
    return {"method": method, "round": rnd, "status": status, "speedup": speedup, "decode_speedup": speedup - 0.1,
            "bound": 1.5, "predicted": speedup - 0.05, "mat": 1.4, "rows_per_step": 5.0, "step_ms": 2.0,
            "ar_step_ms": 1.6, "drafter_host_ms": {"propose": 0.1, "observe": 0.02}, "tokens_checked": 224,
            "tokens_outside_band": 0, "mismatches": 0, "speedup_ci": ci}


def slot(tmp_path, name, rows):
    d = tmp_path / name
    d.mkdir()
    (d / "stages.json").write_text(json.dumps({"real_model_compiled": {"rows": rows}}))
    return d


def test_a_slots_calls_make_one_table_fastest_first_with_intervals(tmp_path):
    first = slot(tmp_path, "run1", [row("tr", 0.7, ci=[0.6, 0.8]), row("pld", 1.1, 1), row("pld", 1.3, 2),
                                    {"method": "sps", "status": "SKIP(time)"}])
    second = slot(tmp_path, "run2", [row("pld", 1.2, 3), row("eagle", 0.3, status="error: no head")])
    figures = gpu_table.method_figures(gpu_table.slot_rows([first, second]))
    assert [f["method"] for f in figures] == ["pld", "tr"]  # failed and skipped rows left out
    pld, tr = figures
    assert pld["rounds"] == 3 and pld["speedup"] == pytest.approx(1.2) and pld["checked"] == 672
    assert pld["interval"] == round_stats([1.1, 1.3, 1.2])["interval"]  # rounds: the t-interval
    assert tr["interval"] == [0.6, 0.8]  # one run: its bootstrap interval over questions
    text = gpu_table.table(figures)
    assert "| pld | 1.20x (" in text and "| tr | 0.70x (0.60x-0.80x) | 0.60x | 1.50x | 0.65x | 1.40 |" in text


def test_the_readme_block_is_replaced_between_its_markers_only():
    text = f"intro\n{gpu_table.BEGIN}\nold table\n{gpu_table.END}\nafter\n"
    assert gpu_table.replace_block(text, "new") == f"intro\n{gpu_table.BEGIN}\nnew\n{gpu_table.END}\nafter\n"
    with pytest.raises(ValueError, match="gpu-table"):
        gpu_table.replace_block("no markers", "new")
