"""Every plot, PNG and PDF, from the hand-made results fixture."""

from pathlib import Path

import pytest

import matplotlib  # noqa: E402,F401  (the "plots" extra, in "test")

from specbench.report import collect, plots  # noqa: E402

FIXTURE = Path(__file__).resolve().parent / "fixtures" / "results"


def test_save_all_writes_png_and_pdf(tmp_path):
    fr = collect.frames(collect.load_runs(FIXTURE))
    written = plots.save_all(fr, tmp_path)
    kinds = {name.split("__")[0] for name in written}
    assert kinds == {"speedup_subtasks", "mat", "accept_lengths", "acceptance_depth", "tokens_over_run",
                     "speedup_vs_temperature"}
    # the T=0.7 run's answers lack step_drafted: no acceptance-by-depth plot for its setting
    assert [n for n in written if n.startswith("acceptance_depth")] == [
        "acceptance_depth__smollm2-135m_mini_t0_m32_float32_cpu"]
    assert "speedup_subtasks__smollm2-135m_mini_t0_m32_float32_cpu" in written
    for name in written:
        png, pdf = tmp_path / f"{name}.png", tmp_path / f"{name}.pdf"
        assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and pdf.read_bytes()[:5] == b"%PDF-"


def test_frames_shape():
    fr = collect.frames(collect.load_runs(FIXTURE))
    assert len(fr["runs"]) == 5 and len(fr["questions"]) == 35
    tr = fr["questions"][(fr["questions"]["method"] == "tr") & (fr["questions"]["repeat"] == 0)
                         & (fr["questions"]["temperature"] == 0)]
    assert tr.set_index("question_id").loc["mini-qa-2", "speedup"] == pytest.approx(1.5)
    assert set(fr["accepts"]["accept_length"]) == {1, 2, 3, 5}


def test_plot_script(tmp_path):
    from scripts.plot import main

    assert main([str(FIXTURE), "--out", str(tmp_path), "--formats", "png"]) == 0
    assert len(list(tmp_path.glob("*.png"))) == 10 and not list(tmp_path.glob("*.pdf"))


def test_acceptance_by_depth_is_drawn_from_the_records():
    fr = collect.frames(collect.load_runs(FIXTURE))
    t0 = fr["depths"][fr["depths"]["temperature"] == 0]
    fig = plots.acceptance_by_depth(t0)
    marginal, conditional = ({ln.get_label(): list(ln.get_ydata()) for ln in ax.lines} for ax in fig.axes)
    assert set(marginal) == {"tr", "pld"}  # AR drafts nothing: no line
    # TR (both repeats): of 88 drafted steps, 78 accept 2 or more draft tokens and 4 accept 4
    assert marginal["tr"] == pytest.approx([78 / 88, 78 / 88, 4 / 88, 4 / 88])
    assert conditional["tr"] == pytest.approx([78 / 88, 1.0, 4 / 78, 1.0])
    # PLD: of 15 drafted steps per turn, 10 accept one token; its 6 plain steps are not counted
    assert marginal["pld"] == pytest.approx([10 / 15]) and conditional["pld"] == pytest.approx([10 / 15])
    assert {ln.get_linestyle() for ln in fig.axes[1].lines} == {"--"}


def test_speedup_against_input_length_where_the_subtasks_are_buckets(tmp_path):
    from tests.test_tables import BUCKET_SPEEDUP, BUCKETS, write_bucket_root

    fr = collect.frames(collect.load_runs(write_bucket_root(tmp_path / "root")))
    assert plots.are_length_buckets(fr["runs"])
    assert not plots.are_length_buckets(collect.frames(collect.load_runs(FIXTURE))["runs"])  # Spec-Bench's: no
    fig = plots.speedup_vs_input_length(fr["runs"])
    lines = {c.get_label(): c.lines[0] for c in fig.axes[0].containers}  # one error-bar line per method
    assert set(lines) == {"pld", "tr"}  # AR is the dashed line at 1
    assert list(lines["pld"].get_xdata()) == pytest.approx([n + 5 for n in BUCKETS.values()])  # measured means
    assert list(lines["tr"].get_ydata()) == pytest.approx(list(BUCKET_SPEEDUP["tr"].values()))
    assert [t.get_text() for t in fig.axes[0].get_xticklabels()] == ["1k\n1005", "2k\n2005", "4k\n4005", "8k\n7505"]
    # the subtask bars name the buckets too
    bars = plots.speedup_subtasks(fr["runs"])
    assert [t.get_text() for t in bars.axes[0].get_xticklabels()] == ["1k", "2k", "4k", "8k", "Overall"]
    written = plots.save_all(fr, tmp_path / "plots", formats=("png",))
    assert "speedup_vs_input_length__smollm2-135m_long-ps2_t0_m16_float32_cpu" in written


def test_cost_curves_plot_each_curve_relative_to_its_own_single_row_step(tmp_path):
    import json

    from scripts.plot import main

    cpu = dict(model="m", device="cpu", dtype="float32", forward="eager", times_ms={"1": 20.0, "2": 30.0, "81": 100.0})
    gpu = dict(model="m", device="gpu", dtype="float16", times_ms={"1": 10.0, "81": 11.0})
    fig = plots.cost_curves([cpu, gpu])
    lines = {ln.get_label(): list(ln.get_ydata()) for ln in fig.axes[0].lines if not ln.get_label().startswith("_")}
    assert lines == {"m, cpu, float32, eager: t(1) = 20.0 ms": [1.0, 1.5, 5.0],
                     "m, gpu, float16, eager: t(1) = 10.0 ms": [1.0, pytest.approx(1.1)]}
    paths = []
    for name, c in (("a", cpu), ("b", gpu)):
        paths.append(tmp_path / f"{name}.json")
        paths[-1].write_text(json.dumps(c))
    assert main(["--cost-curves", *map(str, paths), "--out", str(tmp_path), "--formats", "png"]) == 0
    assert (tmp_path / "cost_curves.png").read_bytes()[:4] == b"\x89PNG"
