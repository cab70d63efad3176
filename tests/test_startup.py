"""Start-up is bounded: a worker that cannot form the process group ends with one line."""

from __future__ import annotations

import subprocess
import sys
import time

import pytest
from helpers import SCRIPT, free_port, worker_env, write_run

TIMEOUT_S = 6


def start_worker(config, rank: int, port: int, cwd=None, device="cpu", env=None) -> subprocess.Popen:
    """One of two workers started by hand, with the environment a launcher would give it."""
    cmd = [sys.executable, str(SCRIPT), "--config", str(config), "--device", device]
    return subprocess.Popen(
        cmd,
        env=worker_env(rank, 2, port) | (env or {}),
        cwd=cwd,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def error_lines(stderr: str) -> list[str]:
    return [line for line in stderr.splitlines() if line.startswith("error (rank")]


#: a sitecustomize that makes torch report a CUDA device in the process of rank 0 alone: a
#: node whose CUDA works beside one whose CUDA does not
RANK0_SEES_CUDA = """
import os
if os.environ.get("RANK") == "0":
    import torch
    torch.cuda.is_available = lambda: True
"""


@pytest.mark.timeout(120)
@pytest.mark.parametrize("device", ["auto", "cuda"])
def test_ranks_that_would_resolve_the_device_differently_are_refused_on_every_rank(tmp_path, device):
    """--device auto would give rank 0 NCCL and rank 1 gloo, which cannot form one group; the
    device is agreed before the group forms, and the difference named on every rank (exit 2)."""
    (tmp_path / "site").mkdir()
    (tmp_path / "site" / "sitecustomize.py").write_text(RANK0_SEES_CUDA)
    config = write_run(tmp_path, {"distributed": {"timeout_s": 30}})
    port = free_port()
    extra = {"PYTHONPATH": f"{tmp_path / 'site'}:{worker_env(0, 2, port)['PYTHONPATH']}"}
    start = time.monotonic()
    procs = [start_worker(config, rank, port, device=device, env=extra) for rank in (0, 1)]
    outputs = [proc.communicate(timeout=90) for proc in procs]
    for rank, (proc, (_, stderr)) in enumerate(zip(procs, outputs, strict=True)):
        lines = error_lines(stderr)
        assert proc.returncode == 2, stderr[-3000:]
        assert len(lines) == 1, stderr[-3000:]
        assert lines[0].startswith(f"error (rank {rank}): --device {device}: "), lines
        assert "rank(s) 1" in lines[0] and "no usable CUDA device" in lines[0], lines
        assert "Traceback" not in stderr
    assert time.monotonic() - start < 30  # agreed at once, not found by a timeout


@pytest.mark.timeout(120)
def test_a_rank_with_a_wrong_master_port_ends_every_rank_within_the_timeout(tmp_path):
    # Two workers started by hand as a launcher would start them; rank 1 is told a port on
    # which nobody listens, so neither can form the group.
    config = write_run(tmp_path, {"distributed": {"timeout_s": TIMEOUT_S}})
    good, wrong = free_port(), free_port()
    start = time.monotonic()
    procs = [start_worker(config, rank, port) for rank, port in ((0, good), (1, wrong))]
    outputs = [proc.communicate(timeout=TIMEOUT_S + 60) for proc in procs]
    elapsed = time.monotonic() - start
    for rank, (proc, (_, stderr)) in enumerate(zip(procs, outputs, strict=True)):
        lines = error_lines(stderr)
        assert proc.returncode != 0, stderr[-2000:]
        assert len(lines) == 1, stderr[-3000:]
        # torch's own timeout (a DistError) or, past it, the start-up bound: either names the
        # rank, the step of start-up and the store's address
        assert lines[0].startswith(f"error (rank {rank}): "), lines
        assert "could not form the process group" in lines[0] or "start-up did not finish" in lines[0], lines
        assert f"127.0.0.1:{(good, wrong)[rank]}" in lines[0]
        assert "Traceback" not in stderr
    # imports take a few seconds of the budget
    assert elapsed <= TIMEOUT_S + 10 + 10, elapsed


@pytest.mark.timeout(120)
def test_an_output_directory_not_shared_by_every_rank_is_refused(tmp_path):
    # Two workers in different working directories with a relative output_dir: as two nodes
    # each with its own local disk, they write to different directories.
    config = write_run(tmp_path, {"output_dir": "out"})
    port = free_port()
    procs = []
    for rank in (0, 1):
        (tmp_path / f"node{rank}").mkdir()
        procs.append(start_worker(config, rank, port, cwd=tmp_path / f"node{rank}"))
    outputs = [proc.communicate(timeout=90) for proc in procs]
    for rank, (proc, (_, stderr)) in enumerate(zip(procs, outputs, strict=True)):
        lines = error_lines(stderr)
        assert proc.returncode == 2, stderr[-3000:]
        assert len(lines) == 1, stderr[-3000:]
        assert lines[0].startswith(f"error (rank {rank}): out: rank(s) 1 do not see"), lines
        assert "shared" in lines[0]
    assert not (tmp_path / "node1" / "out" / "checkpoints").exists()
    assert list((tmp_path / "node0" / "out").glob(".shared-check-*")) == []


def test_a_later_run_takes_the_existing_groups_backend(tmp_path, monkeypatch):
    """A pipeline's later run finds the group its first run formed: the device follows that
    group's backend (agreed when it formed), not this rank's view of CUDA now."""
    import torch

    from trainer.distributed.process_group import form_process_group

    store = torch.distributed.FileStore(str(tmp_path / "store"), 1)
    torch.distributed.init_process_group("gloo", store=store, rank=0, world_size=1)
    try:
        monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
        assert form_process_group("auto", 5) is True
    finally:
        torch.distributed.destroy_process_group()


def agree_in_threads(store, world_size: int, late: int, delay_s: float) -> list[str]:
    """Every rank's agreed round name, each rank a thread; rank ``late`` starts ``delay_s`` late."""
    import threading

    from trainer.distributed.process_group import agree_on_round

    names: list[str | None] = [None] * world_size

    def rank_thread(rank: int) -> None:
        if rank == late:
            time.sleep(delay_s)
        names[rank] = agree_on_round(store, rank, world_size, timeout_s=20)

    threads = [threading.Thread(target=rank_thread, args=(rank,)) for rank in range(world_size)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    return names


@pytest.mark.timeout(60)
@pytest.mark.parametrize("late", [0, 1, 2])
def test_restarted_ranks_agree_on_a_new_round_whatever_the_earlier_rounds_left(late):
    """A store that keeps every earlier round's questions and answers (the elastic agent's, shared
    by every round of workers): each later round agrees on one name, new each time, whichever
    rank starts late (rank 0 then reads the earlier round's questions first, or the others
    its answers)."""
    import torch.distributed as dist

    store = dist.HashStore()
    seen = []
    for _ in range(3):
        names = agree_in_threads(store, 3, late, 0.2)
        assert len(set(names)) == 1 and names[0] is not None, names
        seen.append(names[0])
    assert len(set(seen)) == 3


#: run in a fresh interpreter: a mixture run through the CLI, then the modules it imported
IMPORTED_BY_A_RUN = """
import runpy, sys
sys.argv = ["train_stage2.py", *sys.argv[1:]]
try:
    runpy.run_path({script!r}, run_name="__main__")
except SystemExit as stop:
    assert stop.code in (0, None), stop.code
print("imported:", " ".join(sorted(sys.modules)))
"""


@pytest.mark.timeout(120)
def test_a_mixture_run_does_not_import_the_model_libraries_it_does_not_use(tmp_path):
    # transformers' scheduler module imports its Trainer utilities, which import peft (where it
    # is installed) and with it transformers' modeling stack: about 1 s of CPU in each process
    # of a run made of plain torch models (trainer/contract/schedules.py), and of every test that
    # launches one; transformers itself costs 0.8 s more (trainer/contract/logs.py)
    config = write_run(tmp_path, {"optim": {"discriminator": {"scheduler": "constant", "warmup_steps": 2}}})
    code = IMPORTED_BY_A_RUN.format(script=str(SCRIPT))
    args = ["--config", str(config), "--device", "cpu", "--output-dir", str(tmp_path / "out")]
    done = subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True, timeout=100)
    assert done.returncode == 0, done.stderr[-3000:]
    assert (tmp_path / "out" / "final").is_dir()
    imported = set(done.stdout.splitlines()[-1].split()[1:])
    assert "trainer.training.loop" in imported and "torch" in imported
    unused = {"peft", "transformers", "transformers.optimization", "transformers.modeling_utils", "datasets"}
    assert not unused & imported, sorted(unused & imported)
