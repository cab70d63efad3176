"""Non-finite steps: the error policy and the bound on skips in a row stop every rank with one
line naming the step, the model and the rank. (A skipped NaN step and a SIGTERM to one rank are
scenarios of scripts/fault_matrix.py, run by tests/test_faults.py.)"""

from __future__ import annotations

import pytest
from helpers import launch, write_run


def fault_run(tmp_path, options, training=None):
    return write_run(
        tmp_path,
        {"task": "fixture_tasks:Faults", "task_options": options, "training": {"max_steps": 4, **(training or {})}},
    )


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
