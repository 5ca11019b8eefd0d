"""Plots of a results root (matplotlib): each function takes the DataFrames of
specbench.report.collect.frames and returns a Figure; ``save_all`` writes PNG and PDF.

- speedup per subtask per method (grouped bars, error bars = std over repeated runs);
- MAT per method;
- distribution of accepted lengths per method (share of decoding steps);
- acceptance by draft depth per method: marginal P(depth d accepted) and conditional
  P(d accepted | d-1 accepted), over the steps that drafted;
- tokens/s over the run (each question's speed in run order; AR reference dotted);
- overall speedup against temperature, per method;
- speedup against input length, per method, where the subtasks are input-length buckets (task=long):
  each bucket at its measured mean input tokens;
- per-node acceptance of a draft-tree template (TR): the tree, each node coloured by how often it
  was on the accepted path when drafted, beside acceptance per depth and the matrix statistics;
- cost curves side by side: t(w) / t(1) against the rows a forward verifies, one line per curve file
  (model, device, dtype, forward), t(1) in the legend;
- overall speedup per task, a panel per temperature (the leading methods of report/task_table.py).
"""

from __future__ import annotations

import hashlib
import json
import re
from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # files only; the notebook shows the returned figures itself
import matplotlib.pyplot as plt  # noqa: E402
from matplotlib.ticker import MaxNLocator  # noqa: E402
import numpy as np  # noqa: E402

from specbench.inputs.questions import SUBTASKS  # noqa: E402
from specbench.report import tables, timing_marks  # noqa: E402
from specbench.run import metrics  # noqa: E402

SUBTASK_HEADERS = dict(tables.COLUMNS)


def _labels(df):
    """Method labels: the name, with the parameters that differ only where one method has several
    variants (as the tables name them: 'tr_fused (retrieval=suffix)')."""
    variants = df.groupby("method")["method_params"].unique()

    def label(r):
        options = [json.loads(p or "{}") for p in variants[r["method"]]]
        if len(options) == 1:
            return r["method"]
        mine = json.loads(r["method_params"] or "{}")
        differing = [k for k in sorted(mine) if len({json.dumps(o.get(k)) for o in options}) > 1]
        return f"{r['method']} (" + ", ".join(f"{k}={mine[k]}" for k in differing) + ")"

    labels = df.apply(label, axis=1)
    if "timing_flags" not in df.columns:  # the per-question and per-step frames carry no flags
        return labels
    flagged = set(labels[df["timing_flags"].map(bool)])  # a variant with one flagged run is marked as a whole
    return labels.map(lambda lab: timing_marks.marked(lab, lab in flagged))


def _timing_note(fig, df) -> None:
    """The marked labels' footnote under a speedup plot (run/contention.py, report/timing_marks.py)."""
    if "timing_flags" in df.columns and df["timing_flags"].map(bool).any():
        fig.text(0.01, 0.005, f"{timing_marks.MARK} not timed alone on one environment, or at another machine speed than its AR: see the tables' footnote",
                 fontsize=7, color="firebrick")


def _order(methods) -> list:
    return sorted(set(methods), key=lambda m: (tables._method_rank(m.split(" ")[0]), m))


def _groups(df, keys=tables.TABLE_KEYS):
    keys = [k for k in keys if k in df.columns]
    if not len(df):
        return []
    return list(df.groupby([df[k].astype(str) for k in keys], sort=True))


def slug(row, temperature: bool = True) -> str:
    """File-name tag of a setting: smollm2-135m_mini_t0_m128_float32_cpu."""
    parts = [row["model"], row["task"]]
    if temperature:
        parts.append(f"t{float(row['temperature']):g}")
    if row.get("top_k"):
        parts.append(f"k{row['top_k']}")
    if row.get("top_p") not in (None, 1, 1.0):
        parts.append(f"p{float(row['top_p']):g}")
    parts += [f"m{row['max_new_tokens']}", row["dtype"], row["device"]]
    return re.sub(r"[^A-Za-z0-9._\-]+", "-", "_".join(str(p) for p in parts))


