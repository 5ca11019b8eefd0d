"""Read a results root: every run directory as the runner writes it, into rows and DataFrames.

A run directory holds ``run_config.json`` (settings) and ``answers.jsonl``, plus
``baseline_answers.jsonl`` (AR interleaved) and ``summary.json`` once finished. With
``baseline=reuse`` / ``shared`` the AR answers live in the ``ar-...`` directory named by the
summary's ``baseline_dir`` (or the sibling ``ar-<same suffix>``). Numbers are recomputed from the
answers, so a run still in progress (no summary yet) shows what it has.

Repeated runs: ``repeat=N`` (N > 0) writes ``<method>-t<T>-m<M>-rN``; runs with the same settings
and method are averaged by specbench.report.tables.aggregate whatever their directory names.
"""

from __future__ import annotations

import csv
import json
from dataclasses import dataclass, field
from pathlib import Path

from specbench.inputs.questions import SUBTASKS
from specbench.report import tables
from specbench.run import metrics
from specbench.run.lossless import tally
from specbench.run.results_io import jsonl_exists, read_jsonl


@dataclass
class Run:
    path: Path
    config: dict
    identity: dict
    summary: dict | None
    records: list[dict]
    baseline: list[dict] = field(default_factory=list)

    @property
    def method(self) -> str:
        return (self.summary or {}).get("method") or self.config["method"]["name"]

    @property
    def run_id(self) -> str:
        return str(self.path)


def _dedup(records: list[dict]) -> list[dict]:
    """One record per question (the first), in file order."""
    seen, out = set(), []
    for r in records:
        if r["question_id"] not in seen:
            seen.add(r["question_id"])
            out.append(r)
    return out


def find_run_dirs(root: str | Path) -> list[Path]:
    root = Path(root)
    if (root / "run_config.json").is_file():
        return [root]
    return sorted(p.parent for p in root.rglob("run_config.json") if "wandb" not in p.parts)


def _baseline_dir(path: Path, method: str, summary: dict | None) -> Path | None:
    if summary and summary.get("baseline_dir"):
        d = Path(summary["baseline_dir"])
        if jsonl_exists(d / "answers.jsonl"):
            return d
    if path.name.startswith(method + "-"):  # the sibling ar-... directory (no method variant)
        d = path.parent / ("ar" + path.name[len(method):].split("~")[0])
        if jsonl_exists(d / "answers.jsonl"):
            return d
    return None


def load_run(path: str | Path) -> Run:
    path = Path(path)
    rc = json.loads((path / "run_config.json").read_text())
    summary = json.loads((path / "summary.json").read_text()) if (path / "summary.json").is_file() else None
    run = Run(path, rc.get("config", {}), rc.get("identity", {}), summary,
              _dedup(read_jsonl(path / "answers.jsonl")))
    method = run.method
    if method == "ar":
        run.baseline = run.records
    elif jsonl_exists(path / "baseline_answers.jsonl"):
        run.baseline = _dedup(read_jsonl(path / "baseline_answers.jsonl"))
    else:
        base = _baseline_dir(path, method, summary)
        run.baseline = _dedup(read_jsonl(base / "answers.jsonl")) if base else []
    return run


def load_runs(root: str | Path) -> list[Run]:
    return [load_run(p) for p in find_run_dirs(root)]


def run_meta(run: Run) -> dict:
    ident, saved, s = run.identity, run.config, run.summary or {}  # as the run wrote them
    task = ident.get("task") or saved.get("task", {}).get("name")
    if ident.get("per_subtask"):
        task = f"{task}-ps{ident['per_subtask']}"
    if ident.get("prefix_cache"):  # turns on a kept cache: another protocol, never averaged with whole prefills
        task = f"{task}-pc"
    checks = [r["lossless"] for r in run.records if r.get("lossless", {}).get("status", "unchecked") != "unchecked"]
    lossless = tally(checks)
    return {
        "model": ident.get("model"), "task": task, "temperature": ident.get("temperature"),
        "top_k": ident.get("top_k", 0), "top_p": ident.get("top_p", 1.0),
        "max_new_tokens": ident.get("max_new_tokens"), "dtype": ident.get("dtype"),
        "device": ident.get("device"), "device_name": s.get("device") or saved.get("device_name"),
        "method": run.method,
        "method_params": s.get("method_params", {k: v for k, v in saved.get("method", {}).items() if k != "name"}),
        "repeat": saved.get("repeat", 0) or 0, "baseline_mode": saved.get("baseline"),
        "warmup_on": ident.get("warmup_on") or saved.get("warmup_on") or "builtin",
        "finished": s.get("finished"), "path": str(run.path), "lossless": lossless,
        "speedup_bound": s.get("speedup_bound"),
    }


def run_rows(runs: list[Run]) -> list[dict]:
    return [tables.run_row(run_meta(r), r.records, r.baseline) for r in runs if r.records]


RESULTS_CSV_FIELDS = ["path", *tables.TABLE_KEYS, "device_name", "method", "method_params", "warmup_on", "repeat",
                      "baseline_mode", "questions", *tables.SPEEDUP_KEYS, "speedup_ci_lo", "speedup_ci_hi",
                      "mat", "accept_rate", "tokens_per_s",
                      "decode_tokens_per_s", "decode_speedup", "baseline_tokens_per_s",
                      "lossless_checked", "lossless_exact", "lossless_numeric_ties", "lossless_mismatches",
                      "lossless_lossy_differences", "lossless_tokens_checked", "lossless_tokens_equal",
                      "lossless_tokens_numeric", "lossless_tokens_outside_band", "lossless_questions_outside_band",
                      "speedup_bound", "finished"]


