"""The own-task example (examples/own_task/, which docs/own-task.md shows) runs as written, in 2
processes."""

from __future__ import annotations

import pytest
from helpers import ROOT, check, launch, records

EXAMPLE = ROOT / "examples" / "own_task"


def test_the_own_task_page_shows_the_example_s_files():
    page = (ROOT / "docs" / "own-task.md").read_text()
    files = sorted(p.name for p in EXAMPLE.iterdir() if p.is_file())
    assert files == ["my_tasks.py", "two_peaks.yaml", "width.yaml"]
    for name in files:  # included by the site's snippets, not copied
        assert f'--8<-- "examples/own_task/{name}"' in page


@pytest.mark.timeout(300)
def test_the_own_task_example_runs_in_two_processes(tmp_path, monkeypatch):
    config = EXAMPLE / "two_peaks.yaml"
    monkeypatch.setenv("PYTHONPATH", str(EXAMPLE))
    out = tmp_path / "out"
    check(launch(["--config", str(config), "--device", "cpu", "--output-dir", str(out)], 2))
    evals = records(out, "eval")
    assert [r["step"] for r in evals] == [100, 200, 300]
    assert all(r["num_samples"] == 1000 and r["world_size"] == 2 for r in evals)
    assert (out / "best" / "generator" / "model.safetensors").is_file()

    # the options' own check: one line naming the file and the key, exit status 2, no run
    bad = launch(["--config", str(config), "--device", "cpu",
                  "--set", "task_options.std=0", "--output-dir", str(tmp_path / "bad")], 1)  # fmt: skip
    assert bad.returncode == 2, bad.stderr
    errors = [line for line in bad.stderr.splitlines() if line.startswith("error")]
    assert errors == [f"error (rank 0): {config}: key 'task_options.std' must be positive"]
    assert not (tmp_path / "bad").exists()
