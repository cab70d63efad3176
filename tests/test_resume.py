"""A run resumed from a checkpoint ends bit-identical to the uninterrupted run."""

from __future__ import annotations

import json
import shutil

import pytest
import torch
from helpers import check, fork_launch, launch, pacgan_models, records, write_run
from safetensors.torch import load_file

from trainer.state.checkpoint import STATE_NAME
from trainer.state.resuming import resolve_resume

MEASURED = ("samples_per_s", "steps_per_s", "peak_memory_mb")  # machine measurements, not results
#: the row of test_resume_is_bit_identical on the real launcher (accelerate launch); the other
#: rows fork their workers (harness.forked), which is what their numbers do not depend on
ON_THE_LAUNCHER = (2, 0.8, "pacgan", 2, "alternating")


def as_format_1(record):
    """A record as checkpoints before 2026-12-05 wrote it: every part's state in one flat mapping."""
    flat = {**record["run"], **record["data"], "shape": record["shape"]}
    for role, name in (("discriminator", "d"), ("generator", "g")):
        part = record[role]
        flat[f"{name}_steps"], flat[f"skipped_{name}"] = part["steps"], part["skipped"]
        flat[f"consecutive_skips_{name}"] = part["consecutive_skips"]
    if "ema" in record:
        flat["ema_updates"] = record["ema"]["updates"]
    return flat


def weights(directory):
    roles = [path.name for path in directory.iterdir() if (path / "model.safetensors").is_file()]
    return {role: load_file(directory / role / "model.safetensors") for role in roles}


@pytest.mark.timeout(420)
@pytest.mark.parametrize(
    ("processes", "ema", "models", "record_format", "updates"),
    [
        (1, 0.0, "mlp", 2, "alternating"),
        (2, 0.0, "mlp", 2, "alternating"),
        (1, 0.8, "mlp", 2, "alternating"),
        (2, 0.8, "mlp", 2, "alternating"),
        (1, 0.0, "pacgan", 2, "alternating"),
        (2, 0.8, "pacgan", 2, "alternating"),
        (2, 0.0, "pacgan", 2, "simultaneous"),
        (2, 0.8, "mlp", 1, "alternating"),  # a checkpoint written before each part had its own key
    ],
)
def test_resume_is_bit_identical(tmp_path, processes, ema, models, record_format, updates):
    # 40 samples in batches of 4 with 2 micro-batches per phase: the checkpoint at step 3
    # falls in the middle of an epoch, with Adam state, a decaying learning rate and the
    # noise generator all mid-way (and the average of the generator, from step 1 with warm-up).
    # PacGAN's models add BatchNorm's running statistics (and maxout) to what must resume; in
    # 2 processes, refreshed before each eval.
    config = write_run(
        tmp_path,
        {
            **({"model": pacgan_models(tmp_path)} if models == "pacgan" else {}),
            **({"eval": {"batch_norm_refresh": 2}} if models == "pacgan" and processes == 2 else {}),
            "training": {
                "max_steps": 6,
                "save_every": 3,
                "eval_every": 2,
                "gradient_accumulation_steps": 2,
                "best_metric": "reverse_kl",
                "ema_decay": ema,
                "ema_start": 1,
                "ema_warmup": True,
                "updates": updates,
            },
            "optim": {"generator": {"scheduler": "linear"}, "discriminator": {"scheduler": "cosine"}},
            "data": {"train_size": 40},
        },
    )
    out = tmp_path / "out"
    args = ["--config", str(config), "--device", "cpu"]
    run = launch if (processes, ema, models, record_format, updates) == ON_THE_LAUNCHER else fork_launch
    check(run(args, processes))
    uninterrupted = weights(out / "final")
    uninterrupted_records = records(out)
    shutil.copytree(out / "final", tmp_path / "final-uninterrupted")

    # Each part of the run keeps its state under its own key.
    state_file = out / "checkpoints" / "step-0000003" / STATE_NAME
    record = json.loads(state_file.read_text())
    parts = {"format", "shape", "run", "data", "discriminator", "generator", *(["ema"] if ema else [])}
    assert set(record) == parts and record["format"] == 3 and record["run"]["step"] == 3
    assert record["generator"] == {"steps": 3, "skipped": 0, "consecutive_skips": 0}
    if record_format == 1:  # and, as then, without digests of its files
        state_file.write_text(json.dumps(as_format_1(record)))
        (state_file.parent / "digests.json").unlink()

    # Without the old records, those the resumed run writes show where it started.
    (out / "metrics.jsonl").unlink()
    result = check(run([*args, "--resume", str(out / "checkpoints" / "step-0000003")], processes))
    assert "at step 3" in result.stderr
    resumed = weights(out / "final")
    assert sorted(resumed) == sorted(["generator", "discriminator", *(["generator_raw"] if ema else [])])
    for role in resumed:
        assert resumed[role].keys() == uninterrupted[role].keys()
        for key, value in resumed[role].items():
            assert torch.equal(value, uninterrupted[role][key]), f"{role}.{key} differs after resume"

    resumed_records = records(out)
    pairs = [(r["split"], r["step"]) for r in resumed_records]
    assert len(pairs) == len(set(pairs))
    strip = lambda rs: [{k: v for k, v in r.items() if k not in MEASURED} for r in rs]  # noqa: E731
    assert min(pairs, key=lambda p: p[1])[1] == 4
    assert strip(resumed_records) == strip([r for r in uninterrupted_records if r["step"] > 3])
    assert all(r["world_size"] == processes for r in resumed_records)


@pytest.mark.timeout(200)
def test_resume_is_exact_with_dropout_drawn_from_the_global_generator(tmp_path):
    # The checkpoint at step 3 falls mid-epoch (40 samples, batches of 4): the resumed run
    # builds its data iterator at another point of the global generator's stream than the
    # uninterrupted run did, which must not shift the dropout masks drawn after it.
    config = write_run(
        tmp_path,
        {
            "task": "fixture_tasks:DropoutMixture",
            "training": {"max_steps": 6, "save_every": 3},
            "data": {"train_size": 40},
        },
    )
    out = tmp_path / "out"
    args = ["--config", str(config), "--device", "cpu"]
    check(launch(args, 1))
    uninterrupted = weights(out / "final")
    check(launch([*args, "--resume", str(out / "checkpoints" / "step-0000003")], 1))
    resumed = weights(out / "final")
    for role in resumed:
        for key, value in resumed[role].items():
            assert torch.equal(value, uninterrupted[role][key]), f"{role}.{key} differs after resume"


def test_latest_is_the_newest_complete_checkpoint(tmp_path, process_state):
    root = tmp_path / "checkpoints"
    for name, complete in [
        ("step-0000003", True),
        ("step-0000012", True),
        ("step-0000020", False),  # no trainer_state.json: its writer died
        (".partial-step-0000030", True),  # never renamed
    ]:
        (root / name).mkdir(parents=True)
        if complete:
            (root / name / STATE_NAME).write_text("{}")
    # records of the first layout, written before checkpoints held digests: taken unverified
    assert resolve_resume("latest", tmp_path, verify=True) == root / "step-0000012"
    assert resolve_resume("latest", tmp_path / "elsewhere", verify=True) is None
