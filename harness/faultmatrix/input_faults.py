"""Faults in what a run reads and writes: bad init weights, a checkpoint cut by a kill or
damaged after it was written, eval sets that do not split evenly, a run directory of another
run or shape, an output directory not shared between nodes."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

from harness.faultmatrix.runs import (
    HARD_TIMEOUT,
    Outcome,
    Run,
    error_lines,
    every_rank_says,
    left_alive,
    wait,
    with_tail,
)
from harness.launch import ROOT, free_port, worker_env


def bad_init(kind: str) -> Callable[[Path, int], Outcome]:
    def scenario(work: Path, processes: int) -> Outcome:
        """A missing, truncated or code-executing init checkpoint: a clear error, <= 15 s."""
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
        ranks_reporting = {line.split(")")[0] for line in lines}
        if kind == "missing":
            # Caught while reading the config, before any process group: each rank that reads
            # it reports it, but the launcher stops the others once the first one exits, so
            # one line or more, every one of them naming the key.
            ok = bool(lines) and all("key 'init.discriminator'" in line for line in lines)
        else:
            # Unreadable files are agreed inside the process group: every rank reports it.
            ok = len(ranks_reporting) == processes
        ok = ok and result.returncode != 0 and seconds <= 15
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
    survivors = left_alive(list(pids.values()))
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
    from trainer.state.resuming import resolve_resume

    latest = resolve_resume("latest", run.out, verify=False)
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
        f"killed in {caught}{'' if mid_write else ' (as its write ended)'}"
        f"{f', {len(survivors)} rank(s) alive after it' if survivors else ''}; resumed from "
        f"{latest.name if latest else None}: exit {resumed.returncode}",
        seconds,
        run.on_disk(),
    )


#: how each damaged-checkpoint scenario harms the newest checkpoint: the file, what is done to it
DAMAGE: dict[str, tuple[str, str]] = {
    "truncated": ("model.safetensors", "cut by 100 bytes"),
    "flipped_byte": ("optimizer.bin", "with one byte flipped"),
    "missing": ("scheduler.bin", "deleted"),
}


def damage_file(path: Path, kind: str) -> None:
    """Harm one file of a checkpoint the way ``kind`` names (see DAMAGE)."""
    if kind == "truncated":
        path.write_bytes(path.read_bytes()[:-100])
    elif kind == "flipped_byte":
        data = bytearray(path.read_bytes())
        data[len(data) // 2] ^= 0xFF
        path.write_bytes(bytes(data))
    else:
        path.unlink()


def damaged_checkpoint(kind: str) -> Callable[[Path, int], Outcome]:
    def scenario(work: Path, processes: int) -> Outcome:
        """A file of the newest checkpoint damaged after it was written: ``--resume`` with its
        path is refused by every rank with one line naming the file; ``--resume latest`` skips
        it with one line, resumes from the checkpoint before and reaches max_steps."""
        name, harm = DAMAGE[kind]
        run = Run(work, processes, training={"max_steps": 6, "save_every": 3, "keep_checkpoints": 5})
        first = run.run_forked()
        newest = run.out / "checkpoints" / "step-0000006"
        if first.returncode != 0 or not newest.is_dir():
            return Outcome(f"checkpoint's {name} {harm}", processes, False, "the first run failed", 0.0, run.on_disk())
        damage_file(newest / name, kind)
        named, seconds = run.run("--resume", str(newest))
        refused = named.returncode != 0 and every_rank_says(named.stderr, processes, "")
        names_file = f"{newest}: cannot resume from this checkpoint: {name}" in named.stderr
        latest, _ = run.run("--resume", "latest")
        skips = [line for line in latest.stderr.splitlines() if "--resume latest: skipped step-0000006" in line]
        train = run.records("train")
        resumed = "step-0000003 at step 3" in latest.stderr and train and train[-1]["step"] == 6
        ok = refused and names_file and latest.returncode == 0 and len(skips) == 1 and bool(resumed)
        outcome = (
            f"--resume PATH: exit {named.returncode}, {'names ' + name if names_file else 'file not named'}; "
            f"--resume latest: exit {latest.returncode}, {len(skips)} skip line(s), "
            f"{'resumed at step 3 to step 6' if resumed else 'did not resume at step 3'}"
        )
        return Outcome(
            f"checkpoint's {name} {harm}",
            processes,
            ok,
            with_tail(outcome, ok, named.stderr + latest.stderr, 3, 400),
            seconds,
            run.on_disk(),
        )

    return scenario


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


def fresh_start_into_old_run(work: Path, processes: int) -> Outcome:
    """A fresh start into a directory that holds an earlier run's checkpoints: refused by
    every rank with one line, the earlier checkpoints intact."""
    run = Run(work, processes)
    run.run_forked()
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
    run.run_forked()
    result, seconds = run.run("--resume", "latest", "--set", "training.gradient_accumulation_steps=2")
    named = every_rank_says(result.stderr, processes, "training.gradient_accumulation_steps")
    ok = result.returncode != 0 and named
    outcome = f"exit {result.returncode}, {'every rank names the key' if named else 'key not named by every rank'}"
    return Outcome("resume with another accumulation length", processes, ok, outcome, seconds, run.on_disk())


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
