"""The installed libraries against the ranges this project is tested with (pyproject.toml), checked
before a run loads anything: an older torch fails in ways far from its cause (a kernel that does not
build, a missing cache API), so it is refused up front in one line that names the fix."""

from __future__ import annotations

from importlib import metadata

from packaging.requirements import Requirement
from packaging.version import Version

from specbench.errors import SpecbenchError


class EnvironmentProblem(SpecbenchError):
    """An installed library outside the supported range."""


def declared_minimum(package: str) -> Version | None:
    """The lowest version of `package` that specbench's installed metadata declares (None when
    specbench runs from a checkout that was never installed, or declares no lower bound)."""
    try:
        requirements = metadata.requires("specbench") or []
    except metadata.PackageNotFoundError:
        return None
    for line in requirements:
        req = Requirement(line)
        if req.name == package and not req.marker:
            lows = [Version(s.version) for s in req.specifier if s.operator in (">=", "==", "~=")]
            return max(lows) if lows else None
    return None


def check_torch_version(installed: str | None = None) -> None:
    import torch

    version = Version((installed or torch.__version__).split("+")[0])
    low = declared_minimum("torch")
    if low is not None and version < low:
        raise EnvironmentProblem(f"torch {version} is older than the oldest supported, {low}; upgrade it: "
                                 f"pip install -U 'torch>={low}'")
