"""The own-task example of docs/own-task.md runs as written, in 2 processes."""

from __future__ import annotations

import re

import pytest
import yaml
from helpers import ROOT, check, launch, records


def page_blocks() -> dict[str, str]:
    text = (ROOT / "docs" / "own-task.md").read_text()
    found = re.findall(r"<!-- example: (\S+) -->\n```\w+\n(.*?)```", text, flags=re.S)
    return dict(found)


@pytest.mark.timeout(300)
def test_the_own_task_page_s_example_runs_in_two_processes(tmp_path, monkeypatch):
    blocks = page_blocks()
    assert set(blocks) == {"my_tasks.py", "two_peaks.yaml", "width.yaml"}
    for name, text in blocks.items():
        (tmp_path / name).write_text(text)
    config = yaml.safe_load(blocks["two_peaks.yaml"])
    config["output_dir"] = str(tmp_path / "out")
    config["model"] = {k: str(tmp_path / v) for k, v in config["model"].items()}
    (tmp_path / "two_peaks.yaml").write_text(yaml.safe_dump(config))
    monkeypatch.setenv("PYTHONPATH", str(tmp_path))
    check(launch(["--config", str(tmp_path / "two_peaks.yaml"), "--device", "cpu"], 2))
    evals = records(tmp_path / "out", "eval")
    assert [r["step"] for r in evals] == [100, 200, 300]
    assert all(r["num_samples"] == 1000 and r["world_size"] == 2 for r in evals)
    assert (tmp_path / "out" / "best" / "generator" / "model.safetensors").is_file()

    # the options' own check: one line naming the file and the key, exit status 2, no run
    bad = launch(["--config", str(tmp_path / "two_peaks.yaml"), "--device", "cpu",
                  "--set", "task_options.std=0", "--output-dir", str(tmp_path / "bad")], 1)  # fmt: skip
    assert bad.returncode == 2, bad.stderr
    errors = [line for line in bad.stderr.splitlines() if line.startswith("error")]
    assert errors == [f"error (rank 0): {tmp_path / 'two_peaks.yaml'}: key 'task_options.std' must be positive"]
    assert not (tmp_path / "bad").exists()
