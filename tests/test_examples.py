"""The example notebook runs top to bottom (so it never rots) and shows what it claims."""

from pathlib import Path

import nbformat
from nbclient import NotebookClient

NOTEBOOK = Path(__file__).resolve().parent.parent / "examples" / "pre_vs_post_norm.ipynb"


def test_notebook_executes_and_shows_exact_decomposition():
    nb = nbformat.read(NOTEBOOK, as_version=4)
    NotebookClient(nb, timeout=300, kernel_name="python3",
                   resources={"metadata": {"path": str(NOTEBOOK.parent)}}).execute()
    outputs = ["".join(o.get("text", "") + str(o.get("data", {}).get("text/plain", ""))
                       for o in c.get("outputs", [])) for c in nb.cells if c.cell_type == "code"]
    assert "conservation OK" in outputs[2]
    residual = float(outputs[3].split("tensor(")[1].split(")")[0])
    assert residual < 1e-5
    assert "retention, pre : [1. 1. 1. 1. 1. 1. 1.]" in outputs[5]
