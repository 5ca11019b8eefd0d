"""What a finished run prints: its table beside AR, the per-subtask table, the rounding band and every
divergence the lossless check found. Read from the summary alone, so a finished run's folder prints the same."""

from __future__ import annotations

from specbench.markdown import markdown_table
from specbench.report import timing_marks
from specbench.run import lossless
from specbench.speculation import roofline


def format_table(summary: dict) -> str:
    cols = [s for s in summary.get("subtasks") or [k for k in summary["speedup"] or {} if k != "overall"]
            if summary["speedup"] and s in summary["speedup"]]
    head = ["method", *cols, "overall", "decode", "bound", "MAT", "tokens/s", "lossless"]
    sp = summary["speedup"] or {}
    dec = (summary.get("decode_speedup") or {}).get("overall")
    bound = summary.get("speedup_bound")
    lo = summary["lossless"]
    row = [summary["method"], *[f"{sp[c]:.2f}x" for c in cols],
           f"{sp['overall']:.2f}x" if sp.get("overall") else "-", f"{dec:.2f}x" if dec else "-",
           f"{bound:.2f}x" if bound else "-", f"{summary['mat']:.2f}",
           f"{summary['tokens_per_s']:.1f}",
           (lossless.verdict_line(lo) if summary.get("lossless_method", True) else
            f"lossy by design: {lo['exact']}/{lo['checked']} equal to AR")]
    rows = [head, row]
    if summary["baseline_tokens_per_s"]:
        rows.insert(1, ["ar", *["1.00x"] * len(cols), "1.00x", "1.00x", "1.00x", "1.00",
                        f"{summary['baseline_tokens_per_s']:.1f}", "reference"])
    out = [markdown_table(rows[0], rows[1:], pad=True)]
    detail = summary.get("speedup_bound_detail")
    if detail:
        c = detail["cost_curve"]
        out.append(f"decode = speedup without prefill; bound = MAT x t(1) / t(rows), step by step, from the "
                   f"{'quick ' if c['quick'] else ''}cost curve of {c['device']} ({c['dtype']}, t(1) = "
                   f"{c['t1_ms']:.1f} ms, {detail['mean_rows']:.1f} rows per step); decode vs bound: harness overhead")
    out.append(acceptance_latency_line(summary))
    out += roofline.footer_lines(summary)
    if summary["method"] == "tr" and sp.get("overall") and sp["overall"] < 1:
        rows = f"{detail['mean_rows']:.0f}-row " if detail else ""
        out.append(f"TR is below 1x here: on this hardware a forward over its {rows}tree costs more than the "
                   "tokens it recycles save. Try method=tr_adaptive, which verifies each step the part of the "
                   "tree that pays on this machine's cost curve (docs/token-recycling.md).")
    return "\n".join(out)


def subtask_table(summary: dict) -> str:
    """Per subtask: questions, mean input tokens, speedup and decode speedup, MAT, drafted-token
    acceptance, mean prefill time (method / AR), and the memory of the largest turn: KV cache, drafter
    state, and the device's peak where CUDA measured one."""
    figures = summary.get("by_subtask") or {}
    peaks = any(f.get("peak_device_bytes") is not None for f in figures.values())
    head = ["subtask", "questions", "input tokens", "speedup", "decode", "MAT", "acc. rate",
            "prefill ms (method / AR)", "KV cache", "drafter state", *(["peak device"] if peaks else [])]
    rows = []
    for sub, f in figures.items():
        prefill = [_number(f[k], "{:.0f}", 1000) for k in ("prefill_time", "baseline_prefill_time")]
        rows.append([sub, f["questions"], _number(f["input_tokens"], "{:.0f}"), _number(f["speedup"], "{:.2f}x"),
                     _number(f["decode_speedup"], "{:.2f}x"), f"{f['mat']:.2f}",
                     _number(f["drafted_token_rate"], "{:.1%}"), " / ".join(prefill),
                     format_bytes(f["kv_cache_bytes"]), format_bytes(f["drafter_state_bytes"]),
                     *([format_bytes(f["peak_device_bytes"])] if peaks else [])])
    return markdown_table(head, rows, pad=True, align="lrrrrrrrrr" + "r" * peaks)


