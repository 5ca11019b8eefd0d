"""summary.md: the environment, the cost curves and predictions, each real-model pass's table and the
stage table, which is also the last thing the command prints (what comes back first)."""

from __future__ import annotations

import json
from pathlib import Path


def summary_markdown(results: dict, work: Path, cpu: bool) -> str:
    lines = ["# gpu_check" + (" (CPU rehearsal)" if cpu else ""), ""]
    env_file = work / "env.json"
    if env_file.is_file():
        env = json.loads(env_file.read_text())
        lines += [f"{env.get('gpu') or 'no GPU'}; Python {env.get('python')}; torch {env.get('torch')} (CUDA "
                  f"{env.get('cuda')}); transformers {env.get('transformers')}; {env.get('nvidia_smi', '')}", ""]
    lines += cost_lines(work)
    for name in ("real_model", "real_model_bf16", "real_model_compiled"):
        lines += method_lines(results.get(name, {}), name)
    profile = work / "step_profile" / "step_profile.md"
    if profile.is_file():
        lines += ["#" + profile.read_text().strip(), ""]
    lines += ["## Stages", "", "| stage | status | seconds | budget | detail |", "|---|---|---|---|---|"]
    for name, r in results.items():
        lines.append(f"| {name} | {r['status']} | {r.get('seconds', 0):.0f} | {r.get('budget', '-')} | "
                     f"{str(r.get('detail', '')).replace('|', '/')} |")
    return "\n".join(lines) + "\n"


def cost_lines(work: Path) -> list[str]:
    curves = sorted((work / "cost").glob("cost_*.json")) if (work / "cost").is_dir() else []
    if not curves:
        return []
    from specbench.speculation.cost import CostCurve

    lines = ["## Cost curves (random weights)", "",
             "| shape | forward | dtype | t(1) ms | t(81)/t(1) | t(128)/t(1) | t(1)/floor(1) |", "|---|---|---|---|---|---|---|"]
    for f in curves:
        c = CostCurve.load(f)
        floor = c.floor(1)
        lines.append(f"| {c.model} | {c.forward} | {c.dtype} | {c.t(1) * 1e3:.2f} | {c.t(81) / c.t(1):.2f} | "
                     f"{c.t(128) / c.t(1):.2f} | {'-' if not floor else f'{c.t(1) / floor:.1f}'} |")
    lines.append("")
    for f in sorted((work / "cost").glob("predictions_*.md")):
        lines += [f"### {f.stem.removeprefix('predictions_')}", "", f.read_text().strip(), ""]
    return lines


def _fmt(v, fmt: str) -> str:
    return "-" if v is None else format(v, fmt)


def _times(v) -> str:
    return "-" if v is None else f"{v:.2f}x"


def method_lines(result: dict, name: str) -> list[str]:
    rows = [r for r in result.get("rows", []) if "mat" in r]
    if not rows:
        return []
    lines = [f"## {name}", ""]
    warm = result.get("warmup")
    if warm:
        lines += [f"Warm-up before the first method (AR on one question, not counted): {warm['status']} in "
                  f"{_fmt(warm.get('seconds'), '.0f')} s, AR median step {_fmt(warm.get('ar_step_ms'), '.1f')} ms"
                  + (f"; our CPU kernels {warm['kernels']} in {_fmt(warm.get('kernels_seconds'), '.0f')} s" if "kernels" in warm else "")
                  + ". "
                  "Each method's AR step should match the others': one far off was disturbed.", ""]
    lines += ["| method | forward | dtype | speedup | decode | bound | predicted | MAT | rows/step | tokens/s | AR tokens/s | "
              "step ms | AR step ms | band (ulps; measured logits) | lossless |",
              "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r['method']}{'' if r.get('round', 1) == 1 else ' (' + str(r['round']) + ')'} | "
                     f"{r.get('forward_used')} | {r['dtype']} | {_times(r['speedup'])} | "
                     f"{_times(r['decode_speedup'])} | {_times(r['bound'])} | {_times(r.get('predicted'))} | "
                     f"{_fmt(r['mat'], '.2f')} | "
                     f"{_fmt(r['rows_per_step'], '.1f')} | {_fmt(r['tokens_per_s'], '.1f')} | "
                     f"{_fmt(r['ar_tokens_per_s'], '.1f')} | {_fmt(r.get('step_ms'), '.1f')} | "
                     f"{_fmt(r.get('ar_step_ms'), '.1f')} | {_fmt(r.get('band_ulps'), '.0f')}; "
                     f"{_fmt(r.get('band_measured_logits'), '.2g')} | {r['lossless']} |")
    lines += rounds_lines(result, rows) + split_lines(rows)
    lines += ["", "Each turn's median step (ms) in the order decoded (a: AR, m: the method):", ""]
    lines += [f"- {r['method']}: {' '.join(r['turns'])}" for r in rows if r.get("turns")]
    node = result.get("node")
    if node:
        lines += ["", "The node while it ran: " + ", ".join(f"{k} {v}" for k, v in node.items()) + "."]
    return lines + [""]


def rounds_lines(result: dict, rows: list[dict]) -> list[str]:
    """Each method's speedup over its rounds (mean, range, 95% t-interval) and its lossless tally over
    every round; nothing when no method ran twice."""
    stats = result.get("rounds") or {}
    if not any(st and st["n"] > 1 for st in stats.values()):
        return []
    lines = ["", "Over the rounds (each round every method once, AR interleaved):", "",
             "| method | rounds | mean speedup | range | 95% interval | MAT | tokens checked | outside the band | "
             "mismatches |", "|---|---|---|---|---|---|---|---|---|"]
    for m, st in stats.items():
        mine = [r for r in rows if r["method"] == m]
        if not st or not mine:
            continue
        iv = st.get("interval")
        lines.append(f"| {m} | {st['n']} | {_times(st['mean'])} | {_times(st['min'])}-{_times(st['max'])} | "
                     f"{'-' if not iv else f'{_times(iv[0])}-{_times(iv[1])}'} | {_fmt(mine[0]['mat'], '.2f')} | "
                     f"{sum(r.get('tokens_checked') or 0 for r in mine)} | "
                     f"{sum(r.get('tokens_outside_band') or 0 for r in mine)} | "
                     f"{sum(r.get('mismatches') or 0 for r in mine)} |")
    return lines


def split_lines(rows: list[dict]) -> list[str]:
    """Each method's step split by phase (ms per step, the mean over its rounds), its AR's beside it."""
    have = [r for r in rows if r.get("step_split_ms")]
    if not have:
        return []
    phases = list(dict.fromkeys(k for r in have for k in r["step_split_ms"]))
    lines = ["", "The step split by phase, ms per step (mean over rounds; AR: each method's own interleaved AR):", "",
             "| method | " + " | ".join(phases) + " | sum | AR: " + " | AR: ".join(phases) + " | AR sum |",
             "|---" * (2 * len(phases) + 3) + "|"]
    for m in dict.fromkeys(r["method"] for r in have):
        mine = [r for r in have if r["method"] == m]
        cells = []
        for key in ("step_split_ms", "ar_step_split_ms"):
            got = [r[key] for r in mine if r.get(key)]
            mean = {k: sum(g.get(k, 0.0) for g in got) / len(got) for k in phases} if got else {}
            cells += [_fmt(mean.get(k), ".3f") for k in phases] + [_fmt(sum(mean.values()) if mean else None, ".3f")]
        lines.append(f"| {m} | " + " | ".join(cells) + " |")
    return lines