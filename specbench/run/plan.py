"""A run's plan: its settings checked and resolved once for this machine (device, dtype, forward, host
memory), where its results go, and the identity its answers carry (a resume or a reused AR run
never mixes answers made with other settings, code, questions or threads)."""

from __future__ import annotations

import dataclasses
import hashlib
import json
import re
import sys
from pathlib import Path

import torch

from specbench.decoding.forward_choice import choose_forward, planned_forward
from specbench.config import NO_CURVE, RunConfig, RunPlan, run_config
from specbench.errors import SettingsError
from specbench.inputs.models import check_model_config, file_sha256, resolve_device, resolve_dtype, run_dtype
from specbench.inputs.tasks import load_task
from specbench.inputs.window import check_context_length
from specbench.registry import drafter_class
from specbench.run.baselines import check_baseline_environment
from specbench.run.host_memory import apply_host_memory
from specbench.run import schemas as _schemas  # noqa: F401  (the settings' Hydra schemas, for whoever composes them)
from specbench.run.results_io import read_json
from specbench.run.settings import check_values
from specbench.speculation.cost import check_curve_file
from specbench.timing import device_name


def method_variant(cfg: RunConfig) -> str:
    """The method settings that differ from its defaults (its Settings dataclass), as a short directory
    label ('' for the defaults), so `-m method.k=4,8` gives each setting its own results directory."""
    defaults = drafter_class(cfg.method["name"]).parameters()
    changed = {k: v for k, v in sorted(cfg.method_settings.items()) if defaults.get(k, object()) != v}
    if not changed:
        return ""
    label = ",".join(f"{k}={v}" for k, v in changed.items()).replace(" ", "")
    if len(label) > 48 or not re.fullmatch(r"[\w.,=+-]+", label):  # inline trees, paths: a hash
        label = hashlib.blake2b(json.dumps(changed, sort_keys=True).encode(), digest_size=4).hexdigest()
    return "~" + label


def results_dir_for(cfg: RunConfig, method: str) -> Path:
    if cfg.results_dir and method == cfg.method["name"]:
        return Path(cfg.results_dir)
    t = cfg.task
    subtasks = t.subtasks
    task = (t.name + (f"-{'+'.join([subtasks] if isinstance(subtasks, str) else subtasks)}" if subtasks else "")
            + (f"-ps{t.per_subtask}" if t.per_subtask else "") + (f"-l{t.limit}" if t.limit else ""))
    filt = (f"-k{cfg.top_k}" if cfg.top_k else "") + (f"-p{cfg.top_p:g}" if cfg.top_p < 1 else "")
    # a kept cache between turns (prefix_cache): -pc; repeated runs: -r1, -r2, ...
    rep = ("-pc" if cfg.prefix_cache else "") + (f"-r{cfg.repeat}" if cfg.repeat else "")
    # a half-precision run beside its float32 twin (a dtype sweep): -bf16, -fp16; float32 and auto
    # keep the names every committed result has
    rep = {"bfloat16": "-bf16", "float16": "-fp16"}.get(cfg.dtype, "") + rep
    variant = ""
    if method == cfg.method["name"]:
        variant = method_variant(cfg)
        if method != "ar" and cfg.warmup_on != "builtin":  # AR learns nothing
            variant += f"~warmup_on={cfg.warmup_on}"
    return (Path(cfg.results_root) / cfg.model.name / task
            / f"{method}-t{cfg.temperature:g}{filt}-m{cfg.max_new_tokens}{rep}{variant}")


def serving_dir(cfg: RunConfig) -> Path:
    """A serving run's directory: the single-request run's name under serving/, with the load it was
    given."""
    if cfg.results_dir:
        return Path(cfg.results_dir)
    single = results_dir_for(cfg, cfg.method["name"])
    name, _, variant = single.name.partition("~")
    load = f"-b{cfg.batch_size}" + (f"-rps{cfg.request_rate:g}" if cfg.request_rate is not None else "")
    spec = "-goodput" if cfg.batch_speculation == "goodput" else ""
    return single.parent / "serving" / (name + load + spec + (f"~{variant}" if variant else ""))


def run_directory(cfg: RunConfig) -> Path:
    """Where this run's results go: a serving run's folder or a single run's."""
    return serving_dir(cfg) if cfg.is_serving else results_dir_for(cfg, cfg.method["name"])


