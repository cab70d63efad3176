"""Non-finite steps: the error policy and the bound on skips in a row stop every rank with one
line naming the step, the model and the rank. (A skipped NaN step and a SIGTERM to one rank are
scenarios of scripts/fault_matrix.py, run by tests/test_faults.py.)"""

from __future__ import annotations

import math

import pytest
import torch
from helpers import check, fork_launch, launch, records, write_run

from trainer.training.phases import gradients_finite


def fault_run(tmp_path, options, training=None):
    return write_run(
        tmp_path,
        {
            "task": "harness.faultmatrix.inject:Faults",
            "task_options": options,
            "training": {"max_steps": 4, **(training or {})},
        },
    )


@pytest.mark.timeout(300)
def test_nonfinite_error_policy_names_step_model_and_rank(tmp_path):
    # Step 2 is not a log step: the decision comes from the per-tensor sums, not from a norm
    # (the skip scenarios of the fault matrix log every step and take the norm's path).
    config = fault_run(
        tmp_path,
        {"nan_rank": 1, "nan_first_call": 2, "nan_last_call": 2},
        {"nonfinite": "error", "log_every": 4},
    )
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


@pytest.mark.timeout(300)
def test_max_time_stops_every_rank_at_one_step_with_a_checkpoint(tmp_path):
    config = fault_run(
        tmp_path,
        {"step_sleep_s": 0.02},
        {"max_steps": 100_000, "max_time": 2, "log_every": 10_000, "save_every": 10_000, "eval_every": 10_000},
    )
    result = check(launch(["--config", str(config), "--device", "cpu"], 2))
    assert "stopped by training.max_time" in result.stdout, result.stdout[-2000:]
    out = tmp_path / "out"
    saved = sorted(p.name for p in (out / "checkpoints").iterdir())
    assert len(saved) == 1 and saved[0].startswith("step-"), saved  # one step, no partial write
    assert not (out / "final").exists()
    stopped_at = int(saved[0].split("-")[1])
    assert 0 < stopped_at < 100_000
    # --resume latest continues from it to the end (no time bound now)
    more = ["--set", f"training.max_steps={stopped_at + 2}", "--set", "training.max_time=0"]
    check(fork_launch(["--config", str(config), "--device", "cpu", "--resume", "latest", *more], 2))  # harness.forked
    assert (out / "final").is_dir() and records(out, "eval")[-1]["step"] == stopped_at + 2


def test_gradients_finite_sees_every_kind_of_non_finite_gradient():
    params = [torch.nn.Parameter(torch.zeros(3)), torch.nn.Parameter(torch.zeros(2, 2))]
    for p in params:
        p.grad = torch.ones_like(p)
    assert gradients_finite(params)
    for bad in (math.nan, math.inf, -math.inf):
        params[1].grad[1, 0] = bad
        assert not gradients_finite(params), bad
    params[0].grad[0], params[1].grad[1, 0] = math.inf, -math.inf  # infinities that cancel in a sum
    assert not gradients_finite(params)
    # a finite loss with a non-finite gradient: d sqrt(x) / dx at 0
    x = torch.nn.Parameter(torch.zeros(1))
    loss = torch.sqrt(x).sum()
    loss.backward()
    assert math.isfinite(loss.item()) and not gradients_finite([x])
