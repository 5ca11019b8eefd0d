"""The lossless check: every emitted token is the target's choice, up to the forward's rounding.

Two checks per question, both on the real model: `check_tokens` compares every emitted token with
the target's choice in one teacher-forced forward over prompt + output (greedy: the argmax;
sampling: the argmax of the filtered, tempered logits plus that position's keyed noise), independent
of AR's trajectory; `compare_question` compares with AR, a first divergence judged by a float32
referee. A token off the target's choice is numeric only within the rounding band (`rounding_band`,
in ulps of the row's largest |logit|): the band the run measured (run/rounding_band.py), passed as
`band`, else the assumed BAND_ULPS. A run also fails when numeric tokens exceed
`lossless.max_numeric_share`. Why a band in ulps, and what was measured: docs/protocol.md,
"Lossless check".
"""

from __future__ import annotations

import copy
import weakref

import torch

from specbench.run.rounding_band import (BAND_ULPS, MANTISSA_BITS, rounding_band, row_band, ulp)  # noqa: F401  (part of the check's API)

def first_divergence(a: list[int], b: list[int]) -> int | None:
    """Index of the first differing token, or None when equal (a length difference counts)."""
    for i, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return i
    return None if len(a) == len(b) else min(len(a), len(b))


def target_scores(logits: torch.Tensor, positions: torch.Tensor, sampler=None) -> torch.Tensor:
    """The scores whose argmax is the target's choice: the logits (greedy), or the filtered, tempered
    logits plus each position's keyed noise (sampling), in float32."""
    if sampler is None:
        return logits.float()
    from specbench.decoding.sampling import filter_logits, gumbel_noise

    scores = filter_logits(logits, sampler.temperature, sampler.top_k, sampler.top_p)
    return scores + gumbel_noise(sampler.key, positions.to(scores.device), scores.shape[-1])


def classify_tokens(scores: torch.Tensor, tokens: torch.Tensor, bands: torch.Tensor) -> dict:
    """Per emitted token: the target's choice, within the band of it (numeric), or outside (a bug).
    scores (n, vocab), tokens (n,), bands (n,). Pure: the teacher-forced forward is the caller's."""
    best = scores.max(dim=-1).values
    own = scores.gather(-1, tokens[:, None])[:, 0]
    margin = best - own  # >= 0; inf when the token was filtered out
    equal = margin == 0
    inside = ~equal & (margin <= bands)
    outside = ~equal & ~inside
    first_bad = int(outside.nonzero()[0, 0]) if outside.any() else None
    return {"tokens_checked": int(tokens.numel()), "tokens_equal": int(equal.sum()),
            "tokens_numeric": int(inside.sum()), "tokens_outside_band": int(outside.sum()),
            "first_outside": None if first_bad is None else
            {"index": first_bad, "token": int(tokens[first_bad]), "margin": float(margin[first_bad]),
             "band": float(bands[first_bad])}}


@torch.inference_mode()
def check_tokens(model, record: dict, dtype_name: str, sampler=None, question_id=None, band: dict | None = None) -> dict:
    """Every emitted token of every turn of a question against one teacher-forced forward per turn.
    `band`: the run's measured rounding band (rounding_band.measure_band); None: the assumed one."""
    total = {"tokens_checked": 0, "tokens_equal": 0, "tokens_numeric": 0, "tokens_outside_band": 0}
    first = None
    temperature = sampler.temperature if sampler is not None else 0.0
    for turn, t in enumerate(record["turns"]):
        prompt, out = list(t["prompt_ids"]), list(t["token_ids"])
        if not out:
            continue
        if sampler is not None:
            sampler.bind(question_id, turn)
        ids = torch.tensor([prompt + out[:-1]], device=model.device)
        logits = model(input_ids=ids, logits_to_keep=len(out)).logits[0]  # rows predicting out[0..n-1]
        from specbench.numerics import check_finite  # NaN/inf: the model overflowed its dtype, one line
        check_finite(model, logits, ids[0], "the lossless check's forward")
        positions = torch.arange(len(prompt) - 1, len(prompt) - 1 + len(out), device=logits.device)
        scores = target_scores(logits, positions, sampler)
        scale = logits.float().abs().amax(dim=-1).tolist()
        bands = torch.tensor([row_band(band, s, dtype_name, temperature) for s in scale], device=scores.device)
        c = classify_tokens(scores, torch.tensor(out, device=scores.device), bands)
        for k in total:
            total[k] += c[k]
        if first is None and c["first_outside"] is not None:
            first = dict(c["first_outside"], turn=turn)
    return dict(total, first_outside=first)


