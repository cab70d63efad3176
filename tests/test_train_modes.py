"""Train and eval modes: every trained model trains in train mode (dropout on, BatchNorm on the
batch's statistics) whatever mode its builder or ``from_pretrained`` returned it in, every
model is scored in eval mode, a frozen model stays in eval mode; ``model.disable_dropout``."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from accelerate import debug_launcher
from helpers import write_run
from test_oracle_text import TINY_MODEL, write_oracle_run

from trainer.contract.config import load_config
from trainer.training.loop import Trainer

VARIANTS = {
    "adversarial": ({}, {"generator": [True], "discriminator": [True]}),
    "frozen discriminator": ({"d_steps_per_g_step": 0}, {"generator": [True], "discriminator": [False]}),
    "stage 1 discriminator": ({"objective": "discriminator"}, {"generator": [False], "discriminator": [True]}),
}


def train_and_record(config: str, result_dir: str) -> None:
    """Four steps with two evals; the modes every forward saw, to RESULT/rank-R.json."""
    from fixture_tasks import ModeWatch

    ModeWatch.seen.clear()
    with Trainer(load_config(config), device="cpu").start() as trainer:
        for _ in range(4):
            trainer.step()
        rank, world_size = trainer.accelerator.process_index, trainer.accelerator.num_processes
    Path(result_dir, f"rank-{rank}.json").write_text(json.dumps({"world_size": world_size, "seen": ModeWatch.seen}))


@pytest.mark.timeout(120)
@pytest.mark.parametrize("processes", [1, 2])
@pytest.mark.parametrize("variant", list(VARIANTS))
def test_trained_models_train_in_train_mode_and_are_scored_in_eval_mode(tmp_path, processes, variant):
    training, expected = VARIANTS[variant]
    config = write_run(tmp_path, {"task": "fixture_tasks:ModeWatch", "training": training})
    if processes == 1:
        train_and_record(str(config), str(tmp_path))
    else:
        debug_launcher(train_and_record, (str(config), str(tmp_path)), num_processes=2)
    for rank in range(processes):
        result = json.loads((tmp_path / f"rank-{rank}.json").read_text())
        assert result["world_size"] == processes
        modes: dict[tuple[str, str], set[tuple[bool, ...]]] = {}
        for where, role, flags in result["seen"]:
            modes.setdefault((where, role), set()).add(tuple(flags))
        # the builders returned eval-mode models: trained ones must have been switched; every
        # variant calls both models in training (a fixed one generates or scores there)
        for role, flags in expected.items():
            assert modes.get(("training", role)) == {tuple(flags)}, (rank, role, modes)
        assert modes[("eval", "generator")] == {(False,)}
        assert modes[("eval", "discriminator")] == {(False,)}


def pretrained_gpt2(tmp_path: Path) -> Path:
    """A tiny GPT-2 with dropout 0.1 saved with save_pretrained (from_pretrained returns it in
    eval mode)."""
    from transformers import GPT2Config, GPT2LMHeadModel

    fields = {**TINY_MODEL, "resid_pdrop": 0.1, "embd_pdrop": 0.1, "attn_pdrop": 0.1}
    fields.pop("model_type")
    torch.manual_seed(0)
    directory = tmp_path / "pretrained"
    GPT2LMHeadModel(GPT2Config(**fields)).save_pretrained(directory)
    return directory


@pytest.mark.timeout(120)
@pytest.mark.parametrize("disable_dropout", [False, True])
def test_a_pretrained_gpt2_trains_with_its_dropout_unless_disabled(tmp_path, disable_dropout):
    directory = pretrained_gpt2(tmp_path)
    config = write_oracle_run(
        tmp_path,
        {
            "init": {"generator": str(directory)},
            "model": {"disable_dropout": disable_dropout},
            "training": {"objective": "mle"},
        },
    )
    with Trainer(load_config(config), device="cpu").start() as trainer:
        batch = trainer.stream.next()
        first, _ = trainer.g.loss(batch)
        second, _ = trainer.g.loss(batch)
        unwrapped = trainer.g.unwrapped
        assert unwrapped.training
        dropouts = [m.p for m in unwrapped.modules() if isinstance(m, torch.nn.Dropout)]
    assert dropouts and set(dropouts) == ({0.0} if disable_dropout else {0.1})
    if disable_dropout:
        assert torch.equal(first, second)
    else:
        assert not torch.equal(first, second)
