"""The installed libraries against the ranges this project is tested with (pyproject.toml), checked
before a run loads anything: an older torch fails in ways far from its cause (a kernel that does not
build, a missing cache API), so it is refused up front in one line that names the fix.

The range is read from the checkout's own pyproject.toml when there is one (a cluster node that runs
the checkout as it is, never pip-installed), else from the installed package's metadata: the same
floor either way."""

from __future__ import annotations

from importlib import metadata
from pathlib import Path

from packaging.requirements import Requirement
from packaging.version import Version

from specbench.errors import SpecbenchError

PYPROJECT = Path(__file__).resolve().parents[1] / "pyproject.toml"
CHECKED = ("torch", "transformers")


class EnvironmentProblem(SpecbenchError):
    """An installed library outside the supported range."""


def declared_requirements() -> list[str]:
    """specbench's dependency lines: the checkout's pyproject.toml, else the installed metadata."""
    if PYPROJECT.is_file():
        try:
            import tomllib
        except ImportError:  # Python 3.10
            tomllib = None
        if tomllib is not None:
            return list(tomllib.loads(PYPROJECT.read_text())["project"]["dependencies"])
    try:
        return list(metadata.requires("specbench") or [])
    except metadata.PackageNotFoundError:
        return []


def declared_minimum(package: str) -> Version | None:
    """The lowest version of `package` that specbench declares (None when it declares no lower bound)."""
    for line in declared_requirements():
        req = Requirement(line)
        if req.name == package and not req.marker:
            lows = [Version(s.version) for s in req.specifier if s.operator in (">=", "==", "~=")]
            return max(lows) if lows else None
    return None


def check_version(package: str, installed: str | None = None) -> None:
    """Refuse an installed `package` older than the declared floor, naming both and the fix."""
    if installed is None:
        try:
            installed = metadata.version(package)
        except metadata.PackageNotFoundError:
            return  # the import that needs it fails with its own message
    version = Version(installed.split("+")[0])
    low = declared_minimum(package)
    if low is not None and version < low:
        raise EnvironmentProblem(f"{package} {version} is older than the oldest supported, {low}; install a "
                                 f"newer one: pip install -U '{package}>={low}' (offline: the site's module or "
                                 f"a wheel of {package} >= {low})")


def check_torch_version(installed: str | None = None) -> None:
    import torch

    check_version("torch", installed or torch.__version__)


def check_environment() -> None:
    """Every checked library against its declared floor (before a run loads anything)."""
    check_torch_version()
    check_version("transformers")
