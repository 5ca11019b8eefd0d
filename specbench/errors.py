"""The user errors of specbench: run.py prints any of them as one `error: ...` line and exits 2.

Each message names the problem and the fix. Anything else that escapes a run is a bug and keeps
its traceback. The built-in bases keep older `except ValueError` / `except FileNotFoundError`
callers working.
"""


class SpecbenchError(Exception):
    """Base of every user error (bad settings, missing or corrupt inputs, a model that cannot load)."""


class SettingsError(SpecbenchError, ValueError):
    """A setting, or the file it names, that cannot work."""


class MissingFileError(SettingsError, FileNotFoundError):
    """A file or directory that a setting names is not there."""


class ModelLoadError(SpecbenchError, RuntimeError):
    """Model weights that cannot be fetched or read."""


class RunLockedError(SpecbenchError, RuntimeError):
    """A results directory that another run (named with its pid, host and start time) is writing."""


class ResultsFileError(SpecbenchError, OSError):
    """A results file or folder that cannot be written or read back (read-only, full disk, corrupt JSON)."""


class InputError(SettingsError):
    """Input the run cannot use as given: duplicate question ids, empty turns, a context too short."""
