"""The fault matrix's runs: a tiny training run of the fault-injecting task, launched like a
user would (1 process, accelerate launch or torchrun), and what the scenarios check with."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from harness.launch import ROOT, launch_command, launch_env, records
from harness.tiny import TINY_DISCRIMINATOR, TINY_GENERATOR, deep_merge, write_run

#: seconds a run may take before the matrix kills it and reports a hang
HARD_TIMEOUT = 180
WATCHDOG_S = 5.0


@dataclass
class Outcome:
    """One row of the matrix."""

    scenario: str
    processes: int
    ok: bool
    outcome: str
    seconds: float
    on_disk: str


#: the accelerate config that ``accelerate launch`` runs take (see :func:`launched_with`)
ACCELERATE_CONFIG = "8gpu.yaml"


@contextlib.contextmanager
def launched_with(accelerate_config: str) -> Iterator[None]:
    """While inside, the runs' ``accelerate launch`` takes ``accelerate_configs/ACCELERATE_CONFIG``
    (``cpu_fsdp.yaml``: the scenarios with both models sharded)."""
    global ACCELERATE_CONFIG
    before, ACCELERATE_CONFIG = ACCELERATE_CONFIG, accelerate_config
    try:
        yield
    finally:
        ACCELERATE_CONFIG = before


class Run:
    """A tiny training run in its own directory, launched like a user would."""

    def __init__(
        self,
        work: Path,
        processes: int,
        task_options: dict[str, Any] | None = None,
        launcher: str = "accelerate",
        max_restarts: int = 0,
        **sections: Any,
    ):
        self.work, self.processes = work, processes
        self.launcher, self.max_restarts = launcher, max_restarts
        self.out = work / "out"
        self.pids = work / "pids"
        self.pids.mkdir(parents=True, exist_ok=True)
        generator = sections.pop("generator", TINY_GENERATOR)
        discriminator = sections.pop("discriminator", TINY_DISCRIMINATOR)
        own: dict[str, Any] = {
            "task": "harness.faultmatrix.inject:Faults",
            "task_options": {"pid_dir": str(self.pids), **(task_options or {})},
            "training": {"max_steps": 6, "eval_every": 3, "save_every": 3},
            "distributed": {"watchdog_s": WATCHDOG_S, "timeout_s": 60},
        }
        self.config = write_run(work, deep_merge(own, sections), generator, discriminator)
        self.args = ["--config", str(self.config), "--device", "cpu"]

    def command(self, *extra: str) -> list[str]:
        return launch_command(
            [*self.args, *extra],
            self.processes,
            launcher=self.launcher,
            max_restarts=self.max_restarts,
            accelerate_config=ACCELERATE_CONFIG,
        )

    def env(self) -> dict[str, str]:
        return launch_env()

    def start(self, *extra: str) -> subprocess.Popen:
        for old in self.pids.iterdir():
            old.unlink()
        return subprocess.Popen(
            self.command(*extra),
            cwd=ROOT,
            env=self.env(),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            start_new_session=True,
        )

    def run(self, *extra: str) -> tuple[subprocess.CompletedProcess, float]:
        """Run to the end; a run that outlives HARD_TIMEOUT is killed (its ranks too) and
        reported as exit -999."""
        start = time.monotonic()
        proc = self.start(*extra)
        code, stdout, stderr = wait(proc)
        if code == -999:  # the launcher starts the ranks in sessions of their own
            for pid_file in self.pids.glob("rank*.pid"):
                with contextlib.suppress(ValueError, OSError):
                    os.kill(int(pid_file.read_text()), signal.SIGKILL)
        return subprocess.CompletedProcess(proc.args, code, stdout, stderr), time.monotonic() - start

    def run_forked(self, *extra: str) -> subprocess.CompletedProcess:
        """Run to the end with the workers forked from this process (harness.forked): for a run
        that only sets a scenario up (the checkpoint a fault then harms, the uninterrupted run
        a resumed one is compared with), which needs no launcher of its own; the runs that meet
        the fault start under the real one."""
        from harness.forked import fork_launch

        for old in self.pids.iterdir():
            old.unlink()
        return fork_launch(
            [*self.args, *extra], self.processes, accelerate_config=ACCELERATE_CONFIG, timeout=HARD_TIMEOUT
        )

    def rank_pids(self, timeout: float = 120) -> dict[int, int]:
        """Wait until every rank has started training; their pids by rank."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            found = {int(p.stem[4:]): int(p.read_text()) for p in self.pids.glob("rank*.pid") if p.read_text()}
            if len(found) == self.processes:
                return found
            time.sleep(0.05)
        raise TimeoutError("the ranks did not start training")

    def records(self, split: str) -> list[dict[str, Any]]:
        """The run's records of ``split``; none when it wrote no metrics.jsonl."""
        return records(self.out, split) if (self.out / "metrics.jsonl").is_file() else []

    def on_disk(self) -> str:
        if not self.out.exists():
            return "nothing"
        names = (
            sorted(p.name for p in (self.out / "checkpoints").iterdir()) if (self.out / "checkpoints").exists() else []
        )
        stalls = sorted(p.name for p in self.out.glob("stall-rank*.txt"))
        final = "final/" if (self.out / "final").exists() else "no final/"
        return ", ".join([*names, *stalls, final]) or "nothing"


