"""Start-up safety: legacy checkpoints, the watchdog, the doctor, shared devices."""

from __future__ import annotations

import subprocess
import sys
import time

import pytest
import torch
from helpers import ROOT, TESTS, check, env, launch, write_run
from safetensors.torch import load_file

from trainer.contract.errors import CheckpointError
from trainer.distributed.watchdog import Heartbeat
from trainer.distributed.world import shared_devices
from trainer.state.weights import read_legacy_state_dict
from trainer.tasks.gaussian_mixture import mlp

CONVERT = ROOT / "scripts" / "convert_checkpoint.py"
DOCTOR = ROOT / "scripts" / "doctor.py"


class NeedsCode:
    """Pickled as a reference to this class: loading it needs code execution."""


def test_convert_a_legacy_state_dict(tmp_path):
    model = mlp(2, 8, 2, 2)
    torch.save({"state_dict": {f"module.{k}": v for k, v in model.state_dict().items()}}, tmp_path / "old.pt")
    result = subprocess.run(
        [sys.executable, str(CONVERT), str(tmp_path / "old.pt"), str(tmp_path / "new")],
        capture_output=True, text=True, timeout=60, env=env(),
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    converted = load_file(tmp_path / "new" / "model.safetensors")
    assert converted.keys() == model.state_dict().keys()
    assert all(torch.equal(converted[k], v) for k, v in model.state_dict().items())


def test_a_pickle_that_needs_code_is_refused(tmp_path):
    torch.save({"weights": torch.ones(2), "extra": NeedsCode()}, tmp_path / "evil.pt")
    with pytest.raises(CheckpointError, match="refused: this pickle needs code execution"):
        read_legacy_state_dict(tmp_path / "evil.pt")
    result = subprocess.run(
        [sys.executable, str(CONVERT), str(tmp_path / "evil.pt"), str(tmp_path / "x.safetensors")],
        capture_output=True, text=True, timeout=60, env=env(),
    )  # fmt: skip
    assert result.returncode == 2 and "refused" in result.stderr and "Traceback" not in result.stderr
    assert not (tmp_path / "x.safetensors").exists()


def test_truncated_legacy_file(tmp_path):
    torch.save(mlp(2, 8, 2, 2).state_dict(), tmp_path / "whole.pt")
    data = (tmp_path / "whole.pt").read_bytes()
    (tmp_path / "cut.pt").write_bytes(data[: len(data) // 2])
    with pytest.raises(CheckpointError, match="cut.pt: cannot read"):
        read_legacy_state_dict(tmp_path / "cut.pt")


@pytest.mark.timeout(200)
def test_init_from_a_legacy_pt_trains_with_a_warning(tmp_path):
    torch.manual_seed(0)
    torch.save(mlp(2, 16, 2, 2).state_dict(), tmp_path / "g.pt")
    config = write_run(tmp_path, {"init": {"generator": str(tmp_path / "g.pt")}, "training": {"max_steps": 2}})
    result = check(launch(["--config", str(config), "--device", "cpu"], 1))
    assert "convert it with scripts/convert_checkpoint.py" in result.stderr


def test_shared_devices_are_found():
    assert shared_devices([("a", 0, "cuda uuid 1", 9), ("a", 1, "cuda uuid 2", 8), ("b", 2, "cuda uuid 1", 7)]) == ""
    assert shared_devices([("a", 0, "cpu", 9), ("a", 1, "cpu", 8)]) == ""
    assert (
        shared_devices([("a", 0, "cuda uuid 1", 9), ("a", 1, "cuda uuid 1", 8)])
        == "ranks 0 and 1 share cuda uuid 1 on a"
    )


WATCHED = """
import sys, time
from pathlib import Path
from trainer.distributed.watchdog import HEARTBEAT, Watchdog
with Watchdog(1.0, Path(sys.argv[1]), rank=3), HEARTBEAT.inside("a call"):
    HEARTBEAT.beat("discriminator phase", 7)
    HEARTBEAT.collective_entered("all_reduce (per-step agreement)")
    time.sleep(30)
"""


@pytest.mark.timeout(60)
def test_watchdog_writes_stacks_and_exits(tmp_path):
    start = time.monotonic()
    result = subprocess.run(
        [sys.executable, "-c", WATCHED, str(tmp_path)], capture_output=True, text=True, timeout=40, env=env()
    )
    assert result.returncode == 4
    assert time.monotonic() - start < 15
    report = (tmp_path / "stall-rank3.txt").read_text()
    assert "phase: discriminator phase" in report and "step: 7" in report
    assert "last collective entered: all_reduce (per-step agreement)" in report
    assert "--- thread MainThread" in report and "line 8, in <module>" in report  # where it sleeps
    line = result.stderr.strip().splitlines()[-1]
    assert line.startswith("error (rank 3): stalled for") and "stall-rank3.txt" in line


@pytest.mark.timeout(60)
def test_a_rank_that_holds_the_gil_meets_the_backstop(tmp_path):
    # a C call that keeps the GIL (ctypes.PyDLL does not release it): the watchdog's Python thread
    # cannot run, so only faulthandler's C thread can end the process, at 10 times the bound
    script = WATCHED.replace("    time.sleep(30)", "    import ctypes; ctypes.PyDLL(None).sleep(40)")
    start = time.monotonic()
    result = subprocess.run(
        [sys.executable, "-c", script, str(tmp_path)], capture_output=True, text=True, timeout=50, env=env()
    )
    assert time.monotonic() - start < 25 and result.returncode == 1
    assert "Timeout (0:00:10)!" in result.stderr and 'File "<string>", line 8 in <module>' in result.stderr


@pytest.mark.timeout(60)
def test_long_work_extends_the_bound(tmp_path):
    script = WATCHED.replace(
        "    time.sleep(30)", "    with HEARTBEAT.long_work('checkpoint write', factor=10):\n        time.sleep(3)"
    )
    result = subprocess.run(
        [sys.executable, "-c", script, str(tmp_path)], capture_output=True, text=True, timeout=40, env=env()
    )
    assert result.returncode == 0, result.stderr
    assert not (tmp_path / "stall-rank3.txt").exists()


@pytest.mark.timeout(200)
def test_doctor_two_processes(tmp_path):
    out = tmp_path / "out"
    result = launch(
        ["--config", "configs/training/ring.yaml", "--device", "cpu", "--output-dir", str(out), "--size-mb", "1"],
        2, script=DOCTOR, timeout=150,
    )  # fmt: skip
    assert result.returncode == 0, result.stdout + result.stderr[-3000:]
    for rank in (0, 1):
        assert f"doctor (rank {rank}): verdict: OK" in result.stdout
    for line in ("device map: rank 1", "all_reduce 1 MB:", "all_gather:", "broadcast:", "barrier:", "configs parse: ok",
                 "output directory writable: ok", "world 2 (MULTI_CPU)"):  # fmt: skip
        assert line in result.stdout, line


@pytest.mark.timeout(200)
def test_doctor_fails_on_a_bad_config_and_unwritable_dir(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    result = launch(
        ["--config", "configs/training/ring.yaml", "--set", "training.batch_size=0", "--output-dir", str(blocker / "x"),
         "--device", "cpu", "--size-mb", "1"],
        2, script=DOCTOR, timeout=150,
    )  # fmt: skip
    assert result.returncode != 0
    verdicts = [line for line in result.stdout.splitlines() if "verdict" in line]
    assert verdicts and all("FAILED" in v for v in verdicts), result.stdout
    assert "configs parse failed on rank(s) 0, 1" in verdicts[0]
    assert "output directory writable failed on rank(s) 0, 1" in verdicts[0]


DRIVER = TESTS / "drive_steps.py"
#: the stall bound of the pause tests, and a pause well past it
PAUSE_BOUND_S, PAUSE_S = 3, 8


@pytest.mark.timeout(120)
@pytest.mark.parametrize("processes", [1, 2])
def test_a_pause_between_the_callers_steps_is_not_a_stall(tmp_path, processes):
    config = write_run(tmp_path, {"distributed": {"watchdog_s": PAUSE_BOUND_S}})
    result = launch([str(config), str(PAUSE_S), "between"], processes, script=DRIVER, timeout=100)
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.count(f"world size {processes}, step 4") == processes
    assert not list((tmp_path / "out").glob("stall-rank*.txt"))


@pytest.mark.timeout(120)
@pytest.mark.parametrize("processes", [1, 2])
def test_a_stall_inside_a_step_is_still_caught(tmp_path, processes):
    config = write_run(tmp_path, {"distributed": {"watchdog_s": PAUSE_BOUND_S}})
    result = launch([str(config), str(PAUSE_S * 4), "inside"], processes, script=DRIVER, timeout=100)
    assert result.returncode != 0
    stalled = [line for line in result.stderr.splitlines() if "stalled for" in line]
    # the sleeping rank names the phase it is really in: the generator phase of the second
    # step (the heartbeat counts the steps done)
    last = processes - 1
    mine = [line for line in stalled if f"error (rank {last}): stalled for" in line]
    assert mine and "generator phase at step 1" in mine[0], result.stderr[-3000:]
    assert (tmp_path / "out" / f"stall-rank{last}.txt").is_file()


def test_a_failure_inside_long_work_keeps_the_phase_it_failed_in():
    """A failure's notice names the rank's phase when it failed (the peers print it): unwinding
    a long-work block must not put back the phase from before it (a failure in the first step
    was reported as one while forming the process group)."""
    heartbeat = Heartbeat()
    heartbeat.beat("forming the process group")
    with pytest.raises(RuntimeError), heartbeat.long_work("first step"):
        heartbeat.beat("generator phase")
        raise RuntimeError("in the generator's average")
    assert heartbeat.phase == "generator phase"
    assert heartbeat.allowance == 1.0  # the bound is the short one again
    with heartbeat.long_work("checkpoint write"):
        heartbeat.beat("writing")
    assert heartbeat.phase == "generator phase"  # a block that ends as planned puts it back
