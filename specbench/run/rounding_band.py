"""The lossless check's rounding band, measured on the run's own model, dtype, device and forward.

An argmax flips between tokens a and b only when z_a - z_b moves by more than their margin, so the
band bounds how far the margins between near-top tokens move between two forwards that compute the
same logits in a different order. `measure_band` pairs AR's one-row steps with a tree forward (AR's
own continuation as a chain plus distractor siblings) and with the check's teacher-forced forward,
takes the largest spread over either row's top `TOP` tokens in ulps of the row's largest |logit|,
and scales it by SAFETY, never beyond `lossless.rounding_band`. Cached per (model, device name,
dtype, forward, torch version). The procedure and the measured bands: docs/protocol.md,
"Lossless check".
"""

from __future__ import annotations

import json
import math
import re
import time

import torch

from specbench.draft import Draft
from specbench.drafter import Drafter
from specbench.draft import DraftTree

# Why a factor of 2: the measurement sees a few hundred rows on three prompts, a run checks thousands
# of tokens on others. The largest of n draws of a rounding noise with a Gaussian-like tail grows like
# sqrt(2 ln n): from ~10^2 rows to ~10^5 that is 4.8 / 3.0 = 1.6x, so 2x covers the longer run with room.
# A larger factor would hide bugs: in bfloat16 a verifier that takes the runner-up within 0.25 logits
# must still fall outside (tests/test_lossless_mutations.py).
MANTISSA_BITS = {"float32": 23, "float16": 10, "bfloat16": 7}
BAND_ULPS = {"float32": 128, "float16": 16, "bfloat16": 16}


def ulp(magnitude: float, dtype_name: str) -> float:
    """The dtype's spacing at `magnitude`: 2 ** (exponent of magnitude - mantissa bits)."""
    exponent = math.floor(math.log2(magnitude)) if magnitude > 0 else -126
    return 2.0 ** (exponent - MANTISSA_BITS[dtype_name])


def rounding_band(max_abs_logit: float, dtype_name: str, temperature: float = 0.0) -> float:
    """How far apart two scores may be and still swap places through rounding alone; on logits / T
    when sampling."""
    band = BAND_ULPS[dtype_name] * ulp(max_abs_logit, dtype_name)
    return band / temperature if temperature > 0 else band


SAFETY = 2.0
TOP = 8  # the tokens whose margins matter: an argmax never flips to a token far below the top
PROMPTS = (
    "Write a short story about a robot learning to paint.",
    "Summarize: The quick brown fox jumps over the lazy dog. It was a sunny day and the fox was happy.",
    "What is 17 * 23? Explain step by step.",
)


def margin_spread(a: torch.Tensor, b: torch.Tensor, top: int = TOP) -> torch.Tensor:
    """Per row pair (n, vocab) of the same positions from two forwards: the largest change of a margin
    between any two of the tokens in either row's top `top`, max |d(z_i - z_j)| = max d - min d."""
    a, b = a.float(), b.float()
    idx = torch.cat([a.topk(top, dim=-1).indices, b.topk(top, dim=-1).indices], dim=-1)
    d = b.gather(-1, idx) - a.gather(-1, idx)
    return d.amax(dim=-1) - d.amin(dim=-1)


def ulps_at(values: torch.Tensor, scales: torch.Tensor, dtype_name: str) -> torch.Tensor:
    """`values` in units of the dtype's spacing at each row's largest |logit| (`scales`)."""
    return values / torch.tensor([ulp(float(s), dtype_name) for s in scales], dtype=values.dtype)


def band_from_spreads(spreads_logits: list[float], spreads_ulps: list[float], safety: float = SAFETY) -> dict:
    """The band from the measured spreads: the largest, times the safety factor."""
    worst_l = max(spreads_logits, default=0.0)
    worst_u = max(spreads_ulps, default=0.0)
    return {"measured_logits": worst_l, "measured_ulps": worst_u, "safety": safety,
            "band_logits": safety * worst_l, "band_ulps": safety * worst_u}


def row_band(measured: dict | None, max_abs_logit: float, dtype_name: str, temperature: float = 0.0) -> float:
    """The band for one row: the measured band (in ulps at the row's largest |logit|), capped by the
    assumed one; the assumed one when nothing was measured."""
    upper = rounding_band(max_abs_logit, dtype_name, temperature)
    if not measured:
        return upper
    band = measured["band_ulps"] * ulp(max_abs_logit, dtype_name)
    band = band / temperature if temperature > 0 else band
    return min(band, upper)


class _Recorder(Drafter):
    """AR that keeps each step's one-row logits (row 0 predicts the token after the root)."""

    name = "ar"

    def __init__(self):
        super().__init__()
        self.rows: list[torch.Tensor] = []

    def observe(self, outcome):
        self.rows.append(outcome.logits[0].float())


