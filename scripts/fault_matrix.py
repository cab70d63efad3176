"""Run each fault against the real launcher at 1, 2 and 4 CPU processes; print a table.

    python scripts/fault_matrix.py [--processes 1 2 4] [--scenarios NAME ...] [--markdown]

Each scenario starts tiny training runs (the test tasks of tests/fixture_tasks.py inject the
faults), applies the fault, and checks the outcome against its bound: every process gone,
the exit status, the seconds to the outcome, and what was left on disk. Nothing may hang:
every run has a hard timeout. tests/test_faults.py runs every scenario at 2 processes.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT), str(ROOT / "tests")]

from helpers import env as launch_env  # noqa: E402  (tests/helpers.py: the launch commands)
from helpers import free_port, launch_command, worker_env  # noqa: E402

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
        (work / "g.yaml").write_text(yaml.safe_dump(sections.pop("generator", {"hidden_dim": 16, "num_layers": 2})))
        (work / "d.yaml").write_text(yaml.safe_dump(sections.pop("discriminator", {"hidden_dim": 16, "num_layers": 2})))
        config: dict[str, Any] = {
            "task": "fixture_tasks:Faults",
            "output_dir": str(self.out),
            "model": {"generator_config": str(work / "g.yaml"), "discriminator_config": str(work / "d.yaml")},
            "task_options": {"plot": False, "pid_dir": str(self.pids), **(task_options or {})},
            "training": {
                "max_steps": 6,
                "batch_size": 4,
                "eval_every": 3,
                "save_every": 3,
                "log_every": 1,
                "mixed_precision": "no",
                "log_with": ["none"],
            },
            "eval": {"batch_size": 4},
            "data": {"train_size": 64, "eval_size": 10},
            "distributed": {"watchdog_s": WATCHDOG_S, "timeout_s": 60},
        }
        for section, values in sections.items():
            config[section] = {**config.get(section, {}), **values} if isinstance(values, dict) else values
        self.config = work / "train.yaml"
        self.config.write_text(yaml.safe_dump(config))
        self.args = ["--config", str(self.config), "--device", "cpu"]

    def command(self, *extra: str) -> list[str]:
        return launch_command(
            [*self.args, *extra], self.processes, launcher=self.launcher, max_restarts=self.max_restarts
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
        path = self.out / "metrics.jsonl"
        lines = path.read_text().splitlines() if path.is_file() else []
        return [r for r in map(json.loads, lines) if r["split"] == split]

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


def error_lines(stderr: str) -> list[str]:
    return [line for line in stderr.splitlines() if line.startswith("error (rank")]


# -- scenarios -------------------------------------------------------------------------------


def start_long_run(work: Path, processes: int, **sections: Any) -> tuple[Run, subprocess.Popen, dict[int, int]]:
    """A run that would go on for hours, once every rank is training."""
    training = {"max_steps": 100000, "save_every": 100000}
    run = Run(work, processes, {"step_sleep_s": 0.02}, training=training, **sections)
    proc = run.start()
    pids = run.rank_pids()
    time.sleep(0.5)
    return run, proc, pids


def kill_one_rank(work: Path, processes: int) -> Outcome:
    """A rank killed with SIGKILL mid-step: all processes gone, non-zero, <= 15 s."""
    run, proc, pids = start_long_run(work, processes)
    start = time.monotonic()
    os.kill(pids[processes - 1], signal.SIGKILL)
    code, _, _ = wait(proc)
    seconds = time.monotonic() - start
    survivors = [p for p in pids.values() if alive(p)]
    ok = code != 0 and not survivors and seconds <= 15
    return Outcome(
        "SIGKILL one rank mid-step", processes, ok, f"exit {code}, {len(survivors)} left", seconds, run.on_disk()
    )


def freeze_one_rank(work: Path, processes: int) -> Outcome:
    """A rank frozen with SIGSTOP: a watchdog fires, all gone, <= watchdog_s + 10 s, stack file."""
    run, proc, pids = start_long_run(work, processes)
    start = time.monotonic()
    os.kill(pids[processes - 1], signal.SIGSTOP)
    if processes == 1:
        # Nothing is left to notice: the frozen process's own watchdog is frozen with it.
        time.sleep(WATCHDOG_S + 2)
        frozen = proc.poll() is None
        os.killpg(proc.pid, signal.SIGKILL)
        os.kill(pids[0], signal.SIGCONT)
        wait(proc)
        return Outcome(
            "SIGSTOP one rank",
            1,
            frozen,
            "not applicable: no peer can see a frozen single process (stays frozen, as expected)",
            time.monotonic() - start,
            run.on_disk(),
        )
    code, _, stderr = wait(proc)
    seconds = time.monotonic() - start
    survivors = [p for p in pids.values() if alive(p)]
    stalls = list(run.out.glob("stall-rank*.txt"))
    reported = any("stalled for" in line for line in error_lines(stderr))
    ok = code != 0 and not survivors and seconds <= WATCHDOG_S + 10 and bool(stalls) and reported
    return Outcome(
        "SIGSTOP one rank", processes, ok, f"exit {code}, watchdog on {len(stalls)} rank(s)", seconds, run.on_disk()
    )


STOP_GRACE_S = 3.0


def terminate_while_peer_frozen(work: Path, processes: int) -> Outcome:
    """SIGTERM to rank 0 while the last rank is frozen (SIGSTOP): rank 0 cannot reach the
    agreed stop and exits with one line within distributed.stop_grace_s + 5 s."""
    label = "SIGTERM to rank 0, last rank frozen"
    if processes == 1:
        return Outcome(label, 1, True, "not applicable: no peer to wait for", 0.0, "nothing")
    distributed = {"watchdog_s": 60, "stop_grace_s": STOP_GRACE_S}
    run, proc, pids = start_long_run(work, processes, distributed=distributed)
    frozen = pids[processes - 1]
    os.kill(frozen, signal.SIGSTOP)
    time.sleep(0.5)
    start = time.monotonic()
    os.kill(pids[0], signal.SIGTERM)
    while alive(pids[0]) and time.monotonic() - start < HARD_TIMEOUT:
        time.sleep(0.05)
    seconds = time.monotonic() - start
    os.kill(frozen, signal.SIGCONT)
    for pid in pids.values():
        with contextlib.suppress(OSError):
            os.kill(pid, signal.SIGKILL)
    _, _, stderr = wait(proc)
    said = [line for line in error_lines(stderr) if line.startswith("error (rank 0): SIGTERM received")]
    ok = seconds <= STOP_GRACE_S + 5 and len(said) == 1
    outcome = f"rank 0 gone after {seconds:.1f} s; {said[0][16:110] if said else 'no line from rank 0'}"
    return Outcome(label, processes, ok, outcome, seconds, run.on_disk())


def nan_on_one_rank(work: Path, processes: int) -> Outcome:
    """NaN on one rank at one step: that step skipped on all ranks, identical weights after."""
    run = Run(work, processes, {"nan_rank": processes - 1, "nan_first_call": 2, "nan_last_call": 2})
    result, seconds = run.run()
    train, evals = run.records("train"), run.records("eval")
    skipped = train[-1]["skipped_d"] if train else None
    agree = bool(evals) and all(r["checksum_spread"] == 0.0 and r["checksum_finite"] for r in evals)
    ok = result.returncode == 0 and skipped == 1 and agree
    return Outcome(
        "NaN on one rank, one step",
        processes,
        ok,
        f"exit {result.returncode}, skipped_d={skipped}, ranks identical={agree}",
        seconds,
        run.on_disk(),
    )


def bad_init(kind: str) -> Callable[[Path, int], Outcome]:
    def scenario(work: Path, processes: int) -> Outcome:
        """A missing, truncated or code-executing init checkpoint: clear error on all ranks, <= 15 s."""
        from safetensors.torch import save_file

        from trainer.tasks.gaussian_mixture import mlp

        work.mkdir(parents=True, exist_ok=True)
        if kind == "missing":
            path = work / "nowhere.safetensors"
        elif kind == "truncated":
            path = work / "cut.safetensors"
            save_file(mlp(2, 16, 2, 1).state_dict(), str(path))
            path.write_bytes(path.read_bytes()[:100])
        else:
            path = work / "code.pt"
            path.write_bytes(EVIL_PICKLE)
        run = Run(work, processes, init={"discriminator": str(path)})
        result, seconds = run.run()
        lines = error_lines(result.stderr)
        # A missing path is caught while reading the config, before any process group: every
        # rank reports it. Unreadable files are agreed: every rank reports the failure.
        ranks_reporting = {line.split(")")[0] for line in lines}
        ok = result.returncode != 0 and len(ranks_reporting) == processes and seconds <= 15
        first = lines[0].split(": ", 1)[1][:90] if lines else "no error line"
        return Outcome(
            f"init checkpoint {kind}", processes, ok, f"exit {result.returncode}: {first}", seconds, run.on_disk()
        )

    return scenario


# A pickle whose loading would call os.system: what weights_only=True must refuse.
EVIL_PICKLE = b"cos\nsystem\n(S'echo pwned'\ntR."


def kill_during_checkpoint(work: Path, processes: int) -> Outcome:
    """SIGKILL of the whole job during a checkpoint write: the previous checkpoint is intact
    and --resume latest continues from it."""
    big = {"hidden_dim": 1024, "num_layers": 4}
    run = Run(
        work,
        processes,
        generator=big,
        discriminator=big,
        training={"max_steps": 40, "save_every": 2, "eval_every": 1000, "keep_checkpoints": 5},
    )
    proc = run.start()
    pids = run.rank_pids()
    root = run.out / "checkpoints"
    start = time.monotonic()
    caught = None
    while proc.poll() is None and time.monotonic() - start < HARD_TIMEOUT:
        # The complete ones first: a partial directory seen after them was not renamed yet
        # (the other order can see one write both as partial and, a moment later, complete).
        complete = sorted(root.glob("step-*")) if root.exists() else []
        partial = [p for p in root.glob(".partial-step-*")] if root.exists() else []
        if partial and complete:
            caught = partial[0].name
            # The whole job: the launcher's group and every rank (the launcher starts the
            # ranks in sessions of their own).
            for pid in pids.values():
                os.kill(pid, signal.SIGKILL)
            os.killpg(proc.pid, signal.SIGKILL)
            break
        time.sleep(0.002)
    wait(proc)
    survivors = [p for p in pids.values() if alive(p)]
    # The write may have ended between the look and the kill: then it is the newest complete
    # checkpoint; else the one before it (save_every 2) is.
    mid_write = caught is not None and (root / caught).exists()
    if caught is None:
        return Outcome(
            "SIGKILL job during checkpoint write",
            processes,
            False,
            "never caught a write in progress",
            time.monotonic() - start,
            run.on_disk(),
        )
    from trainer.checkpoint import resolve_resume

    latest = resolve_resume("latest", run.out)
    resumed, seconds = run.run("--resume", "latest")
    latest_step = int(latest.name[5:]) if latest else -1
    caught_step = int(caught[len(".partial-step-") :])
    expected = caught_step - 2 if mid_write else caught_step
    ok = (
        not survivors
        and latest_step == expected
        and resumed.returncode == 0
        and f"at step {latest_step}" in resumed.stderr
    )
    return Outcome(
        "SIGKILL job during checkpoint write",
        processes,
        ok,
        f"killed in {caught}{'' if mid_write else ' (as its write ended)'}; resumed from "
        f"{latest.name if latest else None}: exit {resumed.returncode}",
        seconds,
        run.on_disk(),
    )


def terminate_one_rank(work: Path, processes: int) -> Outcome:
    """SIGTERM to one rank: an agreed checkpoint on every rank, exit 0, exact resume."""
    training = {"max_steps": 200, "save_every": 1000, "eval_every": 1000, "log_every": 50}
    whole = Run(work / "whole", processes, training=training)
    whole.run()
    run = Run(work / "stopped", processes, {"step_sleep_s": 0.01}, training=training)
    proc = run.start()
    pids = run.rank_pids()
    time.sleep(0.3)
    start = time.monotonic()
    os.kill(pids[processes - 1], signal.SIGTERM)
    code, stdout, _ = wait(proc)
    seconds = time.monotonic() - start
    saved = sorted((run.out / "checkpoints").glob("step-*")) if (run.out / "checkpoints").exists() else []
    stopped_ok = code == 0 and "stopped by a stop signal" in stdout and len(saved) == 1
    on_disk = run.on_disk()
    resumed, _ = run.run("--resume", "latest")
    same, resumed_text = same_as_uninterrupted(run.out, whole.out, processes, "resume failed")
    ok = stopped_ok and resumed.returncode == 0 and same
    where = saved[0].name if saved else "no checkpoint"
    outcome = f"exit {code} at {where}; resumed vs uninterrupted: {resumed_text}"
    return Outcome("SIGTERM one rank", processes, ok, outcome, seconds, on_disk)


def eval_size(size: int, label: str) -> Callable[[Path, int], Outcome]:
    def scenario(work: Path, processes: int) -> Outcome:
        """Eval sets of awkward sizes: every sample scored once (or a clear error for none)."""
        run = Run(work, processes, data={"eval_size": size})
        result, seconds = run.run()
        if size == 0:
            lines = error_lines(result.stderr)
            ok = result.returncode != 0 and any("'data.eval_size' must be at least 1" in x for x in lines)
            return Outcome(
                label,
                processes,
                ok,
                f"exit {result.returncode}: {lines[0][:90] if lines else '?'}",
                seconds,
                run.on_disk(),
            )
        counts = [r["num_samples"] for r in run.records("eval")]
        ok = result.returncode == 0 and counts and all(c == size for c in counts)
        return Outcome(
            label,
            processes,
            bool(ok),
            f"exit {result.returncode}, num_samples {sorted(set(counts))}",
            seconds,
            run.on_disk(),
        )

    return scenario


def one_rank_collective(work: Path, processes: int) -> Outcome:
    """A collective entered on one rank only, with distributed.debug: the job exits (no hang).

    torch reads TORCH_DISTRIBUTED_DEBUG when torch.distributed is imported, before the config
    sets it, so torch's own mismatch check is not in effect; what reports the mismatch is
    gloo's size check (torch 2.13: "Is there a distributed collective mismatch"; torch 2.6:
    only the sizes) or the watchdog."""
    if processes == 1:
        return Outcome("collective on one rank only (debug)", 1, True, "not applicable: one rank", 0.0, "nothing")
    run = Run(work, processes, {"rogue_collective_call": 3}, distributed={"debug": True})
    result, seconds = run.run()
    text = result.stderr
    ok = result.returncode != 0 and seconds <= WATCHDOG_S + 60
    if "mismatch" in text.lower():
        how = "collective mismatch reported"
    else:
        how = "watchdog" if "stalled for" in text else "gloo aborted (sizes differ), no mismatch named"
    return Outcome(
        "collective on one rank only (debug)", processes, ok, f"exit {result.returncode}, {how}", seconds, run.on_disk()
    )


def restart_after_kill(launcher: str) -> Callable[[Path, int], Outcome]:
    def scenario(work: Path, processes: int) -> Outcome:
        """A rank killed with SIGKILL after the first checkpoint, under the launcher's
        --max-restarts 1 with --resume latest: the restarted workers form their group, resume
        from that checkpoint and finish, with the weights of an uninterrupted run."""
        label = f"SIGKILL one rank under {launcher} --max-restarts 1"
        training = {"max_steps": 12, "save_every": 4, "eval_every": 6}
        whole = Run(work / "whole", processes, training=training)
        whole.run()
        marker = work / "killed"
        options = {"kill_call": 7, "kill_rank": processes - 1, "kill_marker": str(marker)}
        run = Run(work / "restarted", processes, options, launcher=launcher, max_restarts=1, training=training)
        result, seconds = run.run("--resume", "latest")
        train = run.records("train")
        last = train[-1]["step"] if train else None
        resumed = "resumed from" in result.stderr and "step-0000004 at step 4" in result.stderr
        same, weights = same_as_uninterrupted(run.out, whole.out, processes, "no final/")
        ok = marker.exists() and result.returncode == 0 and last == 12 and resumed and same
        outcome = (
            f"{'killed' if marker.exists() else 'never killed'}; exit {result.returncode}, last train step {last}, "
            f"{'resumed from step-0000004' if resumed else 'no resume line'}; vs uninterrupted: {weights}"
        )
        if not ok:
            outcome += " | " + " / ".join(result.stderr.strip().splitlines()[-3:])[-400:]
        return Outcome(label, processes, ok, outcome, seconds, run.on_disk())

    return scenario


def every_rank_says(stderr: str, processes: int, text: str) -> bool:
    """Whether each rank printed one error line containing ``text``."""
    lines = [line for line in error_lines(stderr) if text in line]
    return sorted(line.split(")")[0] for line in lines) == [f"error (rank {r}" for r in range(processes)]


def fresh_start_into_old_run(work: Path, processes: int) -> Outcome:
    """A fresh start into a directory that holds an earlier run's checkpoints: refused by
    every rank with one line, the earlier checkpoints intact."""
    run = Run(work, processes)
    run.run()
    before = run.on_disk()
    result, seconds = run.run("--set", "training.max_steps=2", "--set", "training.save_every=1")
    # rank 0 names the directory and the ways on; the others name rank 0
    refused = every_rank_says(result.stderr, processes, "") and "--resume latest" in result.stderr
    ok = result.returncode != 0 and refused and run.on_disk() == before
    outcome = f"exit {result.returncode}, {'every rank refused' if refused else 'not refused by every rank'}"
    return Outcome("fresh start into an earlier run's directory", processes, ok, outcome, seconds, run.on_disk())


def resume_other_shape(work: Path, processes: int) -> Outcome:
    """Resume with another gradient_accumulation_steps: refused by every rank, naming the key."""
    run = Run(work, processes)
    run.run()
    result, seconds = run.run("--resume", "latest", "--set", "training.gradient_accumulation_steps=2")
    named = every_rank_says(result.stderr, processes, "training.gradient_accumulation_steps")
    ok = result.returncode != 0 and named
    outcome = f"exit {result.returncode}, {'every rank names the key' if named else 'key not named by every rank'}"
    return Outcome("resume with another accumulation length", processes, ok, outcome, seconds, run.on_disk())


def error_on_main_process(work: Path, processes: int) -> Outcome:
    """An exception in the task's on_eval on the main process: its traceback, one line from
    every other rank naming rank 0, all gone within 30 s."""
    run = Run(work, processes, {"raise_in": "on_eval"}, distributed={"watchdog_s": 60})
    result, seconds = run.run()
    named = [line for line in error_lines(result.stderr) if "rank 0 failed in" in line]
    others = sorted(line.split(")")[0] for line in named) == [f"error (rank {r}" for r in range(1, processes)]
    traceback = "RuntimeError: injected in on_eval" in result.stderr
    ok = result.returncode != 0 and others and traceback and seconds <= 30
    outcome = (
        f"exit {result.returncode}, {len(named)} rank(s) name rank 0, traceback {'shown' if traceback else 'missing'}"
    )
    return Outcome("exception in on_eval on the main process", processes, ok, outcome, seconds, run.on_disk())


def slow_main_write(work: Path, processes: int) -> Outcome:
    """Each rename on the main process takes twice the stall bound: the others wait under the
    long-work bound, no stall, exit 0."""
    run = Run(
        work,
        processes,
        {"slow_rename_s": 2 * WATCHDOG_S / 5},
        training={"best_metric": "reverse_kl"},
        distributed={"watchdog_s": WATCHDOG_S / 5},
    )
    result, seconds = run.run()
    stalls = list(run.out.glob("stall-rank*.txt"))
    ok = result.returncode == 0 and not stalls
    outcome = f"exit {result.returncode}, {len(stalls)} stall report(s)"
    return Outcome("main process's renames slower than the stall bound", processes, ok, outcome, seconds, run.on_disk())


def output_not_shared(work: Path, processes: int) -> Outcome:
    """Ranks started in different directories with a relative output_dir (nodes with local
    disks): every rank refuses with one line naming the shared filesystem."""
    label = "output directory not shared by every rank"
    if processes == 1:
        return Outcome(label, 1, True, "not applicable: one rank", 0.0, "nothing")
    run = Run(work, processes, output_dir="out")
    port = free_port()
    start = time.monotonic()
    procs = []
    for rank in range(processes):
        node = work / f"node{rank}"
        node.mkdir(exist_ok=True)
        cmd = [sys.executable, str(ROOT / "scripts" / "train_stage2.py"), *run.args]
        env = worker_env(rank, processes, port)
        procs.append(subprocess.Popen(cmd, cwd=node, env=env, stderr=subprocess.PIPE, text=True))
    stderr = "".join(wait(proc)[2] for proc in procs)
    seconds = time.monotonic() - start
    refused = every_rank_says(stderr, processes, "shared by every node")
    codes = sorted({proc.returncode for proc in procs})
    ok = refused and codes == [2]
    outcome = f"exit {codes}, {'every rank refused' if refused else 'not refused by every rank'}"
    return Outcome(label, processes, ok, outcome, seconds, "nothing")


SCENARIOS: dict[str, Callable[[Path, int], Outcome]] = {
    "kill_one_rank": kill_one_rank,
    "freeze_one_rank": freeze_one_rank,
    "nan_on_one_rank": nan_on_one_rank,
    "init_missing": bad_init("missing"),
    "init_truncated": bad_init("truncated"),
    "init_pickle_with_code": bad_init("pickle_with_code"),
    "kill_during_checkpoint": kill_during_checkpoint,
    "terminate_one_rank": terminate_one_rank,
    "terminate_while_peer_frozen": terminate_while_peer_frozen,
    "eval_smaller_than_world": eval_size(1, "eval set of 1 sample"),
    "uneven_shards": eval_size(7, "eval set of 7 (uneven shards)"),
    "empty_eval": eval_size(0, "empty eval set"),
    "one_rank_collective": one_rank_collective,
    "fresh_start_into_old_run": fresh_start_into_old_run,
    "resume_other_shape": resume_other_shape,
    "error_on_main_process": error_on_main_process,
    "slow_main_write": slow_main_write,
    "output_not_shared": output_not_shared,
    "restart_torchrun": restart_after_kill("torchrun"),
    "restart_accelerate": restart_after_kill("accelerate"),
}


def run_scenario(name: str, processes: int, work: Path | None = None) -> Outcome:
    """Run one scenario in a fresh directory (a temporary one unless ``work`` is given)."""
    if work is not None:
        return SCENARIOS[name](work, processes)
    with tempfile.TemporaryDirectory() as tmp:
        return SCENARIOS[name](Path(tmp), processes)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--processes", type=int, nargs="+", default=[1, 2, 4])
    p.add_argument("--scenarios", nargs="+", default=list(SCENARIOS), choices=list(SCENARIOS))
    p.add_argument("--repeat", type=int, default=1, help="run each row this many times (intermittent faults)")
    args = p.parse_args()
    print("| scenario | processes | within bound | outcome | seconds | left on disk |")
    print("|---|---|---|---|---|---|")
    failures = 0
    rows = [(name, processes) for name in args.scenarios for processes in args.processes]
    for name, processes in [row for row in rows for _ in range(args.repeat)]:
        row = run_scenario(name, processes)
        failures += not row.ok
        print(
            f"| {row.scenario} | {row.processes} | {'yes' if row.ok else 'NO'} | {row.outcome} | "
            f"{row.seconds:.1f} | {row.on_disk} |",
            flush=True,
        )
    sys.exit(1 if failures else 0)


if __name__ == "__main__":
    main()
