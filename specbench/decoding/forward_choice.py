"""Which target forward a run gets (`eager`, `compiled`, `compiled-packed`), and why.

The compiled forwards are speed-ups, never requirements. Each needs something a machine may lack: the
compiled CPU forward a working C++ compiler (inductor generates C++), our packed products an x86-64 CPU
with AVX2 and a kernel that builds against the installed torch. `planned_forward` reads the settings
alone (cheap, for validation and for naming results); `choose_forward` then tries what the plan needs
on this machine and steps down the line, compiled-packed -> compiled -> eager, with one `warning:` line
for each step it takes. A compile that fails later, on the model itself, moves the engine to eager in
the same way (`Engine.new_cache`). The forward a run got is the one its results name.
"""

from __future__ import annotations

import os
import platform
import shutil
import subprocess
from dataclasses import dataclass

import torch

from specbench.decoding import packed_linear
from specbench.errors import SettingsError

COMPILE = ("auto", "on", "off")  # the `compile` setting
PRODUCTS = ("auto", "packed", "inductor")  # the `compile_products` setting


@dataclass(frozen=True)
class ForwardChoice:
    name: str  # eager | compiled | compiled-packed
    warnings: tuple[str, ...] = ()  # one line per accelerator skipped, each saying why

    @property
    def compiled(self) -> bool:
        return self.name != "eager"

    @property
    def products(self) -> str:
        """The compiled forward's products setting that reproduces this choice without trying again."""
        return "packed" if self.name == "compiled-packed" else "inductor"


def wants_compiled(setting: str, device) -> bool:
    """`compile=on`, or `auto` where the compiled forward was measured to pay: an x86 CPU
    (docs/compiled-forward.md) and CUDA, where eager steps wait on the host launching a thousand small
    kernels and CUDA graphs remove that wait (results/gpu/README.md)."""
    if setting in ("on", "off"):
        return setting == "on"
    kind = torch.device(device).type
    return kind == "cuda" or (kind == "cpu" and platform.machine().lower() in ("x86_64", "amd64"))


def planned_forward(compile_setting: str, products: str, device, dtype: torch.dtype) -> str:
    """The forward the settings ask for on this kind of machine, before anything is built: the name a
    cost-curve file is checked against. Raises SettingsError for settings that contradict each other."""
    if compile_setting not in COMPILE:
        raise SettingsError(f"compile must be one of {', '.join(COMPILE)}, got {compile_setting!r}")
    if products not in PRODUCTS:
        raise SettingsError(f"compile_products must be one of {', '.join(PRODUCTS)}, got {products!r}")
    on_cpu = torch.device(device).type == "cpu"
    if products == "packed" and not (on_cpu and dtype == torch.float32):
        raise SettingsError("compile_products=packed needs a float32 model on the CPU; "
                         "use compile_products=auto or inductor")
    if not wants_compiled(compile_setting, device):
        return "eager"
    packed = products != "inductor" and on_cpu and dtype == torch.float32 and packed_linear.available()
    return "compiled-packed" if packed else "compiled"


def compiler_problem() -> str | None:
    """None when the C++ compiler inductor uses (CXX, else g++) runs, else what is wrong and the fix."""
    cxx = os.environ.get("CXX") or "g++"
    path = shutil.which(cxx)
    if path is None:
        return f"no C++ compiler ({cxx} not found; install one, e.g. apt-get install g++, or set CXX)"
    try:
        subprocess.run([path, "--version"], capture_output=True, timeout=60, check=True)
    except (OSError, subprocess.SubprocessError):
        return f"the C++ compiler {cxx} does not run (install a working one, e.g. g++, or set CXX)"
    return None


def choose_forward(compile_setting: str, products: str, device, dtype: torch.dtype) -> ForwardChoice:
    """The forward this machine can run for these settings, building our kernel if the plan uses it
    (once per machine and torch version; cached on disk by torch)."""
    plan = planned_forward(compile_setting, products, device, dtype)
    if plan == "eager":
        return ForwardChoice("eager")
    problem = compiler_problem()  # inductor compiles C++ on the CPU, and Triton's launchers on CUDA
    if problem:
        packed_linear.note_problem_said()  # our kernels need it too: this line says it for them
        return ForwardChoice("eager", (f"warning: {problem}: the compiled forward needs one, so this "
                                       "run uses the eager forward",))
    if plan == "compiled" and products != "inductor" and torch.device(device).type == "cpu" \
            and dtype == torch.float32:  # the kernel was wanted, the CPU cannot run it
        packed_linear.note_problem_said()
        return ForwardChoice("compiled", (f"warning: the packed kernel is unavailable "
                                          f"({packed_linear.build_problem()}): the compiled forward uses "
                                          "inductor's matrix products",))
    if plan == "compiled-packed":
        problem = packed_linear.build_problem()
        if problem:
            packed_linear.note_problem_said()
            return ForwardChoice("compiled", (f"warning: the packed kernel did not build here ({problem}): "
                                              "the compiled forward uses inductor's matrix products",))
    return ForwardChoice(plan)
