"""Pack what a GPU node without network needs beside the checkout, and plan the calls that carry it
(specbench/tools/gpu_node/pack.py; docs/gpu.md).

    python scripts/gpu_pack.py            # writes .gpu/call1 .. .gpu/callN and prints the plan
    python scripts/gpu_pack.py --json     # the plan as JSON (the rehearsal reads it)
"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # this checkout's specbench, installed or not

from specbench.tools.gpu_node.pack import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main(doc=__doc__))
