"""harness.forked, which the numeric rows of other tests use: a forked run is the launcher's run
(the same records and weights, under DDP and FSDP2), with the command's exit status and error
lines, and a worker that outlives its timeout is killed."""

from __future__ import annotations

import time

import pytest
import torch
from helpers import fork_launch, launch, records, write_run
from safetensors.torch import load_file

MEASURED = ("samples_per_s", "steps_per_s", "peak_memory_mb")  # the machine's, not the run's


@pytest.mark.timeout(300)
@pytest.mark.parametrize("accelerate_config", ["8gpu.yaml", "cpu_fsdp.yaml"])
def test_a_forked_run_is_the_launchers_run(tmp_path, accelerate_config):
    outputs = {}
    for name, run in (("launcher", launch), ("forked", fork_launch)):
        config = write_run(tmp_path / name, {"training": {"max_steps": 4, "eval_every": 2, "save_every": 2}})
        result = run(["--config", str(config), "--device", "cpu"], 2, accelerate_config=accelerate_config)
        assert result.returncode == 0, result.stderr[-3000:]
        assert ("FSDP2: the generator in 1 group(s)" in result.stderr) == (accelerate_config == "cpu_fsdp.yaml")
        outputs[name] = tmp_path / name / "out"
    strip = lambda rs: [{k: v for k, v in r.items() if k not in MEASURED} for r in rs]  # noqa: E731
    assert strip(records(outputs["forked"])) == strip(records(outputs["launcher"]))
    assert {r["world_size"] for r in records(outputs["forked"])} == {2}
    for role in ("generator", "discriminator"):
        ours, theirs = (load_file(out / "final" / role / "model.safetensors") for out in outputs.values())
        assert all(torch.equal(ours[key], theirs[key]) for key in theirs)


@pytest.mark.timeout(120)
def test_a_forked_run_exits_with_the_commands_status_and_lines(tmp_path):
    config = write_run(tmp_path, {})
    result = fork_launch(["--config", str(config), "--device", "cpu", "--set", "training.max_steps=0"], 2)
    assert result.returncode == 2
    lines = [line for line in result.stderr.splitlines() if line.startswith("error")]
    assert lines == [f"error (rank {r}): {config}: key 'training.max_steps' must be at least 1" for r in (0, 1)]


@pytest.mark.timeout(120)
def test_a_forked_worker_past_its_timeout_is_killed(tmp_path):
    endless = {"task_options": {"step_sleep_s": 0.05}, "training": {"max_steps": 100000}}
    config = write_run(tmp_path, {"task": "harness.faultmatrix.inject:Faults", **endless})
    began = time.monotonic()
    result = fork_launch(["--config", str(config), "--device", "cpu"], 2, timeout=8)
    assert result.returncode == -9 and time.monotonic() - began < 30
