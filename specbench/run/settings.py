"""A run's own settings checked before anything loads: each value within its range, one of its
choices, and what a serving run cannot take. A check raises a SpecbenchError (specbench/errors.py)
naming the problem and the fix; run.py prints it as one `error: ...` line and exits 2. What a setting
names to load (the method, a cost curve, the model, the questions) is checked by its own loader's
code, in run/plan.py's plan_run.
"""

from __future__ import annotations

import dataclasses

from specbench.config import RunConfig
from specbench.environment import check_environment
from specbench.errors import SettingsError
from specbench.run.host_memory import HOST_MEMORY

BASELINES = ("interleave", "reuse", "shared", "none")
NOT_SET = "???"  # OmegaConf's mark for a mandatory value (model.path of model=hf, task.path of task=jsonl)


# builtin: a prompt in no task, then every drafter reset; first_question: Spec-Bench's protocol
WARMUP_ON = ("builtin", "first_question")


def check_values(cfg: RunConfig) -> None:
    """The run's own settings (max_new_tokens filled in from the task): each set, a number where a
    number is meant, within its range, one of its choices, and the combinations a serving run cannot
    take. The settings that name something to load are checked by its loader (run/plan.py)."""
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


BATCH_SPECULATION = ("fixed", "goodput")


def check_serving(cfg: RunConfig) -> None:
    """batch_size, request_rate, batch_speculation, and what a batched run cannot do yet."""
    if _number(cfg.batch_size, "batch_size", integer=True) < 1:
        raise SettingsError(f"batch_size must be at least 1, got {cfg.batch_size}")
    rate = cfg.request_rate
    if rate is not None and _number(rate, "request_rate") <= 0:
        raise SettingsError(f"request_rate must be positive (requests per second) or null, got {rate}")
    if cfg.batch_speculation not in BATCH_SPECULATION:
        raise SettingsError(f"batch_speculation must be fixed or goodput, got '{cfg.batch_speculation}'")
    if not cfg.is_serving:
        return
    if cfg.temperature != 0:
        raise SettingsError("serving runs (serving=true, batch_size > 1 or request_rate) decode greedily; set temperature=0")
    if str(cfg.compile) in ("on", "true", "True"):
        raise SettingsError("batched runs use the eager forward (the compiled one's static cache holds one "
                            "request); set compile=off or auto")
    if cfg.baseline not in ("interleave", "none"):
        raise SettingsError(f"batched runs time batched AR beside the method in the same process; set "
                            f"baseline=interleave (or none), got '{cfg.baseline}'")
    if cfg.prefix_cache:
        raise SettingsError("serving runs decode each question's first turn as one request: prefix_cache "
                            "(a conversation's cache kept between its turns) does not apply; set prefix_cache=false")


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