_FLOAT32_TWINS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def float32_twin(model):
    """The same weights in float32 (the referee); the model itself when it already is float32."""
    if model.dtype == torch.float32:
        return model
    if model not in _FLOAT32_TWINS:
        _FLOAT32_TWINS[model] = copy.deepcopy(model).float().eval()
    return _FLOAT32_TWINS[model]


@torch.inference_mode()
def referee(model, prefix_ids: list[int], ar_token: int, method_token: int, dtype_name: str, sampler=None,
            band: dict | None = None) -> dict:
    """Judge one divergence from AR at the token after `prefix_ids`: numeric when the method's token
    lies within the band of the top score (in the run's dtype, on a plain forward) and the two tokens'
    float32 margin is inside the band (the run's measured one when given); a bug otherwise.
    Within the band, not AR's runner-up: a three-way near-tie in half precision lets another forward's
    rounding pick the third token, which a top-two rule calls a bug although float32 cannot tell them
    apart."""
    ids = torch.tensor([prefix_ids], device=model.device)
    pos = torch.tensor([len(prefix_ids) - 1], device=model.device)
    logits = model(input_ids=ids, logits_to_keep=1).logits[0, -1:]
    scores = target_scores(logits, pos, sampler)[0]
    top2 = scores.topk(2)
    exact = target_scores(float32_twin(model)(input_ids=ids, logits_to_keep=1).logits[0, -1:], pos, sampler)[0]
    band = row_band(band, float(logits.float().abs().max()), dtype_name, sampler.temperature if sampler else 0.0)
    return dict(judge_divergence(scores, exact, ar_token, method_token, band),
                ar_top2_margin=float(top2.values[0] - top2.values[1]))


def judge_divergence(scores: torch.Tensor, exact: torch.Tensor, ar_token: int, method_token: int,
                     band: float) -> dict:
    """The referee's rule on one row: `scores` in the run's dtype, `exact` the float32 twin's. Numeric
    when the method's token is within `band` of the row's top score and within `band` of AR's token in
    float32; otherwise a mismatch."""
    gap = float(scores.max() - scores[method_token])
    float32_margin = abs(float(exact[ar_token] - exact[method_token]))
    rank = int((scores > scores[method_token]).sum())
    near_top = gap <= band
    return {"status": "numeric_tie" if near_top and float32_margin <= band else "mismatch",
            "float32_margin": float32_margin, "band": band, "method_gap_to_top": gap,
            "method_token_rank": rank, "method_token_near_top": near_top}


