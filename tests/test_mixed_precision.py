"""One GradScaler serves both optimizers: an overflow in D's gradients skips D's step only and
leaves G's update exactly what it would have been."""

from __future__ import annotations

import pytest
import torch
from fixture_tasks import Overflow
from helpers import write_run

from trainer.config import load_config
from trainer.loop import Trainer
from trainer.runtime import release_accelerator


def step_two_generator(tmp_path, inject: bool):
    """Run step 1, then step 2 with D's step either overflowing (inject) or a no-op (lr 0);
    returns G's weights after step 2 and the facts of D's step. With nonfinite=error, an
    overflow under the GradScaler is still routine: skipped, not an error."""
    training = {"gradient_accumulation_steps": 2, "nonfinite": "error"}
    config = write_run(tmp_path, {"task": "fixture_tasks:Overflow", "training": training})
    trainer = Trainer(load_config(config), device="cpu", scaler=torch.amp.GradScaler("cpu", init_scale=2.0**16))
    try:
        trainer._build_accelerator()
        trainer._setup()
        scaler = trainer.accelerator.scaler
        trainer.discriminator_phase()
        trainer.generator_phase()
        d_before = {k: v.clone() for k, v in trainer.d.model.state_dict().items()}
        scale_before = scaler.get_scale()
        if inject:
            Overflow.armed = True
        else:
            for group in trainer.d.optimizer.param_groups:
                group["lr"] = 0.0
        try:
            trainer.discriminator_phase()
        finally:
            Overflow.armed = False
        facts = {
            "skipped_d": trainer.state.skipped_d,
            "scale_ratio": scaler.get_scale() / scale_before,
            "d_unchanged": all(torch.equal(v, d_before[k]) for k, v in trainer.d.model.state_dict().items()),
        }
        trainer.generator_phase()
        facts["skipped_g"] = trainer.state.skipped_g
        return {k: v.clone() for k, v in trainer.g.model.state_dict().items()}, facts
    finally:
        release_accelerator()


@pytest.mark.timeout(120)
def test_overflow_in_one_model_leaves_the_other_update_exact(tmp_path):
    g_clean, clean = step_two_generator(tmp_path / "clean", inject=False)
    g_overflow, overflow = step_two_generator(tmp_path / "overflow", inject=True)
    assert overflow["skipped_d"] == 1 and overflow["scale_ratio"] == 0.5 and overflow["d_unchanged"]
    assert clean["skipped_d"] == 0 and clean["scale_ratio"] == 1.0 and clean["d_unchanged"]
    assert overflow["skipped_g"] == clean["skipped_g"] == 0
    for key, value in g_clean.items():
        assert torch.equal(g_overflow[key], value), key


@pytest.mark.timeout(120)
def test_bf16_autocast_runs_on_cpu(tmp_path):
    from helpers import records

    config = write_run(tmp_path, {"training": {"mixed_precision": "bf16", "max_steps": 2}})
    Trainer(load_config(config), device="cpu").fit()
    train = records(tmp_path / "out", "train")
    assert len(train) == 2 and all(torch.isfinite(torch.tensor(r["d_loss"])) for r in train)
    assert records(tmp_path / "out", "eval")[-1]["num_samples"] == 10