def _title(sub) -> str:
    r = sub.iloc[0]
    return f"{r['model']} · {r['task']} · T={float(r['temperature']):g} · {r['max_new_tokens']} tok · {r['device']}"


def subtask_speedups(runs):
    """(subtasks in their order, a frame of each run's speedup per subtask and 'overall', indexed as
    `runs`), whatever the subtasks are called (tables.subtask_value)."""
    import pandas as pd

    rows = runs.to_dict("records")
    subs = metrics.ordered_subtasks(s for r in rows for s in _row_subtasks(r))
    values = pd.DataFrame([{**{s: tables.subtask_value(r, s) for s in subs}, "overall": r.get("overall")}
                           for r in rows], index=runs.index, columns=[*subs, "overall"], dtype=float)
    return subs, values


def _row_subtasks(row: dict) -> list[str]:
    subs = row.get("subtasks")
    return list(subs) if isinstance(subs, (list, tuple)) else tables.row_subtasks({})


def speedup_subtasks(runs, title: str | None = None):
    """Grouped bars: one group per subtask (and Overall), one bar per method; AR = 1 (line)."""
    df = runs[runs["method"] != "ar"].copy()
    fig, ax = plt.subplots(figsize=(9, 4))
    ax.axhline(1.0, color="grey", lw=1, ls="--", label="AR")
    if len(df):
        df["label"] = _labels(df)
        subs, values = subtask_speedups(df)
        cols = [k for k in [*subs, "overall"] if values[k].notna().any()]
        methods = _order(df["label"])
        width = 0.8 / max(len(methods), 1)
        x = np.arange(len(cols))
        for i, m in enumerate(methods):
            sel = values[df["label"] == m]
            means = [sel[c].mean() for c in cols]
            stds = [sel[c].std() if len(sel) > 1 else 0.0 for c in cols]
            ax.bar(x + (i - (len(methods) - 1) / 2) * width, means, width,
                   yerr=stds if len(sel) > 1 else None, capsize=2, label=m)
        ax.set_xticks(x, [SUBTASK_HEADERS.get(c, c) for c in cols])
    ax.set_ylabel("speedup over AR")
    ax.set_title(title or "Speedup per subtask")
    ax.legend(fontsize=8, ncol=2)
    fig.tight_layout()
    _timing_note(fig, df)
    return fig


def mat_bars(runs, title: str | None = None):
    df = runs.copy()
    fig, ax = plt.subplots(figsize=(6, 3.5))
    if len(df):
        df["label"] = _labels(df)
        methods = _order(df["label"])
        g = df.groupby("label")["mat"]
        means, stds = g.mean().reindex(methods), g.std().reindex(methods).fillna(0)
        bars = ax.bar(methods, means, yerr=stds, capsize=3, color="tab:blue")
        ax.bar_label(bars, fmt="%.2f", fontsize=8)
    ax.set_ylabel("mean accepted tokens per step")
    ax.set_title(title or "MAT per method")
    fig.tight_layout()
    return fig


def accept_lengths(accepts, title: str | None = None):
    """Share of decoding steps accepting L tokens (L = accepted drafts + 1), per method."""
    fig, ax = plt.subplots(figsize=(8, 3.5))
    if len(accepts):
        df = accepts.copy()
        df["label"] = _labels(df)
        methods = _order(df["label"])
        lmax = int(df["accept_length"].max())
        lengths = np.arange(1, lmax + 1)
        width = 0.8 / max(len(methods), 1)
        for i, m in enumerate(methods):
            counts = df[df["label"] == m]["accept_length"].value_counts(normalize=True)
            ax.bar(lengths + (i - (len(methods) - 1) / 2) * width,
                   [counts.get(L, 0.0) for L in lengths], width, label=m)
        ax.set_xticks(lengths)
    ax.set_xlabel("accepted length per step")
    ax.set_ylabel("share of steps")
    ax.set_title(title or "Accepted lengths")
    ax.legend(fontsize=8)
    fig.tight_layout()
    return fig