def results_csv_fields(rows: list[dict]) -> list[str]:
    """RESULTS_CSV_FIELDS, with a speedup column per subtask that is not Spec-Bench's (task=long's
    buckets: speedup_1k, ...) before the overall one."""
    extra = [tables.subtask_field(s) for s in metrics.ordered_subtasks(s for r in rows for s in r.get("subtasks", []))
             if s not in SUBTASKS]
    at = RESULTS_CSV_FIELDS.index("overall")
    return [*RESULTS_CSV_FIELDS[:at], *extra, *RESULTS_CSV_FIELDS[at:]]


def results_csv_rows(rows: list[dict]) -> list[dict]:
    out = []
    for r in rows:
        rec = {k: r.get(k) for k in RESULTS_CSV_FIELDS}
        rec.update({tables.subtask_field(s): v for s, v in (r.get("subtask_speedup") or {}).items()
                    if s not in SUBTASKS})
        rec["method_params"] = tables.params_key(r.get("method_params"))
        for k, v in (r.get("lossless") or {}).items():
            rec[f"lossless_{k}"] = v
        out.append(rec)
    return out


def write_results_csv(root: str | Path, path: str | Path | None = None) -> Path:
    """The sweep-level table: one line per run directory under root (default root/results.csv)."""
    root = Path(root)
    path = Path(path) if path else root / "results.csv"
    runs = run_rows(load_runs(root))
    rows = results_csv_rows(runs)
    tmp = path.with_suffix(path.suffix + ".tmp")
    with tmp.open("w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=results_csv_fields(runs))
        w.writeheader()
        for rec in rows:
            w.writerow({k: ("" if v is None else v) for k, v in rec.items()})
    tmp.replace(path)
    return path


def load_published(directory: str | Path) -> list[dict]:
    """Every published CSV in a directory (results/published/), labelled by its source."""
    out = []
    for p in sorted(Path(directory).glob("*.csv")):
        out += tables.parse_published(p.read_text(), tables.PUBLISHED_LABELS.get(p.stem, p.stem))
    return out


# ---- pandas views (notebook, plots) ----

def frames(runs: list[Run]) -> dict:
    """DataFrames: 'runs' (one row per run), 'questions' (per question of each run, in run order,
    with the AR reference speed), 'accepts' (every decoding step's accepted length), 'depths' (per
    run and draft depth: marginal and conditional acceptance, metrics.acceptance_by_depth, where the
    answers record step_drafted), 'nodes' (per run and draft-tree template node, where the drafter
    records them (TR): depth, rank, parent, times drafted and times on the accepted path)."""
    import pandas as pd

    from specbench.draft import DraftTree

    rows = run_rows(runs)
    by_path = {r["path"]: r for r in rows}
    q_rows, a_rows, d_rows, n_rows = [], [], [], []
    for run in runs:
        if str(run.path) not in by_path:
            continue
        meta = {k: by_path[str(run.path)][k] for k in (*tables.TABLE_KEYS, "method", "repeat", "path")}
        meta["method_params"] = tables.params_key(by_path[str(run.path)].get("method_params"))
        stats = metrics.sum_statistics([r.get("drafter_stats") for r in run.records])
        if stats and "node_hits" in stats:
            tree = DraftTree.from_children_counts(stats["tree"])
            depths, ranks = tree.depths.tolist(), tree.sibling_rank()
            for v, (par, h, d) in enumerate(zip(tree.parents, stats["node_hits"], stats["node_drafted"]), start=1):
                n_rows.append(dict(meta, node=v, parent=par, depth=depths[v], rank=ranks[v - 1], hits=h,
                                   drafted=d, steps=stats["steps"], root_row_unwritten=stats["root_row_unwritten"],
                                   root_rank0_hits=stats["root_rank0_hits"]))
        by_depth = metrics.acceptance_by_depth(run.records) or {"marginal": [], "conditional": []}
        for d, (marg, cond) in enumerate(zip(by_depth["marginal"], by_depth["conditional"]), start=1):
            d_rows.append(dict(meta, depth=d, marginal=marg, conditional=cond, steps=by_depth["steps"]))
        base = {b["question_id"]: b for b in run.baseline}
        for i, r in enumerate(run.records):
            speed = metrics.question_speed(r)
            b = base.get(r["question_id"])
            bspeed = metrics.question_speed(b) if b else None
            acc = [a for t in r["turns"] for a in t["accept_lengths"]]
            q_rows.append(dict(meta, index=i, question_id=r["question_id"], subtask=r["subtask"],
                               speed=speed, baseline_speed=bspeed,
                               speedup=speed / bspeed if bspeed else None,
                               new_tokens=sum(t["new_tokens"] for t in r["turns"]),
                               wall_time=sum(t["wall_time"] for t in r["turns"]),
                               steps=len(acc), mat=sum(acc) / len(acc) if acc else None,
                               lossless=r.get("lossless", {}).get("status")))
            for a in acc:
                a_rows.append(dict(meta, question_id=r["question_id"], accept_length=a))
    runs_df = pd.DataFrame(rows)
    if len(runs_df):
        runs_df["method_params"] = runs_df["method_params"].map(tables.params_key)
    return {"runs": runs_df, "questions": pd.DataFrame(q_rows), "accepts": pd.DataFrame(a_rows),
            "depths": pd.DataFrame(d_rows), "nodes": pd.DataFrame(n_rows)}
