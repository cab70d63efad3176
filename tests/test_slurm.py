"""examples/slurm/stage2.sbatch, run as SLURM would run it on two nodes (tests/slurm_shims:
srun starts the command once per node, scontrol names the nodes, both on this machine): a
preemption's SIGTERM leaves an agreed checkpoint, and the requeued job resumes from it."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from helpers import ROOT, TESTS, env, free_port, records, write_run

SCRIPT = ROOT / "examples" / "slurm" / "stage2.sbatch"
SHIMS = TESTS / "slurm_shims"
STEPS = 60


def slurm_env(config: Path) -> dict[str, str]:
    path = os.pathsep.join([str(SHIMS), str(Path(sys.executable).parent), os.environ["PATH"]])
    job = {"SLURM_JOB_NODELIST": "node[1-2]", "SLURM_NNODES": "2", "SLURM_JOB_ID": "77", "PATH": path}
    return env() | job | {"GPUS_PER_NODE": "1", "DEVICE": "cpu", "CONFIG": str(config), "RDZV_PORT": str(free_port())}


def sbatch(config: Path) -> subprocess.Popen:
    """The job script as SLURM starts it (in a session of its own: the whole job killable)."""
    return subprocess.Popen(
        ["bash", str(SCRIPT)], cwd=ROOT, env=slurm_env(config), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        text=True, start_new_session=True,
    )  # fmt: skip


@pytest.mark.timeout(300)
def test_the_slurm_script_stops_at_a_checkpoint_when_preempted_and_its_requeue_resumes(tmp_path):
    pids = tmp_path / "pids"
    pids.mkdir()
    faults = {"task": "harness.faultmatrix.inject:Faults", "task_options": {"pid_dir": str(pids), "step_sleep_s": 0.1}}
    config = write_run(tmp_path, {**faults, "training": {"max_steps": STEPS, "save_every": 1000, "eval_every": 1000}})
    job = sbatch(config)
    try:
        deadline = time.monotonic() + 120
        while len(list(pids.glob("rank*.pid"))) < 2 and time.monotonic() < deadline and job.poll() is None:
            time.sleep(0.1)
        assert len(list(pids.glob("rank*.pid"))) == 2, job.communicate(timeout=5)[1][-3000:]
        time.sleep(1.0)
        os.killpg(job.pid, signal.SIGTERM)  # SLURM's preemption: SIGTERM to every process of the job
        _, stderr = job.communicate(timeout=120)
    finally:
        if job.poll() is None:
            os.killpg(job.pid, signal.SIGKILL)
    saved = sorted((tmp_path / "out" / "checkpoints").glob("step-*"))
    assert len(saved) == 1, stderr[-3000:]  # the agreed checkpoint, on every rank at one step
    step = int(saved[0].name[5:])
    assert 0 < step < STEPS, stderr[-3000:]

    requeued = sbatch(config)  # the requeued job: the same script, --resume latest
    stdout, stderr = requeued.communicate(timeout=200)
    assert requeued.returncode == 0, stderr[-3000:]
    assert f"at step {step}" in stderr
    train = records(tmp_path / "out", "train")
    assert train[-1]["step"] == STEPS and {r["world_size"] for r in train} == {2}
