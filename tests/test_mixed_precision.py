"""One GradScaler serves both optimizers: an overflow in D's gradients skips D's step only and
leaves G's update exactly what it would have been."""

from __future__ import annotations

import pytest
import torch
from fixture_tasks import Overflow
from helpers import records, use_scaler, write_run

from trainer.contract.config import load_config
from trainer.contract.errors import ConfigError
from trainer.training.loop import Trainer


def step_two_generator(tmp_path, monkeypatch, inject: bool):
    """Run step 1, then step 2 with D's step either overflowing (inject) or a no-op (lr 0);
    returns G's weights after step 2 and the facts of D's step. With nonfinite=error, an
    overflow under the GradScaler is still routine: skipped, not an error."""
    training = {"gradient_accumulation_steps": 2, "nonfinite": "error"}
    config = write_run(tmp_path, {"task": "fixture_tasks:Overflow", "training": training})
    use_scaler(monkeypatch, torch.amp.GradScaler("cpu", init_scale=2.0**16))
    trainer = Trainer(load_config(config), device="cpu")
    with trainer.start():
        scaler = trainer.accelerator.scaler
        trainer.run_phase(trainer.d, 0)
        trainer.run_phase(trainer.g, 1)
        d_before = {k: v.clone() for k, v in trainer.d.model.state_dict().items()}
        scale_before = scaler.get_scale()
        if inject:
            Overflow.armed = True
        else:
            for group in trainer.d.optimizer.param_groups:
                group["lr"] = 0.0
        try:
            trainer.run_phase(trainer.d, 0)
        finally:
            Overflow.armed = False
        facts = {
            "skipped_d": trainer.d.skipped,
            "scale_ratio": scaler.get_scale() / scale_before,
            "d_unchanged": all(torch.equal(v, d_before[k]) for k, v in trainer.d.model.state_dict().items()),
        }
        trainer.run_phase(trainer.g, 1)
        facts["skipped_g"] = trainer.g.skipped
        return {k: v.clone() for k, v in trainer.g.model.state_dict().items()}, facts


@pytest.mark.timeout(120)
def test_overflow_in_one_model_leaves_the_other_update_exact(tmp_path, monkeypatch):
    g_clean, clean = step_two_generator(tmp_path / "clean", monkeypatch, inject=False)
    g_overflow, overflow = step_two_generator(tmp_path / "overflow", monkeypatch, inject=True)
    assert overflow["skipped_d"] == 1 and overflow["scale_ratio"] == 0.5 and overflow["d_unchanged"]
    assert clean["skipped_d"] == 0 and clean["scale_ratio"] == 1.0 and clean["d_unchanged"]
    assert overflow["skipped_g"] == clean["skipped_g"] == 0
    for key, value in g_clean.items():
        assert torch.equal(g_overflow[key], value), key


@pytest.mark.timeout(120)
@pytest.mark.parametrize(("precision", "dtype"), [("bf16", torch.bfloat16), ("no", torch.float32)])
def test_the_models_compute_in_the_configured_precision_on_cpu(tmp_path, precision, dtype):
    config = write_run(tmp_path, {"training": {"mixed_precision": precision, "max_steps": 2}})
    with Trainer(load_config(config), device="cpu").start() as trainer:
        seen: dict[str, set[torch.dtype]] = {"generator": set(), "discriminator": set()}
        for role, phase in (("generator", trainer.g), ("discriminator", trainer.d)):
            # a layer inside: accelerate hands the model's own outputs back in float32
            layer = next(m for m in phase.unwrapped.modules() if isinstance(m, torch.nn.Linear))
            layer.register_forward_hook(lambda module, args, out, role=role: seen[role].add(out.dtype))
        trainer.step()
        # the parameters (and what the optimizers update) stay float32
        weights = {p.dtype for phase in (trainer.g, trainer.d) for p in phase.params}
    assert seen == {"generator": {dtype}, "discriminator": {dtype}} and weights == {torch.float32}
    train = records(tmp_path / "out", "train")
    assert len(train) == 1 and all(torch.isfinite(torch.tensor(r["d_loss"])) for r in train)


def test_simultaneous_updates_refuse_a_grad_scaler(tmp_path, monkeypatch):
    # accelerate moves the scale inside each optimizer's step: with both gradients taken before
    # either step, the second would be unscaled by the wrong scale
    config = write_run(tmp_path, {"training": {"updates": "simultaneous"}})
    use_scaler(monkeypatch, torch.amp.GradScaler("cpu", init_scale=2.0**16))
    with pytest.raises(
        ConfigError, match=r"train.yaml: key 'training.updates' is simultaneous, which fp16's GradScaler"
    ):
        Trainer(load_config(config), device="cpu").fit()
    assert not (tmp_path / "out" / "metrics.jsonl").exists()