_CODE_VERSION: str | None = None


def code_version() -> str:
    """A short hash of the specbench package's sources: answers resumed or reused come from the same
    code. Chosen over the package version plus `git describe`: a version string does not change with an
    edit, a describe needs git and a checkout (a pip install has neither) and says nothing of
    uncommitted changes; hashing ~100 small files takes milliseconds, once per process."""
    global _CODE_VERSION
    if _CODE_VERSION is None:
        root = Path(__file__).resolve().parents[1]
        h = hashlib.sha256()
        for f in sorted(root.rglob("*.py")):
            h.update(str(f.relative_to(root)).encode() + b"\0" + f.read_bytes() + b"\0")
        _CODE_VERSION = h.hexdigest()[:12]
    return _CODE_VERSION


def task_sha256(path) -> str | None:
    """The question file's contents' sha256 (None for a built-in task, or a file that is not there)."""
    if not path or not Path(path).is_file():
        return None
    return file_sha256(Path(path))


def identity(plan: RunPlan) -> dict:
    cfg = plan.settings
    return {
        "model": cfg.model.name, "model_path": cfg.model.path,
        "task": cfg.task.name, "task_path": cfg.task.path,
        "subtasks": cfg.task.subtasks, "per_subtask": cfg.task.per_subtask,
        "limit": cfg.task.limit, "max_new_tokens": cfg.max_new_tokens,
        "temperature": cfg.temperature, "top_k": cfg.top_k, "top_p": cfg.top_p,
        "dtype": cfg.dtype, "device": cfg.device,
        # a GPU's answers and timings are its own: an A100's AR never pairs with an H100's method
        **({"device_name": plan.device_name} if cfg.device.startswith("cuda") else {}),
        "seed": cfg.seed,
        **({"prefix_cache": True} if cfg.prefix_cache else {}),  # turns on a kept cache (older runs: no key)
        # answers from the compiled forward are kept apart from eager ones (older runs: eager, no key)
        **({"forward": plan.forward} if plan.forward != "eager" else {}),
        # the code, the questions' contents, whether answers were checked and the machine's thread count:
        # a resume never mixes answers of another code, question file, check setting or thread count
        "code_version": code_version(), "task_sha256": task_sha256(cfg.task.path),
        "lossless_check": bool(cfg.lossless.check),
        "threads": torch.get_num_threads(),
    }


def run_identity(plan: RunPlan) -> dict:
    """What a run's own answers depend on: the shared settings (identity), the method and its
    settings, and for a learning drafter what it warmed up on (AR's answers depend on neither)."""
    cfg, method = plan.settings, plan.method
    ident = dict(identity(plan), method=method, method_params=cfg.method_settings)
    if method != "ar":
        ident["warmup_on"] = cfg.warmup_on
    ident.update(drafter_class(method).resource_identity(cfg.method_settings))
    return ident


def serving_identity(plan: RunPlan) -> dict:
    """What a serving run's sides depend on: the shared settings, the method and the load it was given."""
    cfg = plan.settings
    return dict(identity(plan), method=plan.method, method_params=cfg.method_settings,
                batch_size=cfg.batch_size, request_rate=cfg.request_rate,
                batch_speculation=cfg.batch_speculation)


# Keys an identity gained after results were committed: an old run_config.json lacks them.
NEWER_IDENTITY_KEYS = ("code_version", "task_sha256", "lossless_check", "threads")


def check_identity(path: Path, ident: dict, config_file: str = "run_config.json", *,
                   missing_ok: bool = False) -> None:
    """Refuse a directory whose answers were made with other settings than `ident`.

    A key an old identity lacks (NEWER_IDENTITY_KEYS: results committed before they existed) is a
    difference too, so a resume never mixes answers of unknown code, questions or threads with new
    ones. `missing_ok`: such a key counts as 'unknown, accepted', for a caller that only reads finished
    answers (baseline=reuse; the reports read committed results without any identity check)."""
    cfg_file = path / config_file
    if cfg_file.is_file():
        old = read_json(cfg_file)["identity"]  # corrupt: one line naming the file (results.read_json)
        diff = {k: (old.get(k), v) for k, v in ident.items() if old.get(k) != v
                and not (missing_ok and k in NEWER_IDENTITY_KEYS and k not in old)}
        if diff:
            raise SettingsError(
                f"{path} holds answers made with other settings {diff}; give another results_dir=... "
                f"or delete that directory"
            )


