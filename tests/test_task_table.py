"""The per-task table: tasks side by side, a row per leading method, the column's best in bold."""

import pytest

from specbench.report import task_table


def row(method, task, temperature, overall, mat=2.0, std=None, n=1, params=None, flags=()):
    return {"model": "smollm2-135m", "task": task, "temperature": temperature, "top_k": 0, "top_p": 1.0,
            "max_new_tokens": 128, "dtype": "float32", "device": "cpu", "method": method,
            "method_params": params or {}, "warmup_on": "builtin", "overall": overall, "overall_std": std,
            "mat": mat, "n": n, "timing_flags": list(flags)}


ROWS = [row("ar", "spec_bench-ps2", 0, 1.0, 1.0),
        row("tr_fused", "spec_bench-ps2", 0, 1.47, 1.88, std=0.02, n=3),
        row("suffix", "spec_bench-ps2", 0, 1.48, 1.60, std=0.05, n=3),
        row("pld", "spec_bench-ps2", 0, 1.32),
        row("tr_fused", "code_edit-ps2", 0, 2.5, 4.1),
        row("suffix", "code_edit-ps2", 0, 2.2, 3.9),
        row("pld", "code_edit-ps2", 0, 2.6, 4.2, flags=["1 timed question(s) under other load"]),
        row("tr", "code_edit-ps2", 0, 1.1),
        row("suffix", "code_edit-ps2", 0.7, 1.5)]


def test_columns_put_temperatures_then_tasks_in_order():
    assert task_table.columns(ROWS) == [(0, "spec_bench"), (0, "code_edit"), (0.7, "code_edit")]


def test_a_task_on_a_kept_cache_is_its_own_column_beside_the_task():
    rows = [row("suffix", "agent_loop-ps1-pc", 0, 3.4), row("suffix", "long", 0, 1.1),
            row("suffix", "agent_loop-ps1", 0, 2.6), row("suffix", "code_edit-ps2-pc", 0, 2.9)]
    assert task_table.task_name("agent_loop-ps1-pc") == "agent_loop-pc"
    assert task_table.task_name("spec_bench-ps2") == "spec_bench"
    assert task_table.columns(rows) == [(0, "code_edit-pc"), (0, "agent_loop"), (0, "agent_loop-pc"), (0, "long")]


def test_a_cell_measured_again_in_a_later_folder_takes_only_those_runs():
    rows = [{**row("suffix", "code_edit-ps2", 0.7, 1.69), "root": 0},
            {**row("suffix", "code_edit-ps2", 0.7, 1.60), "root": 1},
            {**row("suffix", "code_edit-ps2", 0.7, 1.62), "root": 1},
            {**row("suffix", "code_edit-ps2", 0, 2.68), "root": 0},
            {**row("pld", "code_edit-ps2", 0.7, 1.21), "root": 0}]
    kept = task_table.latest_root(rows)
    assert [r["overall"] for r in kept] == [1.60, 1.62, 2.68, 1.21]


def test_the_table_bolds_each_columns_best_and_keeps_every_winner():
    md = task_table.task_table(ROWS, top=2)
    lines = md.splitlines()
    assert lines[0] == "| method | spec_bench T=0 | code_edit T=0 | code_edit T=0.7 |"
    body = {line.split(" | ")[0].strip("| "): line for line in lines[2:]}
    # top=2: the two column winners only (tr_fused, best nowhere, would be the next)
    assert set(body) == {"suffix", "pld"}
    assert "**1.48x ± 0.05** (1.60, n=3)" in body["suffix"] and "**1.50x** (2.00, n=1)" in body["suffix"]
    assert "**2.60x**† (4.20, n=1)" in body["pld"]  # not timed alone: marked
    assert "| - |" in body["pld"]  # pld never ran at 0.7
    body = {line.split(" | ")[0].strip("| "): line for line in task_table.task_table(ROWS, top=3).splitlines()[2:]}
    assert "1.47x ± 0.02 (1.88, n=3)" in body["tr_fused"] and "tr" not in body and "ar" not in body


