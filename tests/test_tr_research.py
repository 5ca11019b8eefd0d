"""The TR research kit: tree tuning math, the tune_tree script, per-node statistics through the
results layer (frames, plots) and the ablation table. No model: hand-made runs."""

import json
from pathlib import Path

import pytest

from specbench.draft import DraftTree
from specbench.drafting.recycling import PUBLISHED_TREE, load_tree_template
from specbench.methods.tr.base import TokenRecycling
from specbench.drafting.template_tuning import (best_prefix, children_counts_of, grow, probability_model, rank_paths, trim_template, tune_template)
from specbench.report import collect, plots, tables

ROOT = Path(__file__).resolve().parents[1]
# template [[2], [1, 0]]: node 1 = rank path (0,), node 2 = (1,), node 3 = (0, 0)
STATS = {"tree": [[2], [1, 0]], "steps": 100, "node_hits": [60, 10, 30], "node_drafted": [100, 100, 100],
         "depth_hits": [70, 30], "root_row_unwritten": 5, "root_rank0_hits": 60}


def test_published_tree_round_trips_through_rank_paths():
    tree = DraftTree.from_children_counts(PUBLISHED_TREE)
    paths = rank_paths(tree)
    assert len(paths) == 80 and paths[0] == (0,) and paths[8] == (0, 0)
    assert children_counts_of(paths) == PUBLISHED_TREE
    assert trim_template(PUBLISHED_TREE, 8) == PUBLISHED_TREE


@pytest.mark.parametrize("k", [2, 4])
def test_committed_trimmed_trees_are_the_published_tree_cut_at_rank_k(k):
    children = load_tree_template(str(ROOT / f"data/trees/published-k{k}.json"))
    assert children == trim_template(PUBLISHED_TREE, k)
    tree = DraftTree.from_children_counts(children)
    assert max(tree.sibling_rank()) == k - 1
    TokenRecycling(vocab_size=10, k=k, tree=children)  # fits a matrix of k candidates


def test_probabilities_calibrated_and_extrapolated():
    p = probability_model(STATS, k=8)
    assert p((0,)) == 0.6 and p((1,)) == 0.1 and p((0, 0)) == 0.3
    assert p((0, 0, 0)) == pytest.approx(0.3 * 0.5)  # deeper than calibrated: q(depth 2, rank 0) = 30/60
    assert p((0, 1)) == pytest.approx(0.6 * 0.1)  # rank 1 calibrated at depth 1 only
    assert p((0, 2)) == 0.0  # rank 2 never calibrated
    assert probability_model(STATS, k=1)((1,)) == 0.0  # rank >= k


def test_greedy_growth_and_the_best_prefix_under_a_cost_curve():
    order = grow(probability_model(STATS, k=8), max_nodes=5, k=8)
    assert [path for path, _ in order] == [(0,), (0, 0), (0, 0, 0), (1,), (0, 0, 0, 0)]
    # t(w) = 1 + 0.2 (w - 1): rates 1.33 (1 node), 1.357 (2 nodes), 1.28 (3 nodes)
    m, ratio = best_prefix(order, lambda w: 1 + 0.2 * (w - 1))
    assert m == 2 and ratio == pytest.approx(1.9 / 1.4)
    tuned = tune_template(STATS, lambda w: 1 + 0.2 * (w - 1), max_nodes=80)
    assert tuned["children"] == [[1], [1]] and tuned["nodes"] == 2 and tuned["depth"] == 2
    assert tune_template(STATS, lambda w: float(w), max_nodes=80)["nodes"] == 0  # nothing pays


