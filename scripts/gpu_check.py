"""The prepared command for a GPU node without network (specbench/tools/gpu_node/; docs/gpu.md):
stages with their own time budgets, each stage's failure logged and the next stage run anyway,
everything packed into one archive and a short summary under the output folder, a table printed last.

    python scripts/gpu_pack.py                       # here: wheels, questions, weights in parts; the call plan
    python3 scripts/gpu_check.py stage               # on the node, a call that only brings weight parts
    python3 scripts/gpu_check.py run --out "$OUT"    # on the node, the last call: every stage
    python3 scripts/gpu_check.py run --out DIR --cpu # the rehearsal: CPU stand-ins, small shapes

The node runs this with its own Python (torch, transformers) from the checkout as it is: specbench is
not installed there, and hydra, omegaconf and gguf come as carried wheels that the probe installs into
a private folder. So this file puts the checkout first on the path, and imports hydra and the runner
only inside the function that runs a method.
"""

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # this checkout's specbench, installed or not

from specbench.tools.gpu_node.driver import main  # noqa: E402


def run_settings(overrides: list[str]) -> tuple[dict, int, str]:
    """One run through the runner, as `python run.py <overrides>` makes it: its summary, its exit code
    and the lossless check's verdict line. The real-model stages call it once per method, in their
    own process (tools/ may not import run/ or main.py itself)."""
    from hydra import compose, initialize_config_dir
    from omegaconf import OmegaConf

    from specbench.main import main_exit_code, run_benchmark
    from specbench.run.lossless import verdict_line

    with initialize_config_dir(config_dir=str(ROOT / "conf"), version_base=None):
        given = OmegaConf.to_container(compose("config", overrides=overrides), resolve=True)
    summary = run_benchmark(given)
    return summary, main_exit_code(summary, given), verdict_line(summary["lossless"])


if __name__ == "__main__":
    sys.exit(main(doc=__doc__, runner=run_settings))
