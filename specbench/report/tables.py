"""Spec-Bench leaderboard tables as small pure functions over run rows.

A *run row* is one results directory reduced to numbers (``run_row``): its settings (model, task,
temperature, ...), its method, and the leaderboard columns recomputed from its answers with
Spec-Bench's definitions (specbench.run.metrics). Rows of repeated runs (same settings and method,
``repeat=0,1,2`` -> directories ``...``, ``...-r1``, ``...-r2``) are averaged by ``aggregate``
into mean and sample standard deviation. ``build_tables`` lays the aggregated rows out one table
per model / task / temperature / length / dtype / device, with published figures beside ours where
the model matches; ``to_markdown``, ``to_latex`` and ``to_csv_rows`` render them.

A table's subtask columns are its runs' subtasks (metrics.ordered_subtasks): Spec-Bench's six in
the leaderboard's order, or another task's own, such as task=long's input-length buckets 1k .. 8k.
"""

from __future__ import annotations

import csv
import io
import json
import math
import re
from statistics import mean, stdev

from specbench.run import metrics
from specbench.run.lossless import verdict_line
from specbench.inputs.questions import SUBTASKS
from specbench.markdown import markdown_table
from specbench.report import timing_marks

# (key, header) in Spec-Bench's leaderboard order; subtask columns are speedups over AR. Acc. rate
# (accepted / drafted draft tokens) is ours; the overall speedup's 95% CI follows as a last column.
# Another task's subtasks take the place of the first six, headed by their own names.
SUBTASK_HEADERS = {"mt": "MT", "translation": "Translation", "summarization": "Summarization", "qa": "QA",
                   "math_reasoning": "Math", "rag": "RAG"}
METRIC_COLUMNS = [("mat", "MAT"), ("accept_rate", "Acc. rate"), ("tokens_per_s", "tokens/s"), ("overall", "Overall")]
COLUMNS = [*SUBTASK_HEADERS.items(), *METRIC_COLUMNS]
VALUE_KEYS = [k for k, _ in COLUMNS]
METRIC_KEYS = [k for k, _ in METRIC_COLUMNS]
HEADERS = [*[h for _, h in COLUMNS], "95% CI"]
SPEEDUP_KEYS = [*SUBTASKS, "overall"]
# Settings that make two runs comparable (one table); method + params on top make them repeats.
TABLE_KEYS = ("model", "task", "temperature", "top_k", "top_p", "max_new_tokens", "dtype", "device")
METHOD_ORDER = ("ar", "tr", "pld", "lookahead", "rest", "medusa")
# Published figures are greedy, fp16, A100: they go beside our greedy rows only.
PUBLISHED_LABELS = {"token_recycling_paper_table": "TR paper, A100",
                    "specbench_leaderboard_a100": "Spec-Bench board, A100"}


def run_row(meta: dict, records: list[dict], baseline: list[dict]) -> dict:
    """One run's leaderboard numbers, recomputed from its answers.

    meta: the run's settings (TABLE_KEYS, method, method_params, repeat, ...), copied into the row.
    records: the method's answer records; baseline: AR's answers on the same questions (for an AR
    run, its own records: every speedup is then 1). Speedup = mean(method speeds) / mean(AR
    speeds), overall over all questions and per subtask (metrics.speedup).
    """
    row = dict(meta)
    row["questions"] = len(records)
    row["mat"] = metrics.mat(records) if records else None
    row["rows_per_step"] = metrics.rows_per_step(records) if records else None
    row["tokens_per_s"] = metrics.tokens_per_s(records) if records else None
    row["accept_rate"] = metrics.drafted_acceptance_rate(records) if records else None
    row.update(matrix_shares(records))
    # decode-only needs prefill times, which runs imported from Spec-Bench answer files lack
    decode = all("prefill_time" in t for r in (*records, *baseline) for t in r["turns"])
    row["decode_tokens_per_s"] = metrics.tokens_per_s(records, decode_only=True) if records and decode else None
    sp = metrics.speedup(records, baseline) if records and baseline else {}
    for k in SPEEDUP_KEYS:
        row[k] = sp.get(k)
    # every subtask's speedup, Spec-Bench's or not, apart from the row's other keys (a subtask may be
    # named anything); the mean input tokens per subtask, None where the answers do not record them
    row["subtasks"] = metrics.subtasks(records)
    row["subtask_speedup"] = {s: sp.get(s) for s in row["subtasks"]}
    row["subtask_input_tokens"] = {s: metrics.input_tokens([r for r in records if r["subtask"] == s])
                                   for s in row["subtasks"]}
    dsp = metrics.speedup(records, baseline, decode_only=True) if records and baseline and decode else {}
    row["decode_speedup"] = dsp.get("overall")
    ids = {r["question_id"] for r in records}
    base = [b for b in baseline if b["question_id"] in ids]
    row["baseline_tokens_per_s"] = metrics.tokens_per_s(base) if base else None
    # per question (method speed, AR speed): what the overall speedup's interval resamples, kept so
    # that repeated runs' rows get one interval over all their runs (aggregate)
    row["question_speeds"] = metrics.question_speeds(records, baseline) if records and baseline else {}
    ci = metrics.repeated_speedup_ci([row["question_speeds"]])
    row["speedup_ci_lo"], row["speedup_ci_hi"] = ci or (None, None)
    row["timing_flags"] = timing_marks.timing_flags(records, baseline)
    return row


