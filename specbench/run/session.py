"""A run's session: what a single run and a serving run share between the plan and the first timed token.

`open_session(plan, kind)` builds it once, in this order, and nothing in it is filled in later:

1. the results folder, held by its lock (one run per folder), refused if it holds answers made with
   other settings, its config written;
2. the device's timing lock, held shared (run/timing_guard.py), before anything heavy runs;
3. the target model and its engine, loaded once per process (run/target.py); the questions' first
   turns checked against the model's window; the compiled forward's one cache capacity reserved;
   a forward that stepped down while loading becomes the plan (and the folder's identity);
4. the rounding band the lossless check uses, measured on this model, device, dtype and forward;
5. the cost curve behind the speedup bound (measured: a timed section of its own) and the sampler.

The questions are the plan's (loaded once, by plan_run).
"""

from __future__ import annotations

import hashlib
import weakref
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from specbench.config import NO_CURVE, RunConfig, RunPlan
from specbench.decoding.sampling import PositionSampler
from specbench.inputs.window import model_context_length
from specbench.registry import drafter_class
from specbench.run.plan import check_identity, run_identity, serving_identity
from specbench.run.prompts import check_questions_fit, longest_prompt_bound, reserve_compiled_cache
from specbench.run.results_io import make_directory, write_json_atomic
from specbench.run.run_lock import lock_run_directory
from specbench.run.target import load_engine, make_sampler, method_drafter_factory, run_cost_curve
from specbench.run.timing_guard import TimingGuard
from specbench.speculation import cost


@dataclass(frozen=True)
class RunKind:
    """What differs between a single run's folder and a serving run's."""

    config_file: str  # serving: not run_config.json, so the single-request tables skip its folder
    identity: Callable[[RunPlan], dict]  # what the folder's answers depend on
    curve_at_contexts: bool  # the curve measured at the contexts the run's turns reach


SERVING_CONFIG = "serving_config.json"  # what marks a serving run's folder (report/serving_report.py)
SINGLE = RunKind("run_config.json", run_identity, True)
SERVING = RunKind(SERVING_CONFIG, serving_identity, False)


class Session:
    """The run's folder, target, band and timing guard; `close()` (or the process's end) lets them go."""

    def __init__(self, plan: RunPlan, kind: RunKind):
        self.plan, self.kind = plan, kind
        self.folder = make_directory(Path(plan.results_dir))
        self._held = [lock_run_directory(self.folder)]  # released in reverse by close() or the process's end
        self.timing: TimingGuard | None = None
        weakref.finalize(self, _release, self._held)
        try:
            check_identity(self.folder, kind.identity(plan), kind.config_file)
            self.write_config()
            self.timing = TimingGuard(plan)
            self._held.append(self.timing)
            self._load()
        except BaseException:
            self.close()
            raise

    @property
    def cfg(self) -> RunConfig:
        return self.plan.settings

    @property
    def questions(self) -> list:
        return list(self.plan.questions)

    def _load(self) -> None:
        cfg = self.cfg
        self.model, self.tok, self.engine = load_engine(self.plan)
        template, max_new = cfg.model.chat_template, cfg.max_new_tokens
        # a prompt that with max_new_tokens runs past the window is refused before anything compiles or is timed
        check_questions_fit(self.tok, self.questions, template, max_new,
                            self.engine.context_length or model_context_length(cfg.model), cfg.model.name)
        reserve_compiled_cache(self.engine, [drafter_class("ar"), drafter_class(self.plan.method)], self.tok,
                               self.questions, template, max_new)
        if self.engine.forward_name != self.plan.forward:  # compiling failed: the engine went on eager
            self.plan = self.plan.stepped_down(self.engine.forward_name)
            check_identity(self.folder, self.kind.identity(self.plan), self.kind.config_file)
        self.band = self._rounding_band()
        self.curve = self._cost_curve()
        self.sampler: PositionSampler | None = make_sampler(self.cfg)
        if self.sampler is not None:  # its kernel and noise table, before anything is timed
            self.sampler.prepare(self.engine.device)
        self.write_config()

    def _rounding_band(self) -> dict | None:
        """Loaded from the cache or measured (seconds); none when nothing is checked."""
        from specbench.run.rounding_band import load_or_measure

        cfg = self.cfg
        if not cfg.lossless.check:
            return None
        model_key = cfg.model.name + (f"-{hashlib.sha256(str(cfg.model.path).encode()).hexdigest()[:8]}"
                                      if cfg.model.path else "")
        return load_or_measure(self.model, self.tok, model_key, self.plan.device_name, cfg.dtype,
                               engine=self.engine, template=cfg.model.chat_template)

    def _cost_curve(self) -> cost.CostCurve | None:
        """Priced at the contexts the run's turns reach (speculation/cost.py contexts_for), so the bound
        and the goodput choices price a step at its own context."""
        cfg = self.cfg
        if cfg.cost_curve in NO_CURVE:
            return None
        contexts = ()
        if self.kind.curve_at_contexts:
            longest = longest_prompt_bound(self.tok, self.questions, cfg.model.chat_template, cfg.max_new_tokens)
            contexts = cost.contexts_for(longest, cfg.max_new_tokens, self.engine.context_length)
        with self.timing.timed():  # a quick curve is measured here: alone on the device
            curve = run_cost_curve(cfg, self.model, self.engine, contexts)
        if curve is not None:
            curve.save(self.folder / "cost_curve.json")
        return curve

    def drafter_factory(self, sampler: PositionSampler | None = None):
        return method_drafter_factory(self.cfg, self.model, self.curve, sampler)

    def write_config(self) -> None:
        """The identity, the settings as planned, the timing's provenance and the band, once known."""
        band = getattr(self, "band", None)
        kept = ("band_ulps", "band_logits", "measured_ulps", "measured_logits", "safety", "forward", "cached")
        extra = {"rounding_band": {k: band[k] for k in kept if k in band}} if band else {}
        if self.timing is not None:
            extra["provenance"] = self.timing.provenance
        write_json_atomic(self.folder / self.kind.config_file,
                          {"identity": self.kind.identity(self.plan), "config": self.plan.recorded(), **extra})

    def handover(self) -> TimingGuard:
        """The folder let go, the device's timing guard kept (held shared) for the caller to release once
        the run's reports are written (specbench/main.py)."""
        guard = self.timing
        self._held.remove(guard)
        _release(self._held)
        return guard

    def close(self) -> None:
        _release(self._held)


def _release(held: list) -> None:
    while held:
        held.pop().release()


def open_session(plan: RunPlan, kind: RunKind = SINGLE) -> Session:
    return Session(plan, kind)
