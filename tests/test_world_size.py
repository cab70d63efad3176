"""A run is a function of its seed and config, not of its number of processes: one global
batch (processes x batch_size x accumulation) takes the same samples and noise at 1, 2 and 4
processes, and a checkpoint resumes on another number, the accumulation adapted."""

from __future__ import annotations

import json
import shutil

import pytest
import torch
from helpers import check, fork_launch, launch, records, write_run
from safetensors.torch import load_file

from trainer.contract.errors import CheckpointError
from trainer.state.resuming import resumed_accumulation

BATCH, GLOBAL = 2, 8  # micro-batches of 2 samples, 4 of them a phase over all ranks
STEPS, SAVED = 6, 3
LOSSES = ("d_loss", "g_loss", "d_real", "d_fake")


def accumulation(processes: int) -> int:
    return GLOBAL // (BATCH * processes)


def run_at(tmp_path, processes: int, accumulate: int | None = None, run=fork_launch):
    """A run of STEPS steps at ``processes``, its checkpoint at step SAVED; its output directory.
    ``run``: how it starts (workers forked from the test's process, or ``launch``: the real
    launcher; each test has a run of that kind).
    40 samples: an epoch is 20 micro-batches, 5 optimizer phases; a step takes 2 (one of the
    discriminator, one of the generator, which takes no data) so epochs end mid-step."""
    config = write_run(
        tmp_path,
        {
            "task": "fixture_tasks:IndexedTraining",
            "training": {
                "max_steps": STEPS,
                "batch_size": BATCH,
                "gradient_accumulation_steps": accumulate or accumulation(processes),
                "save_every": SAVED,
                "eval_every": 100,
                "keep_checkpoints": 5,
                "ema_decay": 0.8,
                "ema_start": 1,
            },
            "optim": {"generator": {"scheduler": "linear"}, "discriminator": {"scheduler": "cosine"}},
            "data": {"train_size": 40},
        },
    )
    result = check(run(["--config", str(config), "--device", "cpu"], processes))
    out = tmp_path / "out"
    assert all(r["world_size"] == processes for r in records(out)), result.stderr[-2000:]
    return config, out


def step_samples(out, processes: int, accumulate: int) -> list[list[int]]:
    """The sorted indices of the real samples of each optimizer step, over every rank."""
    per_rank = [
        [json.loads(line) for line in (out / f"indices-rank{rank}.jsonl").read_text().splitlines()]
        for rank in range(processes)
    ]
    steps = len(per_rank[0]) // accumulate
    assert all(len(taken) == steps * accumulate for taken in per_rank)
    return [
        sorted(i for taken in per_rank for batch in taken[s * accumulate : (s + 1) * accumulate] for i in batch)
        for s in range(steps)
    ]


def losses(out) -> list[dict[str, float]]:
    return [{k: r[k] for k in LOSSES} for r in records(out, "train")]


def close(a: list[dict[str, float]], b: list[dict[str, float]], relative: float) -> bool:
    """Whether two runs' losses agree to ``relative``, step by step."""
    if len(a) != len(b):
        return False
    return all(abs(x[k] - y[k]) <= relative * max(abs(y[k]), 1e-6) for x, y in zip(a, b, strict=True) for k in x)


@pytest.mark.timeout(400)
def test_one_global_batch_is_the_same_run_at_1_2_and_4_processes(tmp_path):
    runs = {p: run_at(tmp_path / f"w{p}", p, run=launch if p == 2 else fork_launch)[1] for p in (1, 2, 4)}
    samples = {p: step_samples(out, p, accumulation(p)) for p, out in runs.items()}
    assert samples[1] == samples[2] == samples[4]
    # every sample once per epoch: 40 samples, 8 a step
    assert sorted(i for step in samples[1][:5] for i in step) == list(range(40))
    for p in (2, 4):
        assert close(losses(runs[p]), losses(runs[1]), 1e-5), (losses(runs[p]), losses(runs[1]))