def matrix_shares(records: list[dict]) -> dict:
    """TR's matrix statistics over a run's steps (per-question `drafter_stats`): the share of steps
    whose root row was never written, and of steps whose root row's rank-0 entry was the target's
    token. Empty for methods that do not record them."""
    stats = [r["drafter_stats"] for r in records
             if isinstance(r.get("drafter_stats"), dict) and r["drafter_stats"].get("steps")
             and "root_row_unwritten" in r["drafter_stats"]]
    steps = sum(s["steps"] for s in stats)
    if not steps:
        return {}
    return {"root_unwritten": sum(s["root_row_unwritten"] for s in stats) / steps,
            "root_rank0": sum(s.get("root_rank0_hits", 0) for s in stats) / steps}


def row_subtasks(row: dict) -> list[str]:
    """A row's subtasks; Spec-Bench's six for a row that does not list them (published figures)."""
    return row["subtasks"] if "subtasks" in row else list(SUBTASKS)


def subtask_value(row: dict, sub: str, suffix: str = "") -> float | None:
    """A row's speedup on `sub` (its std with suffix='_std'), from `subtask_speedup<suffix>`, or for
    rows without it (published figures) Spec-Bench's own key."""
    by_sub = row.get(f"subtask_speedup{suffix}")
    if isinstance(by_sub, dict):
        return by_sub.get(sub)
    return row.get(f"{sub}{suffix}") if sub in SUBTASKS else None


def table_subtasks(rows: list[dict]) -> list[str]:
    """The subtask columns of a table of these rows (ours: published rows add none)."""
    return metrics.ordered_subtasks(s for r in rows if r.get("source", "ours") == "ours" for s in row_subtasks(r))


def params_key(params: dict | None) -> str:
    return json.dumps(params or {}, sort_keys=True)


def table_key(row: dict) -> tuple:
    return tuple(row.get(k) for k in TABLE_KEYS)


def repeat_key(row: dict) -> tuple:
    """Runs that are repeats of each other: same settings, method, method settings and warm-up."""
    return (*table_key(row), row["method"], params_key(row.get("method_params")), row.get("warmup_on") or "builtin")


def _stats(values: list) -> tuple[float | None, float | None]:
    vals = [v for v in values if v is not None and not (isinstance(v, float) and math.isnan(v))]
    if not vals:
        return None, None
    return mean(vals), (stdev(vals) if len(vals) > 1 else None)


