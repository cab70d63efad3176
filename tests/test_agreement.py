"""Rank-local trouble (a NaN on one rank, a signal to one rank) is agreed: every rank acts alike."""

from __future__ import annotations

import os
import signal
import subprocess
import time

import pytest
import torch
from helpers import ROOT, check, env, launch, launch_command, records, write_run
from safetensors.torch import load_file


def fault_run(tmp_path, options, training=None):
    return write_run(
        tmp_path,
        {"task": "fixture_tasks:Faults", "task_options": options, "training": {"max_steps": 4, **(training or {})}},
    )


@pytest.mark.timeout(300)
def test_nan_on_one_rank_skips_the_step_on_every_rank(tmp_path):
    config = fault_run(tmp_path, {"nan_rank": 1, "nan_first_call": 2, "nan_last_call": 2})
    check(launch(["--config", str(config), "--device", "cpu"], 2))
    train = records(tmp_path / "out", "train")
    assert [r["skipped_d"] for r in train] == [0, 1, 1, 1]
    assert [r["skipped_g"] for r in train] == [0, 0, 0, 0]
    assert train[1]["d_steps"] == 2  # the skipped step still counts as a step of the schedule
    for record in records(tmp_path / "out", "eval"):
        assert record["checksum_finite"] and record["checksum_spread"] == 0.0  # ranks agree bit for bit
    for role in ("generator", "discriminator"):
        weights = load_file(tmp_path / "out" / "final" / role / "model.safetensors")
        assert all(torch.isfinite(w).all() for w in weights.values())


@pytest.mark.timeout(300)
def test_nonfinite_error_policy_names_step_model_and_rank(tmp_path):
    config = fault_run(tmp_path, {"nan_rank": 1, "nan_first_call": 2, "nan_last_call": 2}, {"nonfinite": "error"})
    result = launch(["--config", str(config), "--device", "cpu"], 2)
    assert result.returncode != 0
    expected = "step 2: non-finite discriminator gradients with training.nonfinite=error; non-finite loss on rank(s) 1"
    for rank in (0, 1):
        assert f"error (rank {rank}): {expected}" in result.stderr, result.stderr[-3000:]


@pytest.mark.timeout(300)
def test_too_many_skips_in_a_row_stop_every_rank(tmp_path):
    config = fault_run(
        tmp_path,
        {"nan_rank": 0, "nan_first_call": 2, "nan_last_call": 99},
        {"max_steps": 20, "max_consecutive_skips": 3},
    )
    result = launch(["--config", str(config), "--device", "cpu"], 2)
    assert result.returncode != 0
    expected = (
        "step 4: 3 discriminator steps in a row skipped (training.max_consecutive_skips); non-finite loss on rank(s) 0"
    )
    for rank in (0, 1):
        assert f"error (rank {rank}): {expected}" in result.stderr, result.stderr[-3000:]


@pytest.mark.timeout(400)
def test_sigterm_to_one_rank_saves_everywhere_and_resumes_exactly(tmp_path):
    steps = 300
    pids = tmp_path / "pids"
    pids.mkdir()
    config = fault_run(
        tmp_path,
        {"pid_dir": str(pids), "step_sleep_s": 0.01},
        {"max_steps": steps, "save_every": 1000, "eval_every": 1000, "log_every": 50},
    )
    base = ["--config", str(config), "--device", "cpu"]
    check(launch([*base, "--output-dir", str(tmp_path / "whole")], 2))

    out = tmp_path / "stopped"
    for old in pids.iterdir():
        old.unlink()
    proc = subprocess.Popen(
        launch_command([*base, "--output-dir", str(out)], 2),
        cwd=ROOT,
        env=env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        deadline = time.monotonic() + 120
        while not (pids / "rank1.pid").exists() and time.monotonic() < deadline and proc.poll() is None:
            time.sleep(0.1)
        time.sleep(0.5)
        os.kill(int((pids / "rank1.pid").read_text()), signal.SIGTERM)
        stdout, stderr = proc.communicate(timeout=120)
    finally:
        proc.kill()
    assert proc.returncode == 0, stderr[-3000:]
    assert "stopped by a stop signal after saving a checkpoint" in stdout
    saved = sorted((out / "checkpoints").glob("step-*"))
    assert len(saved) == 1 and 0 < int(saved[0].name[5:]) < steps
    assert not (out / "final").exists()

    check(launch([*base, "--output-dir", str(out), "--resume", "latest"], 2))
    for role in ("generator", "discriminator"):
        resumed = load_file(out / "final" / role / "model.safetensors")
        whole = load_file(tmp_path / "whole" / "final" / role / "model.safetensors")
        assert all(torch.equal(resumed[k], whole[k]) for k in whole), role
