"""Faults of the disk a run writes to: full at the first checkpoint, too full for the next
one, read-only, removed while the run trains. The output directory is a small tmpfs mounted
for the scenario (``mount -t tmpfs`` needs root; without it the row says it was skipped)."""

from __future__ import annotations

import contextlib
import shutil
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

from harness.faultmatrix.runs import HARD_TIMEOUT, Outcome, Run, error_lines, every_rank_says, wait, with_tail

#: models whose checkpoints take 3.2 MB, so that a disk of a few MB fills at a known write
WIDE = {"hidden_dim": 256, "num_layers": 3}
CHECKPOINT_MB = 3.2
SKIPPED = "skipped: "


@contextlib.contextmanager
def small_disk(path: Path, size_mb: float) -> Iterator[str | None]:
    """A tmpfs of ``size_mb`` at ``path`` for the block (unmounted after); yields None, or why
    there is none."""
    path.mkdir(parents=True, exist_ok=True)
    mounted = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={int(size_mb * 1024)}k", "tmpfs", str(path)],
        capture_output=True,
        text=True,
    )
    if mounted.returncode != 0:
        yield f"mount -t tmpfs failed ({mounted.stderr.strip() or mounted.returncode}): needs root"
        return
    try:
        yield None
    finally:
        subprocess.run(["umount", "-l", str(path)], capture_output=True)


def remount(path: Path, options: str) -> None:
    subprocess.run(["mount", "-o", f"remount,{options}", str(path)], check=True, capture_output=True)


def leftovers(run: Run) -> list[str]:
    """Partial files and directories a failed write left in the output directory."""
    return sorted(str(p.relative_to(run.out)) for p in run.out.rglob(".partial-*"))


def whole_records(run: Run) -> bool:
    """Whether every line of the run's metrics.jsonl is a whole record."""
    import json

    try:
        [json.loads(line) for line in (run.out / "metrics.jsonl").read_text().splitlines()]
    except (OSError, ValueError):
        return False
    return True


def one_line_each(stderr: str, processes: int, text: str) -> tuple[bool, str]:
    """Whether every rank printed one error line and rank 0's holds ``text``; rank 0's line."""
    lines = error_lines(stderr)
    first = next((line for line in lines if line.startswith("error (rank 0)")), "no error line from rank 0")
    return every_rank_says(stderr, processes, "") and text in first, first


def full_at_first_checkpoint(work: Path, processes: int) -> Outcome:
    """The disk fills while the first checkpoint is written: every rank one line naming the
    full disk, no partial files, the records whole; with space, --resume latest runs to the end."""
    label = "disk full at the first checkpoint"
    with small_disk(work / "out", 2.0) as unavailable:
        if unavailable:
            return Outcome(label, processes, True, SKIPPED + unavailable, 0.0, "nothing")
        run = Run(work, processes, generator=WIDE, discriminator=WIDE, training={"max_steps": 6, "save_every": 3})
        failed, seconds = run.run()
        said, first = one_line_each(failed.stderr, processes, "no space left on the device writing")
        clean = not leftovers(run) and whole_records(run) and (run.out / "config.yaml").is_file()
        kept = run.on_disk()
        remount(run.out, "size=16m")
        resumed, _ = run.run("--resume", "latest")
        train = run.records("train")
        ok = failed.returncode != 0 and said and clean and resumed.returncode == 0 and train[-1]["step"] == 6
        outcome = (
            f"exit {failed.returncode}: {first.split(': ', 1)[-1][:110]}; "
            f"{'no partial files' if clean else 'partial files: ' + ', '.join(leftovers(run))}; "
            f"with space: exit {resumed.returncode}"
        )
        return Outcome(label, processes, ok, with_tail(outcome, ok, failed.stderr, 3, 400), seconds, kept)


def too_full_for_the_next(work: Path, processes: int) -> Outcome:
    """The disk holds one checkpoint but not the next: the write is refused before it starts,
    at the same step on every rank; the checkpoint before it kept; with space, the run resumes
    from it and ends."""
    label = "disk too full for the next checkpoint"
    with small_disk(work / "out", CHECKPOINT_MB + 1.8) as unavailable:
        if unavailable:
            return Outcome(label, processes, True, SKIPPED + unavailable, 0.0, "nothing")
        training = {"max_steps": 6, "save_every": 2, "keep_checkpoints": 5}
        run = Run(work, processes, generator=WIDE, discriminator=WIDE, training=training)
        failed, seconds = run.run()
        said, first = one_line_each(failed.stderr, processes, "the last complete checkpoint is step-0000002")
        kept = run.on_disk()
        clean = not leftovers(run) and kept.startswith("step-0000002, no final/")
        remount(run.out, "size=16m")
        resumed, _ = run.run("--resume", "latest")
        train = run.records("train")
        from_kept = "step-0000002 at step 2" in resumed.stderr
        ok = failed.returncode != 0 and said and clean and resumed.returncode == 0 and from_kept
        ok = ok and train[-1]["step"] == 6
        outcome = (
            f"exit {failed.returncode}: {first.split(': ', 1)[-1][:110]}; "
            f"with space: exit {resumed.returncode}{', from step-0000002' if from_kept else ', not from step-0000002'}"
        )
        return Outcome(label, processes, ok, with_tail(outcome, ok, failed.stderr, 3, 400), seconds, kept)


def read_only(work: Path, processes: int) -> Outcome:
    """A resume into an output directory remounted read-only: every rank one line naming it,
    exit non-zero, its checkpoint intact; writable again, the resume runs to the end."""
    label = "output directory read-only at a resume"
    with small_disk(work / "out", 16.0) as unavailable:
        if unavailable:
            return Outcome(label, processes, True, SKIPPED + unavailable, 0.0, "nothing")
        run = Run(work, processes, training={"max_steps": 6, "save_every": 3})
        run.run("--set", "training.max_steps=3")
        remount(run.out, "ro")
        failed, seconds = run.run("--resume", "latest")
        said, first = one_line_each(failed.stderr, processes, "the output directory is read-only writing")
        remount(run.out, "rw")
        resumed, _ = run.run("--resume", "latest")
        train = run.records("train")
        ok = failed.returncode != 0 and said and resumed.returncode == 0 and train[-1]["step"] == 6
        outcome = f"exit {failed.returncode}: {first.split(': ', 1)[-1][:110]}; writable: exit {resumed.returncode}"
        return Outcome(label, processes, ok, with_tail(outcome, ok, failed.stderr, 3, 400), seconds, run.on_disk())


def removed_while_training(work: Path, processes: int) -> Outcome:
    """The output directory removed while the run trains (a clean-up job, an unmounted disk):
    every rank one line naming it gone, exit non-zero, in seconds."""
    label = "output directory removed while training"
    run = Run(work, processes, {"step_sleep_s": 0.05}, training={"max_steps": 100000, "save_every": 100000})
    proc = run.start()
    run.rank_pids()
    start = time.monotonic()
    shutil.rmtree(run.out)
    code, _, stderr = wait(proc, HARD_TIMEOUT)
    seconds = time.monotonic() - start
    said, first = one_line_each(stderr, processes, "the output directory is gone")
    ok = code not in (0, -999) and said and seconds <= 30
    outcome = f"exit {code}: {first.split(': ', 1)[-1][:110]}"
    return Outcome(label, processes, ok, with_tail(outcome, ok, stderr, 3, 400), seconds, run.on_disk())
