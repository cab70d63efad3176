"""Edges of stopping and of the best checkpoint."""

from __future__ import annotations

import json
import math

import pytest
from helpers import check, launch, records, write_run

from trainer.training.outputs import improves


@pytest.mark.timeout(120)
def test_a_stop_at_the_last_step_still_runs_the_final_eval_and_export(tmp_path):
    # SIGTERM during step 3 is agreed at the start of step 4, the last one.
    config = write_run(
        tmp_path,
        {
            "task": "harness.faultmatrix.inject:Faults",
            "task_options": {"sigterm_call": 3},
            "training": {"eval_every": 100},
        },
    )
    result = check(launch(["--config", str(config), "--device", "cpu"], 1))
    out = tmp_path / "out"
    assert [r["step"] for r in records(out, "eval")] == [4]
    assert (out / "final" / "generator" / "model.safetensors").is_file()
    assert json.loads(result.stdout.strip().splitlines()[-1])["final_eval"]["num_samples"] == 10

    # Resuming the finished run trains nothing and still answers with the final eval's metrics.
    again = check(launch(["--config", str(config), "--device", "cpu", "--resume", "latest"], 1))
    assert json.loads(again.stdout.strip().splitlines()[-1])["final_eval"]["num_samples"] == 10
    assert [r["step"] for r in records(out, "eval")] == [4]


def test_a_non_finite_eval_never_becomes_the_best():
    assert not improves(math.nan, None, "min")
    assert not improves(math.inf, None, "max")
    assert improves(2.0, None, "min")
    assert improves(1.0, 2.0, "min") and not improves(3.0, 2.0, "min")
    assert improves(3.0, 2.0, "max") and not improves(math.nan, 2.0, "max")