def acceptance_by_depth(depths, title: str | None = None):
    """Per method, over the steps that drafted: left, P(depth d accepted); right, P(d accepted | d-1
    accepted) (metrics.acceptance_by_depth), each the mean over repeated runs."""
    fig, (ax, ax2) = plt.subplots(1, 2, figsize=(9, 3.5), sharex=True, sharey=True)
    if len(depths):
        df = depths.copy()
        df["label"] = _labels(df)
        for i, m in enumerate(_order(df["label"])):
            g = df[df["label"] == m].groupby("depth")[["marginal", "conditional"]].mean()
            ax.plot(g.index, g["marginal"], color=f"C{i}", marker="o", label=m)
            ax2.plot(g.index, g["conditional"], color=f"C{i}", marker="o", ls="--", label=m)
        ax.xaxis.set_major_locator(MaxNLocator(nbins=12, integer=True))  # depths run to 40 (SAM-Decoding)
    ax.set_ylim(0, 1.02)
    ax.set_xlabel("draft depth d")
    ax2.set_xlabel("draft depth d")
    ax.set_ylabel("share of drafted steps")
    ax.set_title("P(depth d accepted)", fontsize=9)
    ax2.set_title("P(d accepted | d-1 accepted)", fontsize=9)
    ax.legend(fontsize=8)
    fig.suptitle(title or "Acceptance by depth", fontsize=10)
    fig.tight_layout()
    return fig


def tokens_over_run(questions, title: str | None = None):
    """Each question's tokens/s in the order the run made them; its AR reference dotted."""
    fig, ax = plt.subplots(figsize=(8, 3.5))
    if len(questions):
        df = questions.copy()
        df["label"] = _labels(df)
        for i, m in enumerate(_order(df["label"])):
            color = f"C{i}"
            for j, (_, sel) in enumerate(df[df["label"] == m].groupby("path")):
                sel = sel.sort_values("index")
                ax.plot(sel["index"], sel["speed"], color=color, marker=".", label=m if j == 0 else None)
                if not m.startswith("ar") and sel["baseline_speed"].notna().any():
                    ax.plot(sel["index"], sel["baseline_speed"], color=color, ls=":", lw=1,
                            label=f"AR beside {m}" if j == 0 else None)
    ax.set_xlabel("question (run order)")
    ax.set_ylabel("tokens/s")
    ax.set_title(title or "tokens/s over the run")
    ax.legend(fontsize=8, ncol=2)
    fig.tight_layout()
    return fig


def speedup_vs_temperature(runs, title: str | None = None):
    fig, ax = plt.subplots(figsize=(6, 3.5))
    df = runs[runs["method"] != "ar"].copy()
    if len(df):
        df["label"] = _labels(df)
        for m in _order(df["label"]):
            g = df[df["label"] == m].groupby("temperature")["overall"]
            mean, std = g.mean(), g.std().fillna(0)
            ax.errorbar(mean.index, mean.values, yerr=std.values, marker="o", capsize=3, label=m)
    ax.axhline(1.0, color="grey", lw=1, ls="--")
    ax.set_xlabel("temperature")
    ax.set_ylabel("overall speedup over AR")
    ax.set_title(title or "Speedup against temperature")
    ax.legend(fontsize=8)
    fig.tight_layout()
    _timing_note(fig, df)
    return fig


