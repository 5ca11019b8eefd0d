"""notebooks/results.ipynb runs top to bottom on the results fixture (so it cannot rot)."""

from pathlib import Path

import pytest

import ipykernel  # noqa: F401  (the "notebooks" extra, in "test")
import matplotlib  # noqa: F401

ROOT = Path(__file__).resolve().parents[1]


def test_results_notebook_executes(monkeypatch):
    from scripts.run_notebook import execute_notebook  # what scripts/cpu_sweep.sh runs

    monkeypatch.setenv("SPECBENCH_RESULTS", "")  # restored after the test; execute_notebook sets it
    nb = execute_notebook(ROOT / "notebooks" / "results.ipynb", ROOT / "tests" / "fixtures" / "results",
                          timeout=180)
    outputs = [o for c in nb.cells if c.cell_type == "code" for o in c.outputs]
    assert not [o for o in outputs if o.output_type == "error"]
    text = "".join(str(o.get("data", {}).get("text/markdown", "")) for o in outputs)
    assert "| Method | MT | Translation | Summarization | QA | Math | RAG | MAT | Acc. rate | tokens/s | Overall | 95% CI |" in text
    images = [o for o in outputs if "image/png" in o.get("data", {})]
    assert len(images) >= 9  # 4 plots x 2 temperatures + speedup against temperature