def _number(value, fmt: str, scale: float = 1) -> str:
    return "-" if value is None else fmt.format(value * scale)


def format_bytes(n: int | None) -> str:
    """Bytes in the largest unit they fill (B, KiB, MiB, GiB); '-' for None."""
    if n is None:
        return "-"
    for unit, size in (("GiB", 2 ** 30), ("MiB", 2 ** 20), ("KiB", 2 ** 10)):
        if n >= size:
            return f"{n / size:.1f} {unit}"
    return f"{n} B"


def acceptance_latency_line(summary: dict) -> str:
    """The table's footer line of acceptance and latency figures ('-' where the answers lack them)."""
    acc, lat, ci = summary.get("acceptance") or {}, summary.get("latency") or {}, summary.get("speedup_ci")
    ms = lambda v: "-" if v is None else f"{1000 * v:.1f} ms"
    rate = acc.get("drafted_token_rate")
    per_token = lat.get("per_token") or {}
    return (f"accepted {'-' if rate is None else f'{100 * rate:.1f}%'} of drafted tokens; "
            f"TTFT p50 {ms((lat.get('ttft') or {}).get('p50'))}; "
            f"per-token latency p50 {ms(per_token.get('p50'))}, p99 {ms(per_token.get('p99'))}; "
            f"speedup 95% CI {f'{ci[0]:.2f}x-{ci[1]:.2f}x' if ci else '-'} (bootstrap over questions)")


def print_finished(summary: dict) -> None:
    """Everything a finished single run prints, from its summary."""
    print(format_table(summary))
    print(subtask_table(summary))
    band = summary.get("rounding_band")
    if band:
        lo = summary["lossless"]
        print(f"rounding band: {band['band_ulps']:.3g} ulps of each row's largest logit (measured "
              f"{band['measured_ulps']:.3g} x {band['safety']:g} on this {band.get('forward', 'eager')} forward"
              f"{', cached' if band.get('cached') else ''}; {band['band_logits']:.3g} logits where measured); "
              f"numeric tokens {lo.get('tokens_numeric', 0)}/{lo.get('tokens_checked', 0)}")
    for line in divergence_lines(summary.get("lossless_details") or []):
        print(line)
    line = timing_line(summary.get("timing"))
    if line:
        print(line)
    print(f"results: {summary['results_dir']}")


def divergence_lines(details: list[dict]) -> list[str]:
    nan, out = float("nan"), []
    for d in details:
        if d["status"] not in ("exact", "unchecked"):
            out.append(f"  {d['status']}: question {d['question_id']} turn {d['turn']} position {d['position']} "
                       f"(AR top-2 margin {d.get('ar_top2_margin', nan):.3g}, method token rank "
                       f"{d.get('method_token_rank', '?')} at {d.get('method_gap_to_top', nan):.3g} below the top, "
                       f"float32 margin {d.get('float32_margin', nan):.3g}, band {d.get('band', nan):.3g})")
        bad = d.get("tokens", {}).get("first_outside")
        if bad:
            out.append(f"  outside the band: question {d['question_id']} turn {bad['turn']} token {bad['index']} "
                       f"(margin {bad['margin']:.3g} to the target's choice, band {bad['band']:.3g})")
    return out


def timing_line(timing: dict | None) -> str | None:
    """One line when the timing is not to be trusted as is: timed on a shared device, under other load, or
    on a machine whose speed moved between the method and AR (timing_marks.drift_line)."""
    if not timing:
        return None
    flagged = timing.get("contended", 0) + timing.get("baseline_contended", 0)
    plain = timing.get("plain_step_ratio") or {}
    drift = timing_marks.drift_line(plain.get("ratio"), plain.get("steps") or 0)
    if timing.get("exclusive", True) and not flagged and not drift:
        return None
    why = [] if timing.get("exclusive", True) else ["timed on a shared device (timing.exclusive=false)"]
    if drift:
        why.append(drift)
    if flagged:
        why.append(f"{timing.get('contended', 0)} of the method's and {timing.get('baseline_contended', 0)} of "
                   f"AR's timed sections ran while other processes loaded the device (more than "
                   f"{timing.get('max_other_load')} cores beyond what the run leaves free)")
    return "TIMING NOT ALONE: " + "; ".join(why) + ": its speedups are marked in every table"
