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
                  f"{_fmt(warm.get('seconds'), '.0f')} s, AR median step {_fmt(warm.get('ar_step_ms'), '.1f')} ms. "
                  "Each method's AR step should match the others': one far off was disturbed.", ""]
    lines += ["| method | forward | dtype | speedup | decode | bound | MAT | rows/step | tokens/s | AR tokens/s | "
              "step ms | AR step ms | band (ulps; measured logits) | lossless |",
              "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r['method']} | {r.get('forward_used')} | {r['dtype']} | {_times(r['speedup'])} | "
                     f"{_times(r['decode_speedup'])} | {_times(r['bound'])} | {_fmt(r['mat'], '.2f')} | "
                     f"{_fmt(r['rows_per_step'], '.1f')} | {_fmt(r['tokens_per_s'], '.1f')} | "
                     f"{_fmt(r['ar_tokens_per_s'], '.1f')} | {_fmt(r.get('step_ms'), '.1f')} | "
                     f"{_fmt(r.get('ar_step_ms'), '.1f')} | {_fmt(r.get('band_ulps'), '.0f')}; "
                     f"{_fmt(r.get('band_measured_logits'), '.2g')} | {r['lossless']} |")
    lines += ["", "Each turn's median step (ms) in the order decoded (a: AR, m: the method):", ""]
    lines += [f"- {r['method']}: {' '.join(r['turns'])}" for r in rows if r.get("turns")]
    node = result.get("node")
    if node:
        lines += ["", "The node while it ran: " + ", ".join(f"{k} {v}" for k, v in node.items()) + "."]
    return lines + [""]