def aggregate(rows: list[dict]) -> list[dict]:
    """Repeated runs -> one row each: mean of every value column, sample std (None for one run).

    Keys: the settings and method of the group, ``n`` (runs), ``repeats`` (their repeat indices),
    ``<col>`` (mean) and ``<col>_std`` for every column, ``lossless`` summed over the runs.
    """
    groups: dict[tuple, list[dict]] = {}
    for r in rows:
        groups.setdefault(repeat_key(r), []).append(r)
    out = []
    for rs in groups.values():
        first = rs[0]
        agg = {k: first.get(k) for k in (*TABLE_KEYS, "method", "method_params", "warmup_on")}
        agg["n"] = len(rs)
        agg["repeats"] = sorted(r.get("repeat") or 0 for r in rs)
        for k in (*VALUE_KEYS, "decode_speedup", "baseline_tokens_per_s", "questions", "rows_per_step",
                  "speedup_bound", "root_unwritten", "root_rank0"):
            agg[k], agg[f"{k}_std"] = _stats([r.get(k) for r in rs])
        agg["subtasks"] = table_subtasks(rs)
        agg["subtask_speedup"], agg["subtask_speedup_std"] = {}, {}
        for sub in agg["subtasks"]:
            agg["subtask_speedup"][sub], agg["subtask_speedup_std"][sub] = _stats([subtask_value(r, sub) for r in rs])
        # repeats: one interval over all their runs, a question's runs resampled together (none when
        # a row lacks its question speeds)
        speeds = [r.get("question_speeds") for r in rs]
        if len(rs) == 1:
            ci = first.get("speedup_ci_lo"), first.get("speedup_ci_hi")
        else:
            ci = metrics.repeated_speedup_ci(speeds) if all(speeds) else None
        agg["speedup_ci_lo"], agg["speedup_ci_hi"] = ci or (None, None)
        tallies = [r.get("lossless") for r in rs if r.get("lossless")]
        agg["lossless"] = ({k: sum(t.get(k, 0) for t in tallies) for k in tallies[0]} if tallies else None)
        agg["timing_flags"] = timing_marks.merged([r.get("timing_flags") for r in rs])
        out.append(agg)
    return out


def method_labels(rows: list[dict]) -> dict[tuple, str]:
    """Method name, plus the parameters that tell apart several variants of one method in a table."""
    by_method: dict[str, list[dict]] = {}
    for r in rows:
        by_method.setdefault(r["method"], []).append(r)
    labels = {}
    for m, rs in by_method.items():
        variants = {params_key(r.get("method_params")) for r in rs}
        for r in rs:
            label = m
            if len(variants) > 1:
                params = r.get("method_params") or {}
                differing = [k for k in sorted(params)
                             if len({json.dumps((x.get("method_params") or {}).get(k)) for x in rs}) > 1]
                label += " (" + ", ".join(f"{k}={params[k]}" for k in differing) + ")"
            if (r.get("warmup_on") or "builtin") != "builtin":  # Spec-Bench's warm-up: said, never mixed
                label += f" [warmup_on={r['warmup_on']}]"
            labels[repeat_key(r)] = label
    return labels


def variant_label(method: str, params: dict | None) -> str:
    """The settings in which a variant departs from its method's defaults, briefly: 'update=accepted,
    tree=smollm2-135m-cpu.json' ('defaults' when none; a file path by its name, an inline list as [..])."""
    from specbench.registry import drafter_class

    from specbench.errors import SettingsError

    try:
        defaults = drafter_class(method).parameters()
    except SettingsError:  # an imported method (Spec-Bench answer files): every setting is shown
        defaults = {}
    parts = []
    for k, v in sorted((params or {}).items()):
        if k in defaults and defaults[k] == v:
            continue
        if isinstance(v, (list, dict)):
            v = "[..]"
        elif isinstance(v, str) and ("/" in v or v.endswith(".json")):
            v = v.rsplit("/", 1)[-1]
        parts.append(f"{k}={v}")
    return ", ".join(parts) or "defaults"


def _method_rank(method: str) -> int:
    return METHOD_ORDER.index(method) if method in METHOD_ORDER else len(METHOD_ORDER)


def ar_row_from_baselines(rows: list[dict]) -> dict | None:
    """When a table has no AR run, an AR row from the methods' own AR references (interleaved)."""
    tps = [r["baseline_tokens_per_s"] for r in rows if r.get("baseline_tokens_per_s")]
    if not tps or not rows:
        return None
    ar = {k: rows[0].get(k) for k in TABLE_KEYS}
    subs = table_subtasks(rows)
    ar.update(method="ar", method_params={}, n=len(tps), repeats=[], lossless=None,
              **{k: 1.0 for k in SPEEDUP_KEYS}, subtasks=subs, subtask_speedup=dict.fromkeys(subs, 1.0),
              mat=1.0, tokens_per_s=mean(tps),
              tokens_per_s_std=stdev(tps) if len(tps) > 1 else None, from_baselines=True)
    return ar


