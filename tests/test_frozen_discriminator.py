"""Stage 2 against a frozen discriminator (``training.d_steps_per_g_step: 0``): the
discriminator is a fixed reward model, with no optimizer, no gradients and no DDP wrapper, in
1 and 2 processes; the run resumes bit-identical."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from accelerate import debug_launcher
from helpers import records, write_run
from safetensors.torch import load_file

from trainer.contract.config import load_config
from trainer.contract.errors import ConfigError
from trainer.training.loop import Trainer

FROZEN = {"training": {"d_steps_per_g_step": 0, "max_steps": 4, "eval_every": 2, "save_every": 2}}


def weights(module: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {key: value.detach().clone() for key, value in module.state_dict().items()}


def train_frozen(config: str, result_dir: str) -> None:
    """Four steps (with their evals and checkpoints) against the frozen discriminator; what this
    rank saw, to RESULT/rank-R.json."""
    with Trainer(load_config(config), device="cpu").start() as trainer:
        d_before, g_before = weights(trainer.d.unwrapped), weights(trainer.g.unwrapped)
        for _ in range(4):
            trainer.step()
        d_after, g_after = weights(trainer.d.unwrapped), weights(trainer.g.unwrapped)
        acc = trainer.accelerator
        rank = acc.process_index
        seen = {
            "world_size": acc.num_processes,
            "d_wrapped": type(trainer.d.model).__name__,
            "g_wrapped": type(trainer.g.model).__name__,
            "d_optimizer": trainer.d.optimizer is not None,
            "d_requires_grad": any(p.requires_grad for p in trainer.d.unwrapped.parameters()),
            "d_training_mode": trainer.d.unwrapped.training,
            "d_unchanged": all(torch.equal(d_before[k], d_after[k]) for k in d_before),
            "g_changed": any(not torch.equal(g_before[k], g_after[k]) for k in g_before),
            "g_sum": float(sum(v.double().sum() for v in g_after.values())),
            "d_steps": trainer.d.steps,
            "g_steps": trainer.g.steps,
        }
    Path(result_dir, f"rank-{rank}.json").write_text(json.dumps(seen))


@pytest.mark.timeout(120)
@pytest.mark.parametrize("processes", [1, 2])
def test_the_discriminator_is_a_fixed_reward_model(tmp_path, processes):
    config = write_run(tmp_path, FROZEN)
    if processes == 1:
        train_frozen(str(config), str(tmp_path))
    else:
        debug_launcher(train_frozen, (str(config), str(tmp_path)), num_processes=2)
    seen = [json.loads((tmp_path / f"rank-{rank}.json").read_text()) for rank in range(processes)]
    for rank_seen in seen:
        assert rank_seen["world_size"] == processes
        assert rank_seen["d_wrapped"] != "DistributedDataParallel"
        assert rank_seen["g_wrapped"] == ("DistributedDataParallel" if processes == 2 else "Sequential")
        assert not rank_seen["d_optimizer"] and not rank_seen["d_requires_grad"]
        assert not rank_seen["d_training_mode"]  # no dropout in a reward model, after evals too
        assert rank_seen["d_unchanged"] and rank_seen["g_changed"]
        assert (rank_seen["d_steps"], rank_seen["g_steps"]) == (0, 4)
    assert len({rank_seen["g_sum"] for rank_seen in seen}) == 1  # the generator agrees across ranks


@pytest.mark.timeout(120)
def test_a_frozen_discriminator_run_logs_no_discriminator_training_and_resumes_exactly(tmp_path):
    from trainer.commands.cli import main

    config = write_run(tmp_path, FROZEN)
    args = ["--config", str(config), "--device", "cpu"]
    assert main(args) == 0
    out = tmp_path / "out"
    train = records(out, "train")
    assert train and not any(key.endswith("_d") or key == "d_loss" for r in train for key in r)
    checkpoint = out / "checkpoints" / "step-0000002"
    saved = sorted(path.name for path in checkpoint.iterdir())
    assert not any(name.startswith(("optimizer_1", "scheduler_1")) for name in saved), saved
    whole = load_file(out / "final" / "generator" / "model.safetensors")
    assert main([*args, "--resume", str(checkpoint)]) == 0
    resumed = load_file(out / "final" / "generator" / "model.safetensors")
    assert resumed.keys() == whole.keys() and all(torch.equal(resumed[k], whole[k]) for k in whole)


def test_a_frozen_discriminator_cannot_be_the_objective(tmp_path):
    config = write_run(tmp_path, {"training": {"d_steps_per_g_step": 0, "objective": "discriminator"}})
    with pytest.raises(ConfigError, match="training.d_steps_per_g_step.*trains nothing"):
        load_config(config)
