"""A run owns its output directory, and resume refuses a checkpoint of another run shape."""

from __future__ import annotations

import json

import pytest
from helpers import check, launch, write_run

from trainer.state.checkpoint import STATE_NAME, stale_checkpoints


def error_lines(stderr: str) -> list[str]:
    return [line for line in stderr.splitlines() if line.startswith("error (rank")]


def checkpoint_names(out):
    return sorted(p.name for p in (out / "checkpoints").iterdir())


@pytest.mark.timeout(120)
def test_a_fresh_start_into_a_directory_with_checkpoints_is_refused(tmp_path):
    config = write_run(tmp_path, {"training": {"max_steps": 4, "save_every": 2, "keep_checkpoints": 5}})
    out = tmp_path / "out"
    args = ["--config", str(config), "--device", "cpu"]
    check(launch(args, 1))
    before = {p.name: (p / STATE_NAME).read_text() for p in (out / "checkpoints").iterdir()}
    metrics = (out / "metrics.jsonl").read_text()

    again = launch([*args, "--set", "training.max_steps=2", "--set", "training.save_every=1"], 1)
    assert again.returncode == 2, again.stderr[-3000:]
    (line,) = error_lines(again.stderr)
    assert str(out) in line and "--resume latest" in line and "--output-dir" in line and "--overwrite" in line
    # nothing written before is lost
    assert {p.name: (p / STATE_NAME).read_text() for p in (out / "checkpoints").iterdir()} == before
    assert (out / "metrics.jsonl").read_text() == metrics

    # --overwrite starts anew: the earlier run's checkpoints and records go first
    check(launch([*args, "--overwrite", "--set", "training.max_steps=2", "--set", "training.save_every=1"], 1))
    assert checkpoint_names(out) == ["step-0000001", "step-0000002"]
    assert [json.loads(r)["step"] for r in (out / "metrics.jsonl").read_text().splitlines()][-1] == 2


def test_pruning_keeps_the_checkpoint_just_written_and_other_runs_checkpoints(tmp_path):
    root = tmp_path / "checkpoints"
    for step, run_id in [(10, "old"), (20, "old"), (40, "old"), (2, "this"), (4, "this"), (6, "this")]:
        (root / f"step-{step:07d}").mkdir(parents=True)
        run = {"step": step, "run_id": run_id}
        # this run's first checkpoint in the flat record of checkpoints before 2026-12-05
        record = run if (step, run_id) in [(2, "this"), (10, "old")] else {"format": 2, "run": run}
        (root / f"step-{step:07d}" / STATE_NAME).write_text(json.dumps(record))
    # keep 2 of this run's: step 2 goes, step 6 (just written) and 4 stay, the old run's stay
    assert stale_checkpoints(tmp_path, "this", 2, root / "step-0000006") == [root / "step-0000002"]
    # the one just written is kept even when it is not the newest by step
    assert stale_checkpoints(tmp_path, "this", 1, root / "step-0000004") == [
        root / "step-0000002",
        root / "step-0000006",
    ]


@pytest.mark.timeout(200)
@pytest.mark.parametrize(
    ("key", "value"),
    [
        ("training.gradient_accumulation_steps", 3),
        ("training.batch_size", 8),
        ("training.d_steps_per_g_step", 2),
    ],
)
def test_resume_refuses_another_run_shape(tmp_path, key, value):
    config = write_run(tmp_path, {"training": {"max_steps": 4, "save_every": 2, "gradient_accumulation_steps": 2}})
    args = ["--config", str(config), "--device", "cpu"]
    check(launch([*args, "--set", "training.max_steps=2"], 1))
    result = launch([*args, "--resume", "latest", "--set", f"{key}={value}"], 1)
    assert result.returncode == 2, result.stderr[-3000:]
    (line,) = error_lines(result.stderr)
    assert key in line and "step-0000002" in line, line


@pytest.mark.timeout(300)
@pytest.mark.parametrize(("written", "resumed"), [(2, 1), (1, 2)])
def test_resume_on_another_number_of_processes_or_one_line_on_every_rank(tmp_path, written, resumed):
    # 2 -> 1 continues with the accumulation doubled (tests/test_world_size.py checks the run);
    # 1 -> 2 cannot: one micro-batch a phase does not split over 2 processes
    config = write_run(tmp_path, {"training": {"max_steps": 4, "save_every": 2}})
    args = ["--config", str(config), "--device", "cpu"]
    check(launch([*args, "--set", "training.max_steps=2"], written))
    result = launch([*args, "--resume", "latest"], resumed)
    if written > resumed:
        check(result)
        assert "this run has 1: training.gradient_accumulation_steps 1 -> 2" in result.stderr
        return
    assert result.returncode != 0, result.stderr[-3000:]
    lines = error_lines(result.stderr)
    assert len(lines) == resumed, result.stderr[-3000:]
    cannot = "2 processes cannot share its 1 micro-batches of 4: resume with a number of processes that divides 1"
    assert cannot in lines[0] or cannot in lines[1], lines
    assert all("checking the checkpoint's run" in line or cannot in line for line in lines), lines


def test_fsync_tree_flushes_every_file_and_directory_before_a_rename(tmp_path, monkeypatch):
    import os

    from trainer.state import checkpoint

    tree = tmp_path / ".partial"
    (tree / "sub").mkdir(parents=True)
    for name in ("a.safetensors", "sub/b.bin"):
        (tree / name).write_text(name)
    flushed = []
    real = os.fsync
    monkeypatch.setattr(os, "fsync", lambda fd: (flushed.append(os.readlink(f"/proc/self/fd/{fd}")), real(fd)))
    checkpoint.fsync_tree(tree)
    expected = {str(tree), str(tree / "sub"), str(tree / "a.safetensors"), str(tree / "sub" / "b.bin")}
    assert set(flushed) == expected
    assert flushed[-1] == str(tree)  # the directory after its entries


@pytest.mark.timeout(120)
def test_every_checkpoint_and_export_is_flushed_before_its_rename(tmp_path, monkeypatch):
    from trainer import Trainer, load_config
    from trainer.state import checkpoint

    flushed = []
    real = checkpoint.fsync_tree
    monkeypatch.setattr(checkpoint, "fsync_tree", lambda root: (flushed.append(root), real(root)))
    config = write_run(tmp_path, {"training": {"max_steps": 4, "save_every": 2, "best_metric": "reverse_kl"}})
    Trainer(load_config(config), device="cpu").fit()
    out = tmp_path / "out"
    names = [(path.parent.name, path.name) for path in flushed]
    assert ("checkpoints", ".partial-step-0000002") in names and ("checkpoints", ".partial-step-0000004") in names
    assert ("final", ".partial-generator") in names and ("final", ".partial-discriminator") in names
    assert ("best", ".partial-generator") in names
    assert not any(path.exists() for path in flushed)  # each was renamed after its flush
    assert (out / "checkpoints" / "step-0000004").is_dir()