def speedup_by_task(by_label: dict, cols: list[tuple[float, str]], labels: list[str], title: str | None = None):
    """Grouped bars: each task's overall speedup per method, a panel per temperature; error bars = std over
    repeated runs. `by_label`: task_table.cells; `cols`: (temperature, task) pairs; `labels`: the methods."""
    temps = sorted({t for t, _ in cols})
    per_panel = [sum(1 for t, _ in cols if t == temp) for temp in temps]  # a panel as wide as its tasks
    fig, axes = plt.subplots(1, len(temps), figsize=(1.6 * len(cols) + 3, 3.9), squeeze=False, sharey=True,
                             gridspec_kw={"width_ratios": per_panel})
    width = 0.8 / max(len(labels), 1)
    for ax, temp in zip(axes[0], temps):
        tasks = [task for t, task in cols if t == temp]
        x = np.arange(len(tasks))
        for i, lab in enumerate(labels):
            rows = [by_label[lab].get((temp, task)) or {} for task in tasks]
            mean = [r.get("overall") or 0.0 for r in rows]
            std = [r.get("overall_std") or 0.0 for r in rows]
            ax.bar(x + (i - (len(labels) - 1) / 2) * width, mean, width, yerr=std, capsize=2, label=lab)
        ax.axhline(1.0, color="grey", lw=1, ls="--")
        ax.set_xticks(x, tasks, rotation=20, ha="right")
        ax.set_title(f"T = {temp:g}")
    axes[0][0].set_ylabel("overall speedup over AR")
    axes[0][-1].legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.0, 1.0))
    if title:
        fig.suptitle(title)
    fig.tight_layout()
    return fig


def are_length_buckets(runs) -> bool:
    """Whether these runs' subtasks are input-length buckets: not Spec-Bench's, and every run's
    answers record the input tokens of every subtask (run_row's subtask_input_tokens)."""
    rows = runs.to_dict("records")
    if not rows or "subtask_input_tokens" not in runs:
        return False
    subs = {s for r in rows for s in _row_subtasks(r)}
    measured = all(isinstance(r["subtask_input_tokens"], dict) and r["subtask_input_tokens"]
                   and None not in r["subtask_input_tokens"].values() for r in rows)
    return measured and not subs <= set(SUBTASKS)