class _ChainOracle(Drafter):
    """Proposes AR's own next `chain` tokens as a chain plus random distractor siblings, a
    `width`-row tree, and records the chain's rows while the output still equals AR's."""

    name = "band_oracle"

    def __init__(self, reference: list[int], prompt_len: int, vocab: int, chain: int, width: int, seed: int = 0):
        super().__init__()
        self.ref, self.prompt_len, self.chain, self.width = reference, prompt_len, chain, width
        self.gen = torch.Generator().manual_seed(seed)
        self.vocab = vocab
        self.trees: dict[int, DraftTree] = {}
        self.pending = None
        self.pairs: list[tuple[int, torch.Tensor]] = []  # (output index predicted, tree row)

    def _tree(self, k: int) -> DraftTree:
        if k not in self.trees:
            parents = list(range(k)) + [j % (k + 1) for j in range(self.width - 1 - k)]
            self.trees[k] = DraftTree(parents)
        return self.trees[k]

    def propose(self, state):
        out = state.tokens[self.prompt_len:].tolist()
        offset = len(out)
        self.pending = None
        if out != self.ref[:offset] or offset >= len(self.ref):
            return None  # diverged from AR (a flip in the tree forward): nothing comparable follows
        k = min(self.chain, len(self.ref) - offset)
        tree = self._tree(k)
        extra = torch.randint(self.vocab, (len(tree) - k,), generator=self.gen)
        self.pending = (offset, k)
        return Draft(tokens=torch.cat([torch.tensor(self.ref[offset:offset + k]), extra]), tree=tree)

    def observe(self, outcome):
        if self.pending is None:
            return
        offset, k = self.pending
        for r in range(k + 1):  # row r predicts output index offset + r
            self.pairs.append((offset + r, outcome.logits[r].float()))


@torch.inference_mode()
def measure_band(model, tokenizer, dtype_name: str, *, engine=None, prompts=PROMPTS, new_tokens: int = 24,
                 chain: int = 4, tree_width: int = 32, template: str = "auto", safety: float = SAFETY) -> dict:
    """Measure the rounding band of `model` in its dtype on its device (see the module's docstring).
    `engine`: the run's engine (its forward, eager or compiled, is the one measured); by default an
    eager one. Returns the band in logits and in ulps, the measured spreads behind it, and how many
    rows were compared; seconds for SmolLM2-135M on a CPU."""
    from specbench.decoding.engine import Engine
    from specbench.inputs.chat import prompt_ids

    t0 = time.perf_counter()
    if engine is None:
        engine = Engine(model, [])  # no EOS: every prompt gives all its rows
    vocab = model.get_output_embeddings().weight.shape[0]
    spreads = {"tree": ([], []), "teacher_forced": ([], [])}
    max_abs = 0.0
    for n, text in enumerate(prompts):
        ids = prompt_ids(tokenizer, [{"role": "user", "content": text}], template)
        rec = _Recorder()
        ref = engine.generate(ids, rec, new_tokens).tokens
        if len(ref) < 2:
            continue
        inc = torch.stack(rec.rows)  # inc[j] predicts ref[j + 1]
        pairs = {}
        oracle = _ChainOracle(ref, len(ids), vocab, chain, tree_width, seed=n)
        engine.generate(ids, oracle, new_tokens)
        for index, row in oracle.pairs:
            if 1 <= index <= len(inc):
                pairs.setdefault(index, row)
        tf = model(input_ids=torch.tensor([ids + ref[:-1]], device=model.device),
                   logits_to_keep=len(ref)).logits[0].float()  # tf[j] predicts ref[j], as check_tokens
        for name, other, at in (("tree", torch.stack(list(pairs.values())) if pairs else None,
                                 [i - 1 for i in pairs]),
                                ("teacher_forced", tf[1:len(inc) + 1], list(range(len(inc))))):
            if other is None:
                continue
            base = inc[at]
            s = margin_spread(base, other).cpu()
            scales = base.abs().amax(dim=-1).cpu()
            spreads[name][0].extend(s.tolist())
            spreads[name][1].extend(ulps_at(s, scales, dtype_name).tolist())
            max_abs = max(max_abs, float((other - base).abs().max()))
    logits = spreads["tree"][0] + spreads["teacher_forced"][0]
    ulps = spreads["tree"][1] + spreads["teacher_forced"][1]
    out = band_from_spreads(logits, ulps, safety)
    out.update({
        "dtype": dtype_name, "device": str(model.device), "forward": getattr(engine, "forward_name", "eager"),
        "rows_compared": {k: len(v[0]) for k, v in spreads.items()},
        "measured_by_forward": {k: {"logits": max(v[0], default=0.0), "ulps": max(v[1], default=0.0)}
                                for k, v in spreads.items()},
        "max_abs_dlogit": max_abs, "top": TOP, "tree_width": tree_width, "prompts": len(prompts),
        "new_tokens": new_tokens, "torch": torch.__version__, "seconds": round(time.perf_counter() - t0, 2),
    })
    return out


def cache_path(model_name: str, device_name: str, dtype_name: str, forward: str = "eager"):
    from specbench.inputs.models import cache_root

    slug = re.sub(r"[^\w.+-]+", "_", f"{model_name}-{device_name}-{dtype_name}-{forward}-torch{torch.__version__}")
    return cache_root() / "rounding_band" / f"{slug}.json"


def load_or_measure(model, tokenizer, model_name: str, device_name: str, dtype_name: str, *, engine=None,
                    template: str = "auto") -> dict:
    """The band cached for this (model, device, dtype, forward, torch version), else measured and cached."""
    forward = getattr(engine, "forward_name", "eager")
    path = cache_path(model_name, device_name, dtype_name, forward)
    if path.is_file():
        try:
            band = json.loads(path.read_text())
            if band.get("band_ulps") is not None and math.isfinite(band["band_ulps"]):
                return dict(band, cached=True)
        except (OSError, ValueError):
            pass  # unreadable: measure again
    band = measure_band(model, tokenizer, dtype_name, engine=engine, template=template)
    band.update(model=model_name, device_name=device_name)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(f".{time.time_ns()}.tmp")
        tmp.write_text(json.dumps(band, indent=1))
        tmp.replace(path)
    except OSError:
        pass  # a read-only cache: the run still has its measurement
    return dict(band, cached=False)
