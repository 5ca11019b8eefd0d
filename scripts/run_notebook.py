"""Execute a results notebook on a results directory and save it with its outputs.

    python scripts/run_notebook.py notebooks/results.ipynb --results results/cpu --out results/cpu/results.ipynb
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

import nbclient
import nbformat


def execute_notebook(notebook: str | Path, results: str | Path, timeout: int = 600):
    """The notebook, run top to bottom in its own folder with SPECBENCH_RESULTS=results."""
    nb_path = Path(notebook).resolve()
    os.environ["SPECBENCH_RESULTS"] = str(Path(results).resolve())
    nb = nbformat.read(nb_path, as_version=4)
    nbclient.NotebookClient(nb, timeout=timeout, kernel_name="python3",
                            resources={"metadata": {"path": str(nb_path.parent)}}).execute()
    return nb


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("notebook")
    ap.add_argument("--results", required=True, help="results root the notebook reads (SPECBENCH_RESULTS)")
    ap.add_argument("--out", required=True, help="where the executed notebook goes")
    ap.add_argument("--timeout", type=int, default=600, help="seconds per cell")
    args = ap.parse_args(argv)
    nb = execute_notebook(args.notebook, args.results, args.timeout)
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    nbformat.write(nb, args.out)
    print(f"executed {Path(args.notebook).name} on {args.results}: {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