def speedup_vs_input_length(runs, title: str | None = None):
    """One line per method: the speedup on each input-length bucket at the bucket's measured mean
    input tokens (prompt and chat template; the mean over the method's runs), error bars = std over
    repeated runs; each bucket named on the x axis."""
    df = runs[runs["method"] != "ar"].copy()
    fig, ax = plt.subplots(figsize=(7, 3.8))
    ax.axhline(1.0, color="grey", lw=1, ls="--", label="AR")
    if len(df):
        df["label"] = _labels(df)
        subs, values = subtask_speedups(df)
        tokens = {s: np.mean([r["subtask_input_tokens"][s] for r in df.to_dict("records")
                              if s in r["subtask_input_tokens"]]) for s in subs}
        for i, m in enumerate(_order(df["label"])):
            sel = values[df["label"] == m]
            mine = [r["subtask_input_tokens"] for r in df[df["label"] == m].to_dict("records")]
            xs = [np.mean([t[s] for t in mine if s in t]) for s in subs if sel[s].notna().any()]
            ys = [sel[s].mean() for s in subs if sel[s].notna().any()]
            err = [sel[s].std() if len(sel) > 1 else 0.0 for s in subs if sel[s].notna().any()]
            # past the colour cycle's ten, a dashed line and another marker: every method told apart
            ax.errorbar(xs, ys, yerr=err if len(sel) > 1 else None, marker="os"[i // 10 % 2], capsize=3, label=m,
                        ls="-" if i < 10 else "--", color=f"C{i % 10}")
        ax.set_xticks([tokens[s] for s in subs], [f"{s}\n{tokens[s]:.0f}" for s in subs], fontsize=8)
    ax.set_xlabel("mean input tokens of the bucket")
    ax.set_ylabel("speedup over AR")
    ax.set_title(title or "Speedup against input length")
    ax.legend(fontsize=7, ncol=2)
    fig.tight_layout()
    _timing_note(fig, df)
    return fig


def node_acceptance(nodes, title: str | None = None):
    """One template's per-node acceptance (repeats summed): the tree, root at the top, each node
    coloured by hits / drafted; right, the share of steps accepting at each depth."""
    g = nodes.groupby("node").agg(parent=("parent", "first"), depth=("depth", "first"), hits=("hits", "sum"),
                                  drafted=("drafted", "sum")).sort_index()
    runs = nodes.drop_duplicates("path")
    steps = int(runs["steps"].sum())
    unwritten, rank0 = runs["root_row_unwritten"].sum() / max(steps, 1), runs["root_rank0_hits"].sum() / max(steps, 1)
    rate = (g["hits"] / g["drafted"].where(g["drafted"] > 0)).fillna(0.0)
    fig, (ax, ax2) = plt.subplots(1, 2, figsize=(11, 4.2), gridspec_kw={"width_ratios": [3, 1]})
    pos = {0: (0.0, 0.0)}
    for d, level in g.groupby("depth"):
        for i, v in enumerate(level.index):
            pos[v] = (i - (len(level) - 1) / 2, -float(d))
    for v, par in g["parent"].items():
        (x0, y0), (x1, y1) = pos[par], pos[v]
        ax.plot([x0, x1], [y0, y1], color="lightgrey", lw=0.8, zorder=1)
    xs, ys = zip(*(pos[v] for v in g.index))
    sc = ax.scatter(xs, ys, c=rate.values, cmap="viridis", vmin=0, vmax=max(float(rate.max()), 1e-9),
                    s=90, edgecolors="black", linewidths=0.3, zorder=2)
    ax.scatter([0], [0], c="black", s=90, zorder=2)
    for v in g.index:
        if rate[v] >= 0.005:
            ax.annotate(f"{100 * rate[v]:.0f}", pos[v], fontsize=5, ha="center", va="center",
                        color="white" if rate[v] < 0.6 * rate.max() else "black", zorder=3)
    fig.colorbar(sc, ax=ax, fraction=0.03, pad=0.01, label="accepted when drafted")
    ax.set_yticks([-d for d in range(int(g["depth"].max()) + 1)], [str(d) for d in range(int(g["depth"].max()) + 1)])
    ax.set_ylabel("depth")
    ax.set_xticks([])
    ax.set_title(title or "Per-node acceptance", fontsize=9)
    per_depth = g.groupby("depth")["hits"].sum() / max(steps, 1)
    ax2.barh(-per_depth.index.values, per_depth.values, color="tab:green")
    ax2.set_yticks(-per_depth.index.values, [str(d) for d in per_depth.index])
    ax2.set_xlabel("share of steps accepting a node at depth")
    ax2.set_title(f"{steps} steps; root row never written {100 * unwritten:.0f}%;\n"
                  f"root row's rank 0 = target's token {100 * rank0:.0f}%", fontsize=8)
    fig.tight_layout()
    return fig


def cost_curves(curves: list[dict], title: str | None = None):
    """t(w) / t(1) against rows w, one line per cost curve (the dicts of cost_curve.json files): how
    much a wide verification costs relative to one plain step on each machine and shape."""
    fig, ax = plt.subplots(figsize=(7, 3.8))
    for i, c in enumerate(curves):
        times = {int(w): t for w, t in c["times_ms"].items()}
        ws = sorted(times)
        label = (f"{c['model']}, {c['device']}, {c['dtype']}, {c.get('forward', 'eager')}: "
                 f"t(1) = {times[1]:.1f} ms")
        ax.plot(ws, [times[w] / times[1] for w in ws], marker=".", label=label, color=f"C{i % 10}",
                ls="-" if i < 10 else "--")
    ax.axhline(1.0, color="grey", lw=1, ls=":")
    ax.set_xlabel("rows verified in one forward (w)")
    ax.set_ylabel("t(w) / t(1)")
    ax.set_yscale("log")
    ax.set_title(title or "Cost of a forward against its rows")
    ax.legend(fontsize=6.5, loc="upper left")
    fig.tight_layout()
    return fig


def save(fig, out_dir: Path, name: str, formats=("png", "pdf")) -> Path:
    out_dir.mkdir(parents=True, exist_ok=True)
    for fmt in formats:
        fig.savefig(out_dir / f"{name}.{fmt}", dpi=150 if fmt == "png" else None)
    plt.close(fig)
    return out_dir / f"{name}.{formats[0]}"


def save_all(fr: dict, out_dir: str | Path, formats=("png", "pdf")) -> dict:
    """Every plot for every setting (model/task/temperature/...), named <plot>__<setting>."""
    out_dir = Path(out_dir)
    written = {}
    runs, qs, acc = fr["runs"], fr["questions"], fr["accepts"]
    for key, sub in _groups(runs):
        s, t = slug(sub.iloc[0]), _title(sub)
        paths = sub["path"].tolist()
        written[f"speedup_subtasks__{s}"] = save(speedup_subtasks(sub, f"Speedup per subtask\n{t}"), out_dir,
                                                 f"speedup_subtasks__{s}", formats)
        written[f"mat__{s}"] = save(mat_bars(sub, f"MAT\n{t}"), out_dir, f"mat__{s}", formats)
        if are_length_buckets(sub):
            written[f"speedup_vs_input_length__{s}"] = save(
                speedup_vs_input_length(sub, f"Speedup against input length\n{t}"), out_dir,
                f"speedup_vs_input_length__{s}", formats)
        if len(acc):
            written[f"accept_lengths__{s}"] = save(accept_lengths(acc[acc["path"].isin(paths)], f"Accepted lengths\n{t}"),
                                                   out_dir, f"accept_lengths__{s}", formats)
        depths = fr.get("depths")  # older frames (and answers without step_drafted) have none
        if depths is not None and len(depths) and depths["path"].isin(paths).any():
            written[f"acceptance_depth__{s}"] = save(
                acceptance_by_depth(depths[depths["path"].isin(paths)], f"Acceptance by depth\n{t}"),
                out_dir, f"acceptance_depth__{s}", formats)
        if len(qs):
            written[f"tokens_over_run__{s}"] = save(tokens_over_run(qs[qs["path"].isin(paths)], f"tokens/s over the run\n{t}"),
                                                    out_dir, f"tokens_over_run__{s}", formats)
    nodes = fr.get("nodes")
    if nodes is not None and len(nodes):
        for key, sub in _groups(nodes, (*tables.TABLE_KEYS, "method", "method_params")):
            r = sub.iloc[0]
            settings = tables.variant_label(r["method"], json.loads(r["method_params"]))
            variant = "" if settings == "defaults" else "_" + hashlib.blake2b(
                r["method_params"].encode(), digest_size=3).hexdigest()
            name = f"node_acceptance__{r['method']}{variant}__{slug(r)}"
            label = r["method"] + ("" if not variant else f" ({settings})")
            written[name] = save(node_acceptance(sub, f"{label}\n{_title(sub)}"), out_dir, name, formats)
    no_temp = [k for k in tables.TABLE_KEYS if k != "temperature"]
    for key, sub in _groups(runs, no_temp):
        s = slug(sub.iloc[0], temperature=False)
        written[f"speedup_vs_temperature__{s}"] = save(speedup_vs_temperature(sub), out_dir,
                                                       f"speedup_vs_temperature__{s}", formats)
    return written


def run_plots(fr: dict, out_dir: str | Path, formats=("png",)) -> dict:
    """The plots that make sense for one run (wandb): subtask speedups, accepted lengths, tokens/s."""
    out_dir = Path(out_dir)
    out = {}
    if len(fr["runs"]):
        out["speedup_subtasks"] = save(speedup_subtasks(fr["runs"]), out_dir, "speedup_subtasks", formats)
        if are_length_buckets(fr["runs"]):
            out["speedup_vs_input_length"] = save(speedup_vs_input_length(fr["runs"]), out_dir,
                                                  "speedup_vs_input_length", formats)
    if len(fr["accepts"]):
        out["accept_lengths"] = save(accept_lengths(fr["accepts"]), out_dir, "accept_lengths", formats)
    if len(fr["questions"]):
        out["tokens_over_run"] = save(tokens_over_run(fr["questions"]), out_dir, "tokens_over_run", formats)
    return out
