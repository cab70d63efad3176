"""An error on some ranks stops every rank promptly, each with one line (or, on the failing
rank, its traceback), in 2 processes through the real launcher."""

from __future__ import annotations

import time

import pytest
from helpers import launch, write_run
from safetensors.torch import save_file

from trainer.tasks.gaussian_mixture import mlp

FAILURES = {
    # name: (task options, failing rank)
    "data cache write on the main process": ({"raise_in": "train_dataset", "raise_error": "OSError"}, 0),
    "on_eval on the main process": ({"raise_in": "on_eval"}, 0),
    "out of memory in generate on rank 1": (
        {"raise_in": "generate", "raise_rank": 1, "raise_call": 3, "raise_error": "OutOfMemoryError"},
        1,
    ),
    "resolved config write": ({}, 0),
    "checkpoint rename": ({}, 0),
}


def error_lines(stderr: str) -> list[str]:
    return [line for line in stderr.splitlines() if line.startswith("error (rank")]


def faulty_run(tmp_path, options):
    config = write_run(
        tmp_path,
        {
            "task": "harness.faultmatrix.inject:Faults",
            "task_options": options,
            "training": {"max_steps": 6, "save_every": 3, "eval_every": 3},
            "distributed": {"watchdog_s": 60},
        },
    )
    return ["--config", str(config), "--device", "cpu"]


@pytest.mark.timeout(120)
@pytest.mark.parametrize("name", list(FAILURES))
def test_an_error_on_one_rank_stops_every_rank_with_one_line(tmp_path, name):
    options, failing = FAILURES[name]
    args = faulty_run(tmp_path, options)
    out = tmp_path / "out"
    if name == "resolved config write":
        (out / "config.yaml").mkdir(parents=True)  # the main process cannot write the file
    if name == "checkpoint rename":
        (out / "checkpoints").mkdir(parents=True)
        (out / "checkpoints" / "step-0000003").write_text("in the way")  # the rename target is a file
    start = time.monotonic()
    result = launch(args, 2, timeout=100)
    elapsed = time.monotonic() - start
    assert result.returncode != 0
    lines = error_lines(result.stderr)
    other = 1 - failing
    assert any(line.startswith(f"error (rank {other}): rank {failing} failed in ") for line in lines), (
        lines,
        result.stderr[-4000:],
    )
    assert not any(line.startswith(f"error (rank {failing})") for line in lines), lines
    assert f"[rank{failing}]: Traceback" in result.stderr
    assert f"[rank{other}]: Traceback" not in result.stderr, result.stderr[-4000:]
    assert elapsed < 60


@pytest.mark.timeout(120)
def test_init_weights_of_another_shape_are_one_line_on_every_rank(tmp_path):
    weights = tmp_path / "wide.safetensors"
    save_file(mlp(2, 32, 2, 1).state_dict(), str(weights))
    config = write_run(tmp_path, {"init": {"discriminator": str(weights)}})
    result = launch(["--config", str(config), "--device", "cpu"], 2)
    assert result.returncode != 0
    lines = error_lines(result.stderr)
    assert {line.split(")")[0] for line in lines} == {"error (rank 0", "error (rank 1"}, result.stderr[-3000:]
    assert any("wide.safetensors: discriminator weights do not fit the model: size mismatch" in x for x in lines)
    assert "]: Traceback" not in result.stderr  # no rank's traceback (the launcher prints its own)


@pytest.mark.timeout(200)
def test_the_others_wait_for_the_main_process_s_writes_with_the_long_work_bound(tmp_path):
    # Each rename on the main process takes twice the stall bound: the other ranks wait for it
    # under the long-work allowance, not in the next step's all-reduce under the short bound.
    config = write_run(
        tmp_path,
        {
            "task": "harness.faultmatrix.inject:Faults",
            "task_options": {"slow_rename_s": 3},
            "training": {"max_steps": 4, "save_every": 2, "eval_every": 2, "best_metric": "reverse_kl"},
            "distributed": {"watchdog_s": 1.5},
        },
    )
    result = launch(["--config", str(config), "--device", "cpu"], 2, timeout=180)
    assert result.returncode == 0, result.stderr[-4000:]
    assert not list((tmp_path / "out").glob("stall-rank*.txt"))


CONTRACT_BREAKS = {
    "loss_part": "loss parts",
    "eval_key": "eval outputs",
    "eval_rank": "eval outputs",
}


@pytest.mark.timeout(120)
@pytest.mark.parametrize("uneven", list(CONTRACT_BREAKS))
def test_a_task_that_differs_between_ranks_is_named_on_every_rank(tmp_path, uneven):
    """A task whose loss parts or eval outputs differ between ranks would send the ranks into
    different collectives (a mismatched reduce or gather); every rank stops with one line
    naming what differs and on which rank, exit 2."""
    args = faulty_run(tmp_path, {"uneven": uneven})
    result = launch(args, 2, timeout=100)
    # the launcher exits 1 whatever its workers' statuses; it names the first one to end
    assert result.returncode != 0 and "(exitcode: 2)" in result.stderr, result.stderr[-3000:]
    lines = error_lines(result.stderr)
    assert len(lines) == 2 and {line.split(")")[0] for line in lines} == {"error (rank 0", "error (rank 1"}
    for line in lines:
        assert f"Faults returns different {CONTRACT_BREAKS[uneven]} on different ranks" in line, line
        assert "rank 1:" in line and ("extra" in line or "2 dims" in line), line
    assert "]: Traceback" not in result.stderr  # no worker traceback (the launcher prints its own)


def fit_in_process(config: str) -> None:
    from trainer.contract.config import load_config
    from trainer.training.loop import Trainer

    Trainer(load_config(config), device="cpu").fit()


@pytest.mark.timeout(120)
def test_an_error_on_one_rank_ends_a_run_under_accelerates_debug_launcher(tmp_path):
    # debug_launcher forms the group on a file, with MASTER_PORT pointing at no server: the
    # ranks' notice board must use that file (a TCP client waited there until its timeout)
    from accelerate import debug_launcher

    options = {"raise_in": "generate", "raise_rank": 1, "raise_call": 3, "raise_error": "OutOfMemoryError"}
    config = faulty_run(tmp_path, options)[1]
    start = time.monotonic()
    with pytest.raises(Exception, match="OutOfMemoryError: injected in generate on rank 1"):
        debug_launcher(fit_in_process, (config,), num_processes=2)
    assert time.monotonic() - start < 60
