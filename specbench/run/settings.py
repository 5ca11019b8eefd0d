"""A run's settings, all checked before anything is loaded (model, datastore, Medusa heads, cost curve).

`validate` raises a SpecbenchError (specbench/errors.py) naming the problem and the fix; run.py
prints it as one `error: ...` line and exits 2. Method settings are checked by the method itself
(`Drafter.check_settings`), with the same code its constructor uses; the model, task and cost-curve
checks are likewise the ones their loaders run.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

from specbench.config import ModelConfig, RunConfig, typed
from specbench.decoding.forward_choice import planned_forward
from specbench.environment import check_environment
from specbench.errors import InputError, SettingsError
from specbench.speculation.cost import load_curve_file
from specbench.run.host_memory import HOST_MEMORY
from specbench.inputs.models import check_model_config, resolve_device, resolve_dtype, run_dtype
from specbench.inputs.tasks import load_task
from specbench.registry import drafter_class

BASELINES = ("interleave", "reuse", "shared", "none")
NOT_SET = "???"  # OmegaConf's mark for a mandatory value (model.path of model=hf, task.path of task=jsonl)


# builtin: a prompt in no task, then every drafter reset; first_question: Spec-Bench's protocol
WARMUP_ON = ("builtin", "first_question")


def _profile_flags(forward: str) -> str:
    return {"eager": "", "compiled": " --compile --products inductor", "compiled-packed": " --compile"}[forward]


def forward_name(cfg: RunConfig, device) -> str:
    """The target forward the settings ask for on this kind of machine (forward_choice.planned_forward):
    `eager`; `compiled` (inductor's own matrix products on CPU, CUDA graphs on a GPU); `compiled-packed`
    (the CPU compiled forward with our packed kernel for the products). What a run gets can be less,
    where this machine cannot build what the plan needs (forward_choice.choose_forward)."""
    try:
        return planned_forward(cfg.compile, cfg.compile_products, device,
                               resolve_dtype(run_dtype(cfg.dtype, device, cfg.model)))
    except ValueError as e:
        raise SettingsError(str(e)) from None


def method_params(cfg: RunConfig) -> dict:
    return {k: v for k, v in cfg.method.items() if k != "name"}


def validate(cfg: RunConfig) -> None:
    """Every setting of a run (max_new_tokens filled in from the task): the run's own first, then,
    each by the code that will load it, the method, the cost curve, the model, the method's settings
    and the question file."""
    check_environment()
    _check_all_set(dataclasses.asdict(cfg))
    if _number(cfg.max_new_tokens, "max_new_tokens", integer=True) < 1:
        raise SettingsError(f"max_new_tokens must be at least 1, got {cfg.max_new_tokens}")
    if _number(cfg.warmup, "warmup", integer=True) < 0:
        raise SettingsError(f"warmup must be 0 or more, got {cfg.warmup}")
    if _number(cfg.temperature, "temperature") < 0:
        raise SettingsError(f"temperature must be 0 (greedy) or positive, got {cfg.temperature}")
    if not 0 < _number(cfg.top_p, "top_p") <= 1:
        raise SettingsError(f"top_p must be in (0, 1] (1 = off), got {cfg.top_p}")
    if _number(cfg.top_k, "top_k", integer=True) < 0:
        raise SettingsError(f"top_k must be 0 (off) or positive, got {cfg.top_k}")
    _number(cfg.seed, "seed", integer=True)
    if _number(cfg.repeat or 0, "repeat", integer=True) < 0:
        raise SettingsError(f"repeat must be 0 (a single run) or a positive run number, got {cfg.repeat}")
    if cfg.warmup_on not in WARMUP_ON:
        raise SettingsError(f"warmup_on must be one of {', '.join(WARMUP_ON)}, got '{cfg.warmup_on}'")
    if cfg.host_memory not in HOST_MEMORY:
        raise SettingsError(f"host_memory must be keep or system, got '{cfg.host_memory}'")
    if cfg.baseline not in BASELINES:
        raise SettingsError(f"baseline must be interleave, reuse, shared or none, got '{cfg.baseline}'")
    for key in ("per_subtask", "limit"):
        if getattr(cfg.task, key) is not None:
            _number(getattr(cfg.task, key), f"task.{key}", integer=True)
    check_serving(cfg)
    method = drafter_class(cfg.method["name"])  # an unknown name is refused with the valid ones
    device = resolve_device(cfg.device)
    check_cost_curve(cfg, forward_name(cfg, device))
    check_model_config(cfg.model)
    check_context_length(cfg.model, cfg.max_new_tokens)
    method.check_settings(method_params(cfg), {"model_name": cfg.model.name, "device": cfg.device,
                                               "dtype_name": run_dtype(cfg.dtype, device, cfg.model)})
    load_task(cfg.task)  # the question file: there and well-formed (file and line named)


def model_context_length(model_cfg: ModelConfig) -> int | None:
    """The positions the model was trained for, known before loading: the model config's
    `context_length` (the embedded GGUF models), else max_position_embeddings of a local directory's
    config.json; None when neither says (the engine checks once the model has loaded)."""
    model_cfg = typed(ModelConfig, model_cfg)
    if model_cfg.context_length:
        return int(model_cfg.context_length)
    path = model_cfg.path
    if not path or model_cfg.gguf or not Path(str(path), "config.json").is_file():
        return None
    try:
        conf = json.loads(Path(str(path), "config.json").read_text())
    except (OSError, ValueError):
        return None  # the loader says what is wrong with it
    n = conf.get("max_position_embeddings") or (conf.get("text_config") or {}).get("max_position_embeddings")
    return n if isinstance(n, int) and n > 0 else None


def check_context_length(model_cfg: ModelConfig, max_new_tokens: int) -> None:
    """max_new_tokens must leave room in the model's context for the prompt."""
    n = model_context_length(model_cfg)
    if n is not None and max_new_tokens >= n:
        raise InputError(f"max_new_tokens={max_new_tokens} is beyond the context of model {model_cfg.name} "
                         f"({n} positions, prompt included); set max_new_tokens below {n}")


def check_prompts_fit(prompts: list[tuple], max_new_tokens: int, context_length: int | None,
                      model_name: str) -> None:
    """InputError naming the first prompt that with max_new_tokens runs past the model's window, and
    the fix: the largest max_new_tokens every prompt fits with, or the subtasks whose prompts fit.
    prompts: (question id, subtask, prompt tokens) each. Nothing is checked where the window is
    unknown (None)."""
    if not context_length:
        return
    over = [p for p in prompts if p[2] + max_new_tokens > context_length]
    if not over:
        return
    qid, subtask, tokens = over[0]
    more = len(over) - 1
    others = f", as {'does' if more == 1 else 'do'} {more} more question{'s' * (more > 1)}" if more else ""
    fits = context_length - max(n for _, _, n in prompts)
    fixes = [f"set max_new_tokens to at most {fits}"] if fits >= 1 else []
    short = list(dict.fromkeys(p[1] for p in prompts if p[1] not in {o[1] for o in over}))
    fixes.append(f"keep the subtasks that fit (task.subtasks=[{','.join(short)}])" if short else
                 "use shorter prompts")
    raise InputError(f"question {qid!r} (subtask {subtask}): its prompt of {tokens} tokens and max_new_tokens="
                     f"{max_new_tokens} need {tokens + max_new_tokens} positions, beyond the context of model "
                     f"{model_name} ({context_length} positions){others}; {' or '.join(fixes)}")


BATCH_SPECULATION = ("fixed", "goodput")


def is_serving_run(cfg: RunConfig) -> bool:
    """Concurrent requests (run/serving.py) rather than one question at a time."""
    return bool(cfg.serving) or cfg.batch_size > 1 or cfg.request_rate is not None


def check_serving(cfg: RunConfig) -> None:
    """batch_size, request_rate, batch_speculation, and what a batched run cannot do yet."""
    if _number(cfg.batch_size, "batch_size", integer=True) < 1:
        raise SettingsError(f"batch_size must be at least 1, got {cfg.batch_size}")
    rate = cfg.request_rate
    if rate is not None and _number(rate, "request_rate") <= 0:
        raise SettingsError(f"request_rate must be positive (requests per second) or null, got {rate}")
    if cfg.batch_speculation not in BATCH_SPECULATION:
        raise SettingsError(f"batch_speculation must be fixed or goodput, got '{cfg.batch_speculation}'")
    if not is_serving_run(cfg):
        return
    if cfg.temperature != 0:
        raise SettingsError("serving runs (serving=true, batch_size > 1 or request_rate) decode greedily; set temperature=0")
    if str(cfg.compile) in ("on", "true", "True"):
        raise SettingsError("batched runs use the eager forward (the compiled one's static cache holds one "
                            "request); set compile=off or auto")
    if cfg.baseline not in ("interleave", "none"):
        raise SettingsError(f"batched runs time batched AR beside the method in the same process; set "
                            f"baseline=interleave (or none), got '{cfg.baseline}'")


def check_cost_curve(cfg: RunConfig, forward: str) -> None:
    """A cost-curve file must have been measured on the forward the run uses."""
    curve = cfg.cost_curve
    if curve in (None, False, "auto", "off", "none"):  # as run_cost_curve reads it
        return
    if not isinstance(curve, str):
        raise SettingsError(f"cost_curve must be auto, off or a curve JSON path, got {curve!r}")
    measured_on = load_curve_file(curve).forward
    if measured_on != forward:
        raise SettingsError(
            f"cost_curve {curve}: measured on the {measured_on} forward, but this run uses the {forward} "
            f"one; profile it with scripts/profile_cost.py{_profile_flags(forward)} --out <file>, or set "
            f"compile={'off' if measured_on == 'eager' else 'on'}"
            + (f" compile_products={'packed' if measured_on == 'compiled-packed' else 'inductor'}"
               if measured_on != 'eager' else ""))


def _number(value, name: str, integer: bool = False):
    """`value`, refused unless it is a number (an integer with `integer`)."""
    if isinstance(value, bool) or not isinstance(value, int if integer else (int, float)):
        raise SettingsError(f"{name} must be {'an integer' if integer else 'a number'}, got {value!r}")
    return value


def _check_all_set(cfg: dict, prefix: str = "") -> None:
    for key, value in cfg.items():
        if isinstance(value, dict):
            _check_all_set(value, f"{prefix}{key}.")
        elif value == NOT_SET:
            raise SettingsError(f"{prefix}{key} is not set; give it on the command line: {prefix}{key}=...")
