"""docs/notebooks/check_assumptions.ipynb runs top to bottom on CPU, in this interpreter."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
NOTEBOOK = ROOT / "docs" / "notebooks" / "check_assumptions.ipynb"


def test_notebook_executes(tmp_path, monkeypatch):
    nbformat = pytest.importorskip("nbformat")
    nbclient = pytest.importorskip("nbclient")
    monkeypatch.setenv("DELAYLAB_CACHE", str(tmp_path / "cache"))  # the corpus cache, not ~/.cache
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    nb = nbformat.read(NOTEBOOK, as_version=4)
    nb.cells.append(nbformat.v4.new_code_cell("import sys; print(sys.executable)"))
    # jupyter_client starts kernel specs whose argv[0] is "python" with sys.executable
    client = nbclient.NotebookClient(nb, kernel_name="python3", timeout=240,
                                     resources={"metadata": {"path": str(ROOT)}})
    client.execute()  # raises CellExecutionError on any failing cell
    outputs = [o for c in nb.cells if c.cell_type == "code" for o in c.get("outputs", [])]
    text = "".join(o.get("text", "") for o in outputs if o.get("output_type") == "stream")
    assert Path(text.strip().splitlines()[-1]).resolve() == Path(sys.executable).resolve()
    assert "Adam beta1=0.9: stable eta*lambda < 38 (sync), < 1 (delay 1)" in text
    assert "L     exact 64.000" in text and "(lower," in text and "curvature" in text
    assert "weights unchanged by the estimation: True" in text
    assert "refused: sgdm-delayed needs L, G0 and rho in the euclidean norm" in text
    assert any("image/png" in o.get("data", {}) for o in outputs)