def normalize_model(name: str) -> str:
    """'lmsys/vicuna-7b-v1.3' and 'vicuna-7b' are the same model for the published tables."""
    name = name.lower().rsplit("/", 1)[-1]
    return re.sub(r"-v1[.\-_]3$", "", name)


def published_for(published: list[dict], model: str, method: str, temperature: float) -> list[dict]:
    """Published rows for this model and method; the published figures are greedy only."""
    if temperature not in (0, 0.0, None):
        return []
    return [p for p in published if normalize_model(p["model"]) == normalize_model(model)
            and p["method"] == method]


def parse_published(text: str, source: str) -> list[dict]:
    """A published CSV (leading '#' lines: its source) -> rows with float values or None."""
    lines = [ln for ln in text.splitlines() if ln.strip() and not ln.startswith("#")]
    rows = []
    for rec in csv.DictReader(lines):
        row = {"model": rec["model"], "method": rec["method"], "source": source}
        for k in VALUE_KEYS:
            v = rec.get("overall_speedup" if k == "overall" else k)
            row[k] = float(v) if v not in (None, "") else None
        rows.append(row)
    return rows


def build_tables(rows: list[dict], published: list[dict] | None = None) -> list[dict]:
    """Aggregated rows -> tables, one per TABLE_KEYS value, each {'key', 'title', 'rows'}.

    Display rows: {'label', 'source' ('ours' or the published source), 'n', values, '<k>_std'}.
    AR first, then methods by overall speedup (best first); each method's published rows follow it.
    """
    published = published or []
    tables: dict[tuple, list[dict]] = {}
    for r in rows:
        tables.setdefault(table_key(r), []).append(r)
    out = []
    for key, rs in sorted(tables.items(), key=lambda kv: json.dumps(kv[0], default=str)):
        rs = list(rs)
        if not any(r["method"] == "ar" for r in rs):
            ar = ar_row_from_baselines(rs)
            if ar:
                rs.append(ar)
        labels = method_labels(rs)
        rs.sort(key=lambda r: (_method_rank(r["method"]) if r["method"] == "ar" else 1,
                               -(r.get("overall") or 0), labels[repeat_key(r)]))
        display = []
        seen_published = set()
        for r in rs:
            label = labels[repeat_key(r)] + (" (interleaved)" if r.get("from_baselines") else "")
            display.append(dict(r, label=label, source="ours"))
            if r["method"] in seen_published:
                continue
            seen_published.add(r["method"])
            for p in published_for(published, r["model"], r["method"], r["temperature"]):
                display.append(dict(p, label=r["method"], n=None))
        meta = dict(zip(TABLE_KEYS, key))
        out.append({"key": meta, "title": table_title(meta), "rows": display, "subtasks": table_subtasks(rs)})
    return out


def headers(subtasks: list[str]) -> list[str]:
    """A table's column headers after 'Method': its subtasks, the metrics, the CI."""
    return [*(SUBTASK_HEADERS.get(s, s) for s in subtasks), *(h for _, h in METRIC_COLUMNS), "95% CI"]


def table_title(meta: dict) -> str:
    filt = (f", top-k {meta['top_k']}" if meta.get("top_k") else "") + (
        f", top-p {meta['top_p']:g}" if meta.get("top_p") not in (None, 1, 1.0) else "")
    return (f"{meta['model']} · {meta['task']} · T={meta['temperature']:g}{filt} · "
            f"{meta['max_new_tokens']} new tokens · {meta['dtype']} · {meta['device']}")


def format_value(key: str, value: float | None, std: float | None = None) -> str:
    """Speedups as 1.23x, MAT with 2 decimals, tokens/s with 1, rates as 12.3%; '± std' when there is one."""
    if value is None:
        return "-"
    fmt = {"mat": "{:.2f}", "tokens_per_s": "{:.1f}", "accept_rate": "{:.1%}"}.get(key, "{:.2f}x")
    text = fmt.format(value)
    if std is not None:
        text += " ± " + fmt.format(std).rstrip("x")
    return text


def _row_label(r: dict) -> str:
    if r["source"] != "ours":
        return f"{r['label']} [{r['source']}]"
    return timing_marks.marked(r["label"], r.get("timing_flags"))