def _write_run(path: Path, method_params: dict, overall: float = 1.0, stats: dict | None = STATS) -> Path:
    """A finished run directory by hand: two questions, AR interleaved, drafter statistics."""
    path.mkdir(parents=True)
    ident = dict(model="m", task="spec_bench", per_subtask=2, max_new_tokens=8, temperature=0.0, top_k=0,
                 top_p=1.0, dtype="float32", device="cpu", method="tr", method_params=method_params)
    (path / "run_config.json").write_text(json.dumps({"identity": ident, "config": {"method": {"name": "tr", **method_params}}}))
    recs, base = [], []
    for i, sub in enumerate(["qa", "rag"]):
        turn = dict(new_tokens=8, wall_time=1.0, prefill_time=0.1, accept_lengths=[2, 2, 2, 2],
                    step_rows=[4, 4, 4, 4], output="x", token_ids=[1] * 8)
        rec = dict(question_id=i, category=sub, subtask=sub, method="tr", turns=[turn],
                   lossless={"status": "exact"})
        if stats:
            rec["drafter_stats"] = stats
        recs.append(rec)
        base.append(dict(rec, turns=[dict(turn, wall_time=overall, accept_lengths=[1] * 8, step_rows=[1] * 8)],
                         method="ar"))
        base[-1].pop("drafter_stats", None)
    (path / "answers.jsonl").write_text("".join(json.dumps(r) + "\n" for r in recs))
    (path / "baseline_answers.jsonl").write_text("".join(json.dumps(r) + "\n" for r in base))
    curve = {"widths": [1, 2, 3, 4, 81], "times": [0.1, 0.11, 0.12, 0.13, 0.5], "device": "cpu", "dtype": "float32"}
    (path / "cost_curve.json").write_text(json.dumps(curve))
    return path


def test_tune_tree_script_writes_a_template_method_tree_reads(tmp_path, capsys):
    from scripts.tune_tree import main

    run = _write_run(tmp_path / "calib", {"k": 8, "tree": [[2], [1, 0]]})
    out = tmp_path / "tree.json"
    assert main([str(run), "--out", str(out)]) == 0
    tuned = json.loads(out.read_text())
    assert tuned["calibration"]["steps"] == 200 and tuned["overhead_ms"] >= 0
    assert "tuned template" in capsys.readouterr().out
    tr = TokenRecycling(vocab_size=10, k=8, tree=str(out))
    assert len(tr.tree) == tuned["nodes"] > 0
    with pytest.raises(SystemExit, match="no per-node statistics"):
        main([str(_write_run(tmp_path / "plain", {}, stats=None))])


def test_node_statistics_reach_frames_and_the_acceptance_plot(tmp_path):
    _write_run(tmp_path / "r" / "tr-t0-m8", {"k": 8, "tree": [[2], [1, 0]]})
    fr = collect.frames(collect.load_runs(tmp_path / "r"))
    nodes = fr["nodes"]
    assert list(nodes["node"]) == [1, 2, 3] and list(nodes["hits"]) == [120, 20, 60]  # two questions summed
    assert list(nodes["depth"]) == [1, 1, 2] and list(nodes["rank"]) == [0, 1, 0]
    written = plots.save_all(fr, tmp_path / "plots", ("png",))
    names = [n for n in written if n.startswith("node_acceptance__tr")]
    assert len(names) == 1 and (tmp_path / "plots" / f"{names[0]}.png").read_bytes()[:4] == b"\x89PNG"


def test_ablation_table_one_row_per_variant(tmp_path):
    _write_run(tmp_path / "r" / "a", {"k": 8, "update": "all_rows"}, overall=2.0)
    _write_run(tmp_path / "r" / "b", {"k": 8, "update": "accepted"}, overall=1.0)
    agg = tables.aggregate(collect.run_rows(collect.load_runs(tmp_path / "r")))
    (t,) = tables.ablation_tables(agg)
    assert [r["label"] for r in t["rows"]] == ["defaults", "update=accepted"]
    assert t["rows"][0]["overall"] == pytest.approx(2.0) and t["rows"][0]["rows_per_step"] == 4.0
    md = tables.ablation_markdown([t])
    assert ("| Setting | MAT | Speedup | Bound | Rows/step | Root row never written | Root rank 0 = target "
            "| Lossless |") in md
    assert "| defaults | 2.00 | 2.00x | - | 4.0 | 5% | 60% | 2/2 valid, 2 exact vs AR, 0 numeric |" in md  # STATS: 5 and 60 of 100 steps


def test_matrix_shares_pool_steps_over_questions():
    recs = [{"drafter_stats": dict(STATS)}, {"drafter_stats": dict(STATS, steps=300, root_row_unwritten=35,
                                                                     root_rank0_hits=40)}]
    shares = tables.matrix_shares(recs)
    assert shares["root_unwritten"] == pytest.approx(40 / 400) and shares["root_rank0"] == pytest.approx(100 / 400)
    assert tables.matrix_shares([{"drafter_stats": {"steps": 3}}, {}]) == {}  # other methods: no columns
