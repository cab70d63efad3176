"""Faults of one rank's process: killed, frozen, terminated, a NaN, a collective of its own,
an error, a slow write; and the launcher's restart after a kill."""

from __future__ import annotations

import contextlib
import os
import signal
import time
from collections.abc import Callable
from pathlib import Path

from harness.faultmatrix.runs import (
    HARD_TIMEOUT,
    WATCHDOG_S,
    Outcome,
    Run,
    alive,
    error_lines,
    restart_after_kill_outcome,
    same_as_uninterrupted,
    start_long_run,
    wait,
)


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


def terminate_one_rank(work: Path, processes: int) -> Outcome:
    """SIGTERM to one rank: an agreed checkpoint on every rank, exit 0, exact resume."""
    training = {"max_steps": 200, "save_every": 1000, "eval_every": 1000, "log_every": 50}
    whole = Run(work / "whole", processes, training=training)
    whole.run_forked()
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
        --max-restarts 1 with --resume latest (see restart_after_kill_outcome)."""

        def launch(run: Run) -> tuple[list[int], str, float]:
            result, seconds = run.run("--resume", "latest")
            return [result.returncode], result.stderr, seconds

        label = f"SIGKILL one rank under {launcher} --max-restarts 1"
        return restart_after_kill_outcome(work, processes, label, processes, launch, launcher=launcher, max_restarts=1)

    return scenario


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