def _cells(r: dict, subtasks: list[str]) -> list[str]:
    lo, hi = r.get("speedup_ci_lo"), r.get("speedup_ci_hi")
    return [_row_label(r),
            *[format_value("speedup", subtask_value(r, s), subtask_value(r, s, "_std")) for s in subtasks],
            *[format_value(k, r.get(k), r.get(f"{k}_std")) for k in METRIC_KEYS],
            "-" if lo is None else f"[{lo:.2f}, {hi:.2f}]"]


def _footnote(table: dict) -> str:
    ours = [r for r in table["rows"] if r["source"] == "ours"]
    parts = []
    if any((r.get("n") or 1) > 1 for r in ours):
        parts.append("ours: mean ± sample std over repeated runs (" + ", ".join(
            f"{r['label']} n={r['n']}" for r in ours) + ")")
    lo = [f"{r['label']} " + (verdict_line(r["lossless"]) if not r["lossless"].get("lossy_differences") else
                               f"{r['lossless']['exact']}/{r['lossless']['checked']} exact, "
                               f"{r['lossless']['lossy_differences']} differ (lossy by design)")
          for r in ours if r.get("lossless") and r["lossless"].get("checked") and r["method"] != "ar"]
    if lo:
        parts.append("lossless check: " + "; ".join(lo))
    if any(r.get("accept_rate") is not None or r.get("speedup_ci_lo") is not None for r in ours):
        several = any((r.get("n") or 1) > 1 and r.get("speedup_ci_lo") is not None for r in ours)
        parts.append("Acc. rate: accepted / drafted draft tokens; 95% CI: of the overall speedup, bootstrap "
                     + ("over questions (a question's runs resampled together)" if several else
                        "over questions (one run)"))
    if any(r["source"] != "ours" for r in table["rows"]):
        parts.append("[..] rows: published figures (greedy, fp16, A100), not comparable in tokens/s")
    marks = timing_marks.footnote(ours, lambda r: r["label"])
    if marks:
        parts.append(marks)
    return ". ".join(parts)


def to_markdown(tables: list[dict]) -> str:
    out = []
    for t in tables:
        heads = headers(t["subtasks"])
        cells = [_cells(r, t["subtasks"]) for r in t["rows"]]
        lines = [f"### {t['title']}", "", markdown_table(["Method", *heads], cells, align="l" + "r" * len(heads))]
        note = _footnote(t)
        if note:
            lines += ["", note + "."]
        out.append("\n".join(lines))
    return "\n\n".join(out) + "\n"


def _tex(s: str) -> str:
    return (s.replace("\\", "\\textbackslash{}").replace("_", "\\_").replace("%", "\\%")
            .replace("&", "\\&").replace("#", "\\#").replace("±", "$\\pm$").replace("·", "/"))


def to_latex(tables: list[dict]) -> str:
    """booktabs tables, one per setting; ``\\usepackage{booktabs}`` in the preamble."""
    out = []
    for t in tables:
        heads = headers(t["subtasks"])
        lines = ["\\begin{table}[t]", "\\centering", "\\small",
                 "\\begin{tabular}{l" + "r" * len(heads) + "}", "\\toprule",
                 "Method & " + " & ".join(_tex(h) for h in heads) + " \\\\", "\\midrule"]
        for r in t["rows"]:
            cells = _cells(r, t["subtasks"])
            lines.append(" & ".join(_tex(c).replace("x", "$\\times$") if i else _tex(c)
                                    for i, c in enumerate(cells)) + " \\\\")
        lines += ["\\bottomrule", "\\end{tabular}", f"\\caption{{{_tex(t['title'])}. {_tex(_footnote(t))}}}",
                  "\\end{table}"]
        out.append("\n".join(lines))
    return "\n\n".join(out) + "\n"


def subtask_field(sub: str) -> str:
    """A subtask's speedup column in a CSV: Spec-Bench's by its name, as ever; another task's
    prefixed, so that no subtask name meets another column's."""
    return sub if sub in SUBTASKS else f"speedup_{sub}"


def csv_fields(subtasks: list[str]) -> list[str]:
    return [*TABLE_KEYS, "method", "label", "source", "n",
            *[c for k in [*map(subtask_field, subtasks), *METRIC_KEYS] for c in (k, f"{k}_std")],
            "speedup_ci_lo", "speedup_ci_hi"]


CSV_FIELDS = csv_fields(list(SUBTASKS))