def run_settings(given) -> RunConfig:
    """The run's settings typed (`given`: Hydra's plain dict, one written by hand, or a RunConfig);
    a key that is no setting is refused in one line."""
    try:
        return run_config(given)
    except TypeError as e:
        raise SettingsError(f"{e}; the run's settings are specbench/config.py's RunConfig") from None


def plan_run(given) -> RunPlan:
    """Every setting checked before anything loads (`given`: as run_settings takes it): the run's own
    values, then what each setting names, by the code that will load it; then what this machine makes
    of them, resolved once: the device, the dtype, the forward it can run (forward_choice.py), the host
    memory policy, the names results record."""
    cfg = checked_settings(given)
    method = drafter_class(cfg.method["name"])  # an unknown name is refused with the valid ones
    device = resolve_device(cfg.device)
    dtype = run_dtype(cfg.dtype, device, cfg.model)  # auto: by device and model (results name it)
    check_model_config(cfg.model)
    check_context_length(cfg.model, cfg.max_new_tokens)
    questions = tuple(load_task(cfg.task))  # the question file: there and well-formed (file and line named)
    method.check_settings(cfg.method_settings, {"model_name": cfg.model.name, "device": cfg.device,
                                                "dtype_name": dtype})
    if cfg.prefix_cache:
        check_prefix_cache(method, cfg.method_settings)
    planned = planned_forward(cfg.compile, cfg.compile_products, device, resolve_dtype(dtype))
    if cfg.cost_curve not in (*NO_CURVE, "auto"):
        check_curve_file(cfg.cost_curve, planned)  # measured on the forward the settings ask for
    # what this machine can build of the planned forward (each step down said in one line, below)
    choice = choose_forward(cfg.compile, cfg.compile_products, device, resolve_dtype(dtype))
    settings = dataclasses.replace(cfg, device=str(device), dtype=dtype,
                                   host_memory=apply_host_memory(cfg.host_memory))
    if cfg.baseline in ("shared", "reuse") and not cfg.timing.allow_mixed and cfg.method["name"] != "ar":
        check_baseline_environment(cfg.baseline, results_dir_for(cfg, "ar"), device)
    torch.manual_seed(cfg.seed)
    plan = RunPlan(settings=settings, device_name=device_name(device), forward=planned,
                   results_dir=str(run_directory(settings)), questions=questions)
    for line in choice.warnings:
        print(line, file=sys.stderr)
    if choice.name == planned:
        return plan
    if cfg.cost_curve not in (*NO_CURVE, "auto"):
        print(f"warning: cost_curve {cfg.cost_curve} was measured on another forward: this run measures "
              "a quick curve on its own", file=sys.stderr)
    return plan.stepped_down(choice.name)


def check_prefix_cache(method: type, settings: dict) -> None:
    """prefix_cache=true, refused for a method that reads the whole prompt's hidden states (EAGLE,
    Medusa) or logits (TR's and SAMD's prefill_update): a turn on a kept prefix computes only its new rows."""
    from specbench.drafter import ReadsHiddenStates, ReadsPromptLogits

    name = getattr(method, "name", method.__name__)
    if issubclass(method, ReadsHiddenStates):
        raise SettingsError(f"prefix_cache=true: method {name} reads the hidden states of every prompt row, "
                            "which a turn on a kept prefix does not compute; set prefix_cache=false")
    if issubclass(method, ReadsPromptLogits) and getattr(method.Settings(**settings), "prefill_update", True):
        raise SettingsError(f"prefix_cache=true: method {name} with prefill_update=true reads the logits of "
                            "every prompt row, which a turn on a kept prefix does not compute; set "
                            "method.prefill_update=false or prefix_cache=false")


def checked_settings(given) -> RunConfig:
    """The settings typed, max_new_tokens resolved, the run's own values checked (run/settings.py)."""
    cfg = run_settings(given)
    max_new = cfg.max_new_tokens if cfg.max_new_tokens is not None else cfg.task.max_new_tokens
    cfg = dataclasses.replace(cfg, max_new_tokens=max_new)
    check_values(cfg)
    if cfg.is_serving and cfg.compile == "auto":  # the compiled forward's static cache holds one request
        print("note: batched runs use the eager forward", file=sys.stderr)
        cfg = dataclasses.replace(cfg, compile="off")
    return cfg
