"""examples/quickstart.ipynb runs headless from the first cell to the last."""

from __future__ import annotations

import pytest
from helpers import ROOT

NOTEBOOK = ROOT / "examples" / "quickstart.ipynb"


@pytest.mark.timeout(600)
def test_quickstart_notebook_runs(tmp_path, monkeypatch):
    nbformat = pytest.importorskip("nbformat")
    nbclient = pytest.importorskip("nbclient")
    notebook = nbformat.read(NOTEBOOK, as_version=4)
    # Run in a copy of the repository's layout: outputs go under tmp_path, not the checkout.
    (tmp_path / "configs").symlink_to(ROOT / "configs")
    (tmp_path / "scripts").symlink_to(ROOT / "scripts")
    monkeypatch.setenv("PYTHONPATH", str(ROOT))  # the kernel imports this checkout's package
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    client = nbclient.NotebookClient(
        notebook, timeout=540, kernel_name="python3", resources={"metadata": {"path": str(tmp_path)}}
    )
    client.execute()

    outputs = [output for cell in notebook.cells if cell.cell_type == "code" for output in cell.outputs]
    assert not [o for o in outputs if o.output_type == "error"]
    images = [o for o in outputs if "image/png" in o.get("data", {})]
    assert len(images) == 2  # the samples and the metric curves
    fit_result = notebook.cells[3].outputs[-1]["data"]["text/plain"]
    assert "'modes'" in fit_result
    # the trainer's log lines show in the notebook, as on the command line
    printed = "".join(o.get("text", "") for o in notebook.cells[3].outputs if o.output_type == "stream")
    assert "eval at step 1500" in printed, printed[-2000:]
    launched = notebook.cells[-1].outputs[-1]["data"]["text/plain"]
    assert "'world_size': 2" in launched and "'num_samples': 2500" in launched
    assert (tmp_path / "outputs" / "quickstart" / "final" / "generator" / "model.safetensors").is_file()
