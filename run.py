"""Entry point: python run.py method=tr model=smollm2-135m task=mini

Any setting in conf/ can be overridden on the command line; -m sweeps over comma lists. A user error
(a bad setting, a missing or malformed input) is refused before anything is loaded, with one
`error: ...` line naming the problem and the fix, and exit code 2.
"""

import re
import sys
from pathlib import Path

import hydra
from omegaconf import DictConfig, OmegaConf

from specbench.main import main_exit_code, run_benchmark
from specbench.errors import SettingsError, SpecbenchError

CONF = Path(__file__).resolve().parent / "conf"


def check_group_options(args: list[str]) -> None:
    """Refuse a `method=` that is not registered, or a `model=` or `task=` option that conf/ lacks, listing
    the valid ones (Hydra would refuse it too, over several lines and with exit code 1)."""
    from specbench.registry import available_methods

    for arg in args:
        m = re.fullmatch(r"(method|model|task)=([\w.-]+(?:,[\w.-]+)*)", arg)
        if m:
            group, names = m.groups()
            valid = available_methods() if group == "method" else sorted(p.stem for p in (CONF / group).glob("*.yaml"))
            where = "specbench/methods/" if group == "method" else f"conf/{group}/"
            for name in names.split(","):
                if name not in valid:
                    raise SettingsError(f"unknown {group} '{name}'. Valid: {', '.join(valid)} ({where})")


def check_overrides(args: list[str]) -> None:
    """Compose the config as Hydra will, for every value a sweep gives each setting, and refuse a
    misspelt setting or a value of the wrong type in one line (Hydra refuses them too, over several
    lines). The typed schemas are specbench/config.py and each method's Settings."""
    import itertools

    from hydra import compose, initialize_config_dir
    from hydra.core.override_parser.overrides_parser import OverridesParser

    import specbench.run.schemas  # noqa: F401  (registers the schemas)

    lines = [a for a in args if "=" in a and not a.startswith(("-", "hydra", "+hydra"))]
    parsed = OverridesParser.create().parse_overrides(lines)
    values = [[f"{o.get_key_element()}={v}" for v in o.sweep_string_iterator()] if o.is_sweep_override()
              else [o.input_line] for o in parsed]
    groups = [v for o, v in zip(parsed, values) if o.key_or_group in ("method", "model", "task")]
    others = [v for o, v in zip(parsed, values) if o.key_or_group not in ("method", "model", "task")]
    with initialize_config_dir(config_dir=str(CONF), version_base=None):
        for combo in itertools.product(*groups):
            firsts = [v[0] for v in others]
            tries = [firsts] + [firsts[:i] + [alt] + firsts[i + 1:] for i, v in enumerate(others) for alt in v[1:]]
            for tried in tries:
                try:
                    compose("config", overrides=[*combo, *tried])
                except Exception as e:
                    raise SettingsError(_override_problem(e, list(combo), tried)) from None


def _override_problem(e: Exception, groups: list[str], tried: list[str]) -> str:
    """One line from Hydra's composition error: the setting, what is wrong, the valid names."""
    from hydra import compose
    from omegaconf import DictConfig, OmegaConf

    cause = e.__cause__ or e
    detail = str(cause).splitlines()[0] if str(cause) else type(cause).__name__
    m = re.match(r"Could not override '([^']+)'", str(e))
    if not m:  # a value that does not fit its type
        m = re.match(r"Error merging override (\S+)", str(e))
        return f"{m.group(1) if m else ' '.join(tried)}: {detail}"
    key = m.group(1)
    parent, _, leaf = key.rpartition(".")
    base = compose("config", overrides=groups)
    node = OmegaConf.select(base, parent) if parent else base
    valid = sorted(k for k in node.keys() if k != "name") if isinstance(node, DictConfig) else []
    where = f"method {base.method.name}" if parent == "method" else (parent or "the run")
    return f"unknown setting '{key}': {where} has no setting '{leaf}'; its settings are {', '.join(valid)}"


def refuse(e: SpecbenchError) -> int:
    print(f"error: {e}", file=sys.stderr)
    return 2


def run_config(cfg: DictConfig, hold_until_exit: bool = False) -> int:
    """One run of a composed config; its exit code (2 for a user error, printed as `error: ...`).
    `hold_until_exit`: the device's timing lock held until the process ends (specbench/main.py)."""
    plain = OmegaConf.to_container(cfg, resolve=True)
    try:
        summary = run_benchmark(plain, hold_until_exit)
    except SpecbenchError as e:
        return refuse(e)
    return main_exit_code(summary, plain)


# Each job's exit code. A job returns its code instead of raising SystemExit, which would end a
# Hydra multirun at the first method that fails and lose the rest; the process exits with the worst.
EXIT_CODES: list[int] = []


@hydra.main(config_path="conf", config_name="config", version_base=None)
def main(cfg: DictConfig) -> int:
    code = run_config(cfg, hold_until_exit=True)
    EXIT_CODES.append(code)
    return code


if __name__ == "__main__":
    try:
        check_group_options(sys.argv[1:])
        check_overrides(sys.argv[1:])
    except SpecbenchError as e:
        sys.exit(refuse(e))
    main()
    sys.exit(max(EXIT_CODES, default=0))
