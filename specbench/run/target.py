"""The run's target: the model and its engine, loaded once per process (a Hydra multirun loads the
weights and compiles the forward once, not once per job), the sampler, and the cost curve behind
the speedup bound."""

from __future__ import annotations

import dataclasses

import torch

from specbench.config import NO_CURVE, RunConfig, RunPlan
from specbench.decoding.engine import Engine
from specbench.decoding.forward_choice import ForwardChoice
from specbench.decoding.sampling import PositionSampler
from specbench.drafter import Target
from specbench.inputs.models import eos_token_ids, load_model, resolve_dtype
from specbench.registry import drafter_class
from specbench.speculation import cost


def make_sampler(cfg: RunConfig) -> PositionSampler | None:
    if cfg.temperature == 0:
        return None
    return PositionSampler(cfg.temperature, cfg.top_k, cfg.top_p, cfg.seed)


def run_cost_curve(cfg: RunConfig, model, engine: Engine | None = None, contexts=()) -> cost.CostCurve | None:
    """The cost curve behind the run's speedup bound: `cost_curve=auto` takes the profiled one cached
    for this model, device, dtype, forward and `contexts` (the contexts the run meets,
    `cost.contexts_for`; none: the short one alone), else measures a quick one (seconds per context);
    `off` none; else a file, measured on the run's forward (eager or compiled), at its own contexts."""
    setting = cfg.cost_curve
    if setting in NO_CURVE:
        return None
    # a curve file was checked against the run's forward in plan_run; auto measures on the engine's own
    return cost.resolve_curve(setting, model, cfg.model.name, cfg.dtype, engine=engine, contexts=contexts)


# The last model loaded in this process with its engine: a Hydra multirun (one process) loads the
# weights and compiles the forward once, not once per job.
_LOADED: dict = {}


def load_engine(plan: RunPlan):
    """(model, tokenizer, engine) for the run, reusing the previous job's when model and forward match."""
    cfg = plan.settings
    device, dtype = torch.device(cfg.device), resolve_dtype(cfg.dtype)
    key = (repr(sorted(dataclasses.asdict(cfg.model).items())), str(device), str(dtype), plan.forward)
    if key not in _LOADED:
        _LOADED.clear()
        model, tok = load_model(cfg.model, device, dtype)
        _LOADED[key] = (model, tok, Engine(model, eos_token_ids(model, tok), compiled=plan.forward != "eager",
                                           products=ForwardChoice(plan.forward).products))
    return _LOADED[key]


def method_drafter_factory(cfg: RunConfig, model, curve: cost.CostCurve | None, sampler: PositionSampler | None = None):
    """A builder of the run's method drafter. Every drafter is offered the same facts about the target
    and takes what it needs (Medusa the vocabulary projection, adaptive TR the cost curve, SpS's coupled
    draft the sampler, to draw its tokens with the target's position-keyed noise)."""
    target = Target(vocab_size=model.get_output_embeddings().weight.shape[0], device=model.device, model=model,
                    model_name=cfg.model.name, dtype_name=cfg.dtype, hardware_curve=curve, sampler=sampler)
    cls = drafter_class(cfg.method["name"])
    settings = cfg.method_settings
    return lambda: cls(target, cls.Settings(**settings))