def csv_subtasks(tables: list[dict]) -> list[str]:
    """The subtask columns of a CSV of these tables: Spec-Bench's six whenever they are all it holds
    (the leaderboard's layout), else every table's subtasks."""
    subs = metrics.ordered_subtasks(s for t in tables for s in t.get("subtasks", SUBTASKS))
    return list(SUBTASKS) if set(subs) <= set(SUBTASKS) else subs


def to_csv_rows(tables: list[dict]) -> list[dict]:
    subs = csv_subtasks(tables)
    rows = []
    for t in tables:
        for r in t["rows"]:
            rec = dict(t["key"])
            rec.update({k: r.get(k) for k in csv_fields([]) if k not in t["key"]})
            for sub in subs:
                rec[subtask_field(sub)] = subtask_value(r, sub)
                rec[f"{subtask_field(sub)}_std"] = subtask_value(r, sub, "_std")
            rows.append(rec)
    return rows


def to_csv(tables: list[dict]) -> str:
    buf = io.StringIO()
    w = csv.DictWriter(buf, fieldnames=csv_fields(csv_subtasks(tables)), lineterminator="\n")
    w.writeheader()
    for rec in to_csv_rows(tables):
        w.writerow({k: ("" if v is None else v) for k, v in rec.items()})
    return buf.getvalue()


def ablation_tables(rows: list[dict]) -> list[dict]:
    """Aggregated rows -> one table per setting and method that has several variants (an ablation):
    {'title', 'method', 'rows'}, each row a variant with MAT, speedup, bound and rows per step,
    best overall speedup first."""
    groups: dict[tuple, list[dict]] = {}
    for r in rows:
        if r["method"] != "ar":
            groups.setdefault((table_key(r), r["method"]), []).append(r)
    out = []
    for (key, method), rs in sorted(groups.items(), key=lambda kv: json.dumps(kv[0], default=str)):
        if len({params_key(r.get("method_params")) for r in rs}) < 2:
            continue
        rs = sorted(rs, key=lambda r: -(r.get("overall") or 0))
        display = [dict(r, label=variant_label(method, r.get("method_params"))
                        + ("" if (r.get("warmup_on") or "builtin") == "builtin" else f" [warmup_on={r['warmup_on']}]"))
                   for r in rs]
        out.append({"title": f"{method} ablations · {table_title(dict(zip(TABLE_KEYS, key)))}", "method": method,
                    "rows": display})
    return out


ABLATION_COLUMNS = [("mat", "MAT"), ("overall", "Speedup"), ("speedup_bound", "Bound"),
                    ("rows_per_step", "Rows/step"), ("root_unwritten", "Root row never written"),
                    ("root_rank0", "Root rank 0 = target")]
SHARE_COLUMNS = ("root_unwritten", "root_rank0")


def ablation_markdown(tables_: list[dict]) -> str:
    out = []
    for t in tables_:
        rows = []
        for r in t["rows"]:
            cells = [r["label"]]
            for k, _ in ABLATION_COLUMNS:
                v, sd = r.get(k), r.get(f"{k}_std")
                if k in SHARE_COLUMNS:
                    cells.append("-" if v is None else f"{100 * v:.0f}%" + (f" ± {100 * sd:.0f}" if sd else ""))
                    continue
                fmt_key = "rows_per_step" if k == "rows_per_step" else ("mat" if k == "mat" else "overall")
                cells.append("-" if v is None else (f"{v:.1f}" + (f" ± {sd:.1f}" if sd else "")
                                                    if fmt_key == "rows_per_step" else format_value(fmt_key, v, sd)))
            lo = r.get("lossless") or {}
            cells.append(verdict_line(lo).split(";")[0] if lo.get("checked") else "-")
            rows.append(cells)
        lines = [f"### {t['title']}", "", markdown_table(["Setting", *(h for _, h in ABLATION_COLUMNS), "Lossless"], rows,
                                                         align="l" + "r" * len(ABLATION_COLUMNS) + "l")]
        n = max((r.get("n") or 1) for r in t["rows"])
        lines += ["", "Speedup over AR interleaved; bound = MAT x t(1) / t(rows) on the run's cost curve"
                  + (f"; mean ± std over {n} repeats" if n > 1 else "") + "."]
        out.append("\n".join(lines))
    return "\n\n".join(out) + ("\n" if out else "")