def weight_difference(a: Path, b: Path) -> float:
    """The largest absolute difference between the weights of two final/ directories."""
    from safetensors.torch import load_file

    largest = 0.0
    for role in ("generator", "discriminator"):
        left, right = load_file(a / role / "model.safetensors"), load_file(b / role / "model.safetensors")
        if left.keys() != right.keys():
            return float("inf")
        largest = max([largest, *((left[k] - right[k]).abs().max().item() for k in left)])
    return largest


def same_as_uninterrupted(resumed: Path, whole: Path, processes: int, missing: str) -> tuple[bool, str]:
    """Whether the final weights of a resumed run equal an uninterrupted run's, and how it reads.

    With 3 or more ranks, DDP's first iteration after a restart may group the gradient sums
    differently from the uninterrupted run (floating-point sums depend on the grouping), so the
    resumed weights can differ in the last bits; with 1 or 2 ranks they are identical.
    ``missing`` is the text when ``resumed`` has no final/.
    """
    if not (resumed / "final").is_dir() or not (whole / "final").is_dir():
        return False, missing
    difference = weight_difference(resumed / "final", whole / "final")
    if difference == 0.0:
        return True, "bit-identical"
    return processes > 2 and difference <= 1e-5, f"max |diff| {difference:.1e}"


def wait(proc: subprocess.Popen, timeout: float = HARD_TIMEOUT) -> tuple[int, str, str]:
    try:
        stdout, stderr = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        stdout, stderr = proc.communicate()
        return -999, stdout, stderr + "\nHUNG: killed by the fault matrix"
    return proc.returncode, stdout, stderr


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # A zombie has exited already; only a running or stopped process counts.
    try:
        state = Path(f"/proc/{pid}/stat").read_text().split(")")[-1].split()[0]
    except OSError:
        return False
    return state != "Z"


def left_alive(pids: list[int], grace: float = 5.0) -> list[int]:
    """The processes among ``pids`` still alive ``grace`` seconds after a SIGKILL at most: one
    killed inside a disk write (a checkpoint's) dies when the write returns."""
    deadline = time.monotonic() + grace
    while (left := [pid for pid in pids if alive(pid)]) and time.monotonic() < deadline:
        time.sleep(0.05)
    return left


def with_tail(outcome: str, ok: bool, stderr: str, lines: int, chars: int) -> str:
    """A failed row's outcome with the last ``lines`` lines of ``stderr`` (at most ``chars``
    characters) after it: what went wrong; a row that passed, unchanged."""
    return outcome if ok else outcome + " | " + " / ".join(stderr.strip().splitlines()[-lines:])[-chars:]


def error_lines(stderr: str) -> list[str]:
    return [line for line in stderr.splitlines() if line.startswith("error (rank")]


def every_rank_says(stderr: str, processes: int, text: str) -> bool:
    """Whether each rank printed one error line containing ``text``."""
    lines = [line for line in error_lines(stderr) if text in line]
    return sorted(line.split(")")[0] for line in lines) == [f"error (rank {r}" for r in range(processes)]


def start_long_run(work: Path, processes: int, **sections: Any) -> tuple[Run, subprocess.Popen, dict[int, int]]:
    """A run that would go on for hours, once every rank is training. It neither evaluates nor
    saves: its faults land mid-step, where the watchdog's bound is ``watchdog_s`` (a peer that
    waits for the main process's writes of an eval has ten times that bound, the long-work
    allowance: a rank frozen then was seen after 52.9 s)."""
    training = {"max_steps": 100000, "save_every": 100000, "eval_every": 100000}
    run = Run(work, processes, {"step_sleep_s": 0.02}, training=training, **sections)
    proc = run.start()
    pids = run.rank_pids()
    time.sleep(0.5)
    return run, proc, pids


#: the restart scenarios' runs: the first checkpoint at step 4, the kill at the 7th D-loss call
RESTART_TRAINING = {"max_steps": 12, "save_every": 4, "eval_every": 6}


#: runs a job to its end: every launcher's exit status, their stderr, the seconds taken
Launch = Callable[[Run], tuple[list[int], str, float]]


def restart_after_kill_outcome(
    work: Path, ranks: int, label: str, processes: int, launch: Launch, **run: Any
) -> Outcome:
    """The last rank SIGKILLed after the first checkpoint of a run that its launcher restarts
    with ``--resume latest``: the restarted workers form their group, resume from that
    checkpoint and finish with the weights of an uninterrupted run. ``launch`` runs the
    restarted job; ``run`` are the launcher's arguments of :class:`Run`."""
    whole = Run(work / "whole", ranks, training=RESTART_TRAINING)
    whole.run_forked()
    marker = work / "killed"
    options = {"kill_call": 7, "kill_rank": ranks - 1, "kill_marker": str(marker)}
    restarted = Run(work / "restarted", ranks, options, training=RESTART_TRAINING, **run)
    codes, stderr, seconds = launch(restarted)
    train = restarted.records("train")
    last = train[-1]["step"] if train else None
    resumed = "resumed from" in stderr and "step-0000004 at step 4" in stderr
    same, weights = same_as_uninterrupted(restarted.out, whole.out, ranks, "no final/")
    ok = marker.exists() and not any(codes) and last == 12 and resumed and same
    outcome = (
        f"{'killed' if marker.exists() else 'never killed'}; exit {'/'.join(map(str, codes))}, last train step "
        f"{last}, {'resumed from step-0000004' if resumed else 'no resume line'}; vs uninterrupted: {weights}"
    )
    return Outcome(label, processes, ok, with_tail(outcome, ok, stderr, 3, 400), seconds, restarted.on_disk())
