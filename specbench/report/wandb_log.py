"""Weights & Biases logging of a finished run: config, per-question metrics, summary, plots.

Settings under ``wandb:`` in conf/config.yaml. Offline by default: no account, no network; the
run is written under ``<results_dir>/wandb/offline-run-*`` and can be uploaded later with
``wandb sync <that dir>``. ``wandb.mode=online`` logs live (after ``wandb login``);
``wandb.enabled=false`` (or the environment variable ``WANDB_MODE=disabled``) turns it off.
wandb comes with the default install and logs offline; without it (a trimmed environment, an offline
node) the run goes on and prints one `warning:` line.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

from specbench.run import metrics

_NOTICE_SHOWN = False


def _flatten(d: dict, prefix: str = "") -> dict:
    out = {}
    for k, v in d.items():
        key = f"{prefix}{k}"
        if isinstance(v, dict):
            out.update(_flatten(v, key + "/"))
        elif isinstance(v, (int, float, str, bool)) or v is None:
            out[key] = v
    return out


def question_metrics(records: list[dict], baseline: list[dict]) -> list[dict]:
    """Per-question numbers logged as one wandb step each (and as a table)."""
    base = {b["question_id"]: b for b in baseline}
    rows = []
    for r in records:
        acc = [a for t in r["turns"] for a in t["accept_lengths"]]
        b = base.get(r["question_id"])
        speed = metrics.question_speed(r)
        bspeed = metrics.question_speed(b) if b else None
        rows.append({
            "question_id": str(r["question_id"]), "subtask": r["subtask"], "speed": speed,
            "baseline_speed": bspeed, "speedup": speed / bspeed if bspeed else None,
            "mat": sum(acc) / len(acc) if acc else None, "steps": len(acc),
            "new_tokens": sum(t["new_tokens"] for t in r["turns"]),
            "wall_time": sum(t["wall_time"] for t in r["turns"]),
            "lossless": (r.get("lossless") or {}).get("status", "unchecked"),
        })
    return rows


def log_run(cfg: dict, summary: dict, records: list[dict], baseline: list[dict], out_dir: Path):
    """Log one finished run; returns the wandb run directory, or None when disabled/unavailable."""
    global _NOTICE_SHOWN
    w = cfg["wandb"]
    if not w.get("enabled", True) or os.environ.get("WANDB_MODE") == "disabled" or w.get("mode") == "disabled":
        return None
    try:
        import wandb
    except ImportError:
        if not _NOTICE_SHOWN:
            print("warning: wandb is not installed; the run goes on without wandb logging "
                  "(pip install wandb, or wandb.enabled=false to silence this)", file=sys.stderr)
            _NOTICE_SHOWN = True
        return None
    os.environ.setdefault("WANDB_SILENT", "true")
    out_dir = Path(out_dir)
    mode = w.get("mode") or "offline"
    wdir = Path(w.get("dir") or out_dir)
    wdir.mkdir(parents=True, exist_ok=True)
    run = wandb.init(
        project=w.get("project") or "specbench", entity=w.get("entity"), mode=mode, dir=str(wdir),
        group=w.get("group") or f"{summary['model']}/{summary['task']}",
        name=out_dir.name, job_type=summary["method"], tags=list(w.get("tags") or []),
        config=_flatten({k: v for k, v in cfg.items() if k != "wandb"}),
        settings=wandb.Settings(console="off"),
    )
    try:
        qrows = question_metrics(records, baseline)
        for i, q in enumerate(qrows):
            run.log({f"question/{k}": v for k, v in q.items()
                     if v is not None and k not in ("question_id", "subtask", "lossless")}, step=i)
        if qrows:
            cols = list(qrows[0])
            run.log({"questions": wandb.Table(columns=cols, data=[[q[c] for c in cols] for q in qrows])})
        run.summary.update({k: v for k, v in _flatten(summary).items() if v is not None})
        if w.get("log_plots", True):
            for name, path in _plots(summary, records, baseline, out_dir).items():
                run.log({f"plots/{name}": wandb.Image(str(path))})
        run_dir = Path(run.dir).parent
    finally:
        run.finish()
    where = f"wandb sync {run_dir}" if mode == "offline" else run.url
    print(f"wandb: {mode} run logged ({where})")
    return run_dir


def _plots(summary: dict, records: list[dict], baseline: list[dict], out_dir: Path) -> dict:
    """This run's plots (PNG under <results_dir>/plots); none when matplotlib is missing."""
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        return {}
    from specbench.report import plots
    from specbench.report.collect import Run, frames

    run = Run(out_dir, {"method": {"name": summary["method"]}},
              {k: summary.get(k) for k in ("model", "task", "temperature", "top_k", "top_p",
                                            "max_new_tokens", "dtype")} | {"device": summary.get("device")},
              summary, records, baseline)
    return plots.run_plots(frames([run]), out_dir / "plots", formats=("png",))