def test_a_winner_is_kept_even_past_top():
    rows = ROWS + [row("tr", "code_edit-ps2", 0.7, 3.0)]
    body = [line.split(" | ")[0].strip("| ") for line in task_table.task_table(rows, top=1).splitlines()[2:]]
    assert set(body) == {"suffix", "pld", "tr"}


def test_more_rows_follow_those_that_ran_in_more_columns_then_by_mean_speedup():
    rows = ROWS + [row("sps", "code_edit-ps2", 0, 9.0)]  # fastest, but in one column only: not before tr_fused
    order = [line.split(" | ")[0].strip("| ") for line in task_table.task_table(rows, top=4).splitlines()[2:]]
    assert order[:3] == ["suffix", "tr_fused", "pld"] and order[3] == "sps"


def test_variants_of_one_method_are_told_apart_by_what_departs_from_its_defaults():
    rows = ROWS + [row("tr_fused", "code_edit-ps2", 0, 2.7, params={"retrieval": "suffix", "suffix_global": False})]
    rows[4] = {**rows[4], "method_params": {"retrieval": "pld", "suffix_global": False}}  # the defaults
    labels = task_table.cells(rows)
    assert set(labels) == {"tr_fused (retrieval=suffix)", "tr_fused", "suffix", "pld", "tr"}
    assert set(labels["tr_fused"]) == {(0, "spec_bench"), (0, "code_edit")}  # one row across both sweeps


def test_interleaved_runs_supersede_shared_ones_of_the_same_method_task_and_temperature():
    def run(method, temperature, mode, params=None):
        return {**row(method, "code_edit-ps2", temperature, 2.0, params=params), "baseline_mode": mode}

    rows = [run("suffix", 0, "shared"), run("suffix", 0, "interleave"), run("suffix", 0, "interleave"),
            run("suffix", 0.7, "shared"),  # no interleaved run at 0.7: kept
            run("pld", 0, "shared"),
            run("tr_fused", 0, "shared", {"retrieval": "suffix"}), run("tr_fused", 0, "interleave")]
    kept = task_table.interleaved_first(rows)
    assert [(r["method"], r["temperature"], r["baseline_mode"]) for r in kept] == [
        ("suffix", 0, "interleave"), ("suffix", 0, "interleave"), ("suffix", 0.7, "shared"), ("pld", 0, "shared"),
        ("tr_fused", 0, "shared"), ("tr_fused", 0, "interleave")]  # another variant's runs stay


def test_the_readme_block_is_replaced_between_its_markers():
    from specbench.markdown import replace_between

    text = "a\n<!-- b -->\nold\nold\n<!-- e -->\nz\n"
    assert replace_between(text, "new\n", "<!-- b -->", "<!-- e -->") == "a\n<!-- b -->\nnew\n<!-- e -->\nz\n"
    with pytest.raises(ValueError):
        replace_between("no markers", "x", "<!-- b -->", "<!-- e -->")


def test_the_plot_gives_each_temperature_a_panel_as_wide_as_its_tasks():
    from specbench.report import plots

    rows = ROWS + [row("suffix", "agent_loop-ps1-pc", 0, 3.4)]
    by_label = task_table.cells(rows)
    cols = task_table.columns([r for r in rows if r["method"] != "ar"])
    fig = plots.speedup_by_task(by_label, cols, ["tr_fused", "suffix"])
    left, right = fig.axes[:2]
    assert [t.get_text() for t in left.get_xticklabels()] == ["spec_bench", "code_edit", "agent_loop-pc"]
    assert [t.get_text() for t in right.get_xticklabels()] == ["code_edit"]
    assert left.get_position().width == pytest.approx(3 * right.get_position().width, rel=0.05)
    plots.plt.close(fig)