@pytest.mark.timeout(500)
@pytest.mark.parametrize(("written", "resumed"), [(2, 1), (2, 4), (4, 2)])
def test_a_checkpoint_resumes_on_another_number_of_processes(tmp_path, written, resumed):
    run = launch if (written, resumed) == (2, 1) else fork_launch  # one row on the real launcher
    config, out = run_at(tmp_path / "whole", written, run=run)
    whole_samples = step_samples(out, written, accumulation(written))
    whole_losses = losses(out)
    # the resumed run in a copy of the directory at the checkpoint, without the records after it
    again = tmp_path / "again"
    shutil.copytree(out, again)
    for name in ("metrics.jsonl", *(p.name for p in again.glob("indices-rank*.jsonl"))):
        (again / name).unlink()
    for later in again.glob("checkpoints/step-*"):
        if later.name != f"step-{SAVED:07d}":
            shutil.rmtree(later)
    args = ["--config", str(config), "--device", "cpu", "--output-dir", str(again), "--resume", "latest"]
    result = check(run(args, resumed))
    assert f"this run has {resumed}: training.gradient_accumulation_steps {accumulation(written)} -> " in result.stderr
    assert all(r["world_size"] == resumed for r in records(again))
    assert step_samples(again, resumed, accumulation(resumed)) == whole_samples[SAVED:]
    after = losses(again)
    assert [r["step"] for r in records(again, "train")][0] == SAVED + 1
    assert close(after[:3], whole_losses[SAVED : SAVED + 3], 1e-5), (after[:3], whole_losses[SAVED : SAVED + 3])
    # the optimizers, schedules and the generator's average carried over: the final weights agree
    for role in ("generator", "generator_raw", "discriminator"):
        ours, theirs = (load_file(d / "final" / role / "model.safetensors") for d in (again, out))
        assert ours.keys() == theirs.keys()
        for key, value in ours.items():
            torch.testing.assert_close(value, theirs[key], rtol=1e-5, atol=1e-6, msg=f"{role}.{key}")


def shape(processes, batch=BATCH, accumulate=1, d_steps=1, task="gaussian_mixture", sharded=False):
    return {
        "sharded": sharded,
        "processes": processes,
        "training.batch_size": batch,
        "training.gradient_accumulation_steps": accumulate,
        "training.d_steps_per_g_step": d_steps,
        "task": task,
    }


def test_what_cannot_continue_is_one_line(tmp_path):
    checkpoint = tmp_path / "step-0000003"
    checkpoint.mkdir()
    record = {"format": 3, "shape": shape(4, accumulate=2), "data": {"micro_batches": 24}}
    (checkpoint / "trainer_state.json").write_text(json.dumps(record))
    assert resumed_accumulation(checkpoint, shape(4, accumulate=2)) == 2
    assert resumed_accumulation(checkpoint, shape(2, accumulate=2)) == 4  # the config as written: adapted
    assert resumed_accumulation(checkpoint, shape(8, accumulate=1)) == 1  # the config adapted by hand
    assert resumed_accumulation(checkpoint, shape(1, accumulate=8)) == 8
    refusals = {
        "3 processes cannot share its 8 micro-batches of 2: resume with a number of processes that divides 8": shape(
            3, accumulate=2
        ),
        "2 processes x accumulation 3 is another: set training.gradient_accumulation_steps to 2": shape(
            2, accumulate=3
        ),
        "written with training.gradient_accumulation_steps=2, this run has 1": shape(4, accumulate=1),
        "written with training.batch_size=2, this run has 4": shape(2, batch=4, accumulate=2),
        "written with training.d_steps_per_g_step=1, this run has 2": shape(2, accumulate=2, d_steps=2),
        "written by a run of task 'gaussian_mixture', this run's is 'oracle_text': another recipe": shape(
            4, accumulate=2, task="oracle_text"
        ),
        "models were whole on each process .DDP or one process., this run's are sharded with FSDP2": shape(
            4, accumulate=2, sharded=True
        ),
    }
    for message, current in refusals.items():
        with pytest.raises(CheckpointError, match=message):
            resumed_accumulation(checkpoint, current)
    # a checkpoint of the per-world data order continues on as many processes only
    (checkpoint / "trainer_state.json").write_text(json.dumps({**record, "data": {"epoch": 0, "position": 3}}))
    with pytest.raises(CheckpointError, match="only continues on as many; this run has 2: resume with 4 processes"):
        resumed_accumulation(checkpoint, shape(2, accumulate=2))
    assert resumed_accumulation(checkpoint, shape(4, accumulate=2)) == 2