def compare_question(model, ar_record: dict, method_record: dict, dtype_name: str,
                     sampler=None, question_id=None, band: dict | None = None) -> dict:
    """Against AR: exact, or the first divergent turn's first divergence judged by the referee (later
    turns have other prompts). A length difference (one side stopped) is judged at the shorter end;
    a different number of turns is a mismatch of its own ('turns_differ'), never a silent zip."""
    n_ar, n_m = len(ar_record["turns"]), len(method_record["turns"])
    if n_ar != n_m:
        return {"status": "mismatch", "reason": "turns_differ", "ar_turns": n_ar, "method_turns": n_m,
                "turn": min(n_ar, n_m), "position": 0, "ar_token": None, "method_token": None}
    for turn, (ta, tm) in enumerate(zip(ar_record["turns"], method_record["turns"])):
        pos = first_divergence(ta["token_ids"], tm["token_ids"])
        if pos is None:
            continue
        if sampler is not None:
            sampler.bind(question_id, turn)
        ar_tok = ta["token_ids"][pos] if pos < len(ta["token_ids"]) else None
        m_tok = tm["token_ids"][pos] if pos < len(tm["token_ids"]) else None
        prefix = ta["prompt_ids"] + ta["token_ids"][:pos]
        if ar_tok is None or m_tok is None:  # one side ended: only a mismatch of lengths is left
            verdict = {"status": "mismatch", "ar_top2_margin": float("nan"), "float32_margin": float("nan"),
                       "band": float("nan"), "method_token_near_top": False}
        else:
            verdict = referee(model, prefix, ar_tok, m_tok, dtype_name, sampler, band)
        return dict(verdict, turn=turn, position=pos, ar_token=ar_tok, method_token=m_tok)
    return {"status": "exact"}


def tally(checks: list[dict], questions: int | None = None) -> dict:
    """Per run: questions exact vs AR, numeric divergences, mismatches (bugs), lossy differences; and the
    whole-output counts summed over every checked question. `questions`: how many the run asked (the
    verdict's denominator; fewer checked than asked is a failure of its own); default: those checked."""
    out = {
        # only when given: readers of committed results (report/collect.py) keep their columns
        **({"questions": questions} if questions is not None else {}),
        "checked": len(checks),
        "exact": sum(c["status"] == "exact" for c in checks),
        "numeric_ties": sum(c["status"] == "numeric_tie" for c in checks),
        "mismatches": sum(c["status"] == "mismatch" for c in checks),
        "lossy_differences": sum(c["status"] == "lossy_difference" for c in checks),
    }
    for key in ("tokens_checked", "tokens_equal", "tokens_numeric", "tokens_outside_band"):
        out[key] = sum(c.get("tokens", {}).get(key, 0) for c in checks)
    out["questions_outside_band"] = sum(bool(c.get("tokens", {}).get("tokens_outside_band")) for c in checks)
    return out


# Below this many numeric tokens a run never fails on their share: an honest run of ~100 tokens in
# bfloat16 may see 2-3 flips (2% of tokens, tests/test_lossless_mutations.py), and a share of so few is noise.
MIN_NUMERIC_TOKENS = 6


def numeric_share_exceeded(lo: dict, limit: float | None) -> bool:
    """More numeric tokens (within the band, not the target's choice) than `limit` of those checked:
    a verifier that prefers the runner-up near a tie, which a per-token band cannot tell from rounding."""
    if limit is None or not lo.get("tokens_checked"):
        return False
    n = lo.get("tokens_numeric", 0)
    return n >= MIN_NUMERIC_TOKENS and n > limit * lo["tokens_checked"]


def verdict_line(lo: dict) -> str:
    """A run's lossless verdict in one line: `6/6 valid, 5 exact vs AR, 1 numeric; 425 tokens checked,
    0 outside the band`. Valid: no token outside the band and no divergence the referee calls a bug."""
    bugs, checked = lo.get("mismatches", 0), lo.get("checked", 0)
    asked = lo.get("questions", checked)  # older summaries: no question count, the checked ones
    if checked == 0 and asked:
        return f"unchecked (0/{asked} checked)"
    bad = bugs + lo.get("questions_outside_band", int(bool(lo.get("tokens_outside_band"))))
    line = (f"{checked - min(bad, checked)}/{asked} valid, {lo.get('exact', 0)} exact vs AR, "
            f"{lo.get('numeric_ties', 0)} numeric")
    if checked < asked:
        line += f", {checked}/{asked} checked"
    if bugs:
        line += f", {bugs} BUG(S)"
    if lo.get("tokens_checked"):
        line += f"; {lo['tokens_checked']} tokens checked, {lo['tokens_outside_band']} outside the band"
    return line
