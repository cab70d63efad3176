"""training.share_samples: one generation per optimizer step, the generator phase scoring the
samples its step's last discriminator phase drew, in order, and a run that resumes exactly."""

from __future__ import annotations

import pytest
import torch
from helpers import check, fork_launch, launch, write_run
from safetensors.torch import load_file
from test_text import example, write_text_run  # noqa: F401 (example: the fixture)

from trainer.contract.config import load_config
from trainer.contract.errors import ConfigError
from trainer.training.loop import Trainer


def recorded_step(tmp_path, paths, training: dict) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    """One optimizer step of a text run: every generate() output, and the samples the generator
    phase scored (None where it drew its own)."""
    config = write_text_run(tmp_path, paths, {"training": training, "task_options": {"mle_weight": 0.2}})
    trainer = Trainer(load_config(config), device="cpu")
    drawn, scored = [], []
    generate, generator_loss = trainer.task.generate, trainer.task.generator_loss

    def recording_generate(*args, **kwargs):
        drawn.append(generate(*args, **kwargs))
        return drawn[-1]

    def recording_loss(*args, samples=None, **kwargs):
        scored.append(samples)
        return generator_loss(*args, samples=samples, **kwargs)

    trainer.task.generate, trainer.task.generator_loss = recording_generate, recording_loss
    with trainer.start():
        trainer.train_step()
    return drawn, scored


@pytest.mark.timeout(120)
@pytest.mark.parametrize(("d_steps", "accumulation"), [(1, 1), (2, 2)])
def test_the_generator_phase_scores_the_last_discriminator_phases_samples(tmp_path, example, d_steps, accumulation):  # noqa: F811
    training = {"d_steps_per_g_step": d_steps, "gradient_accumulation_steps": accumulation}
    drawn, scored = recorded_step(tmp_path / "shared", example["gpt2"], {**training, "share_samples": True})
    assert len(drawn) == d_steps * accumulation  # one generation per discriminator micro-batch, none more
    assert len(scored) == accumulation
    for samples, kept in zip(scored, drawn[-accumulation:], strict=True):
        assert samples is kept
    drawn, scored = recorded_step(tmp_path / "own", example["gpt2"], training)
    assert len(drawn) == (d_steps + 1) * accumulation and scored == [None] * accumulation


@pytest.mark.timeout(300)
def test_a_shared_run_resumes_exactly_in_two_processes(tmp_path, example):  # noqa: F811
    paths = example["gpt2"]
    settings = {"training": {"share_samples": True, "max_steps": 4, "save_every": 2, "eval_every": 2}}
    whole = write_text_run(tmp_path / "whole", paths, settings)
    check(launch(["--config", str(whole), "--device", "cpu"], 2))
    halves = write_text_run(tmp_path / "halves", paths, settings)
    # the halves' workers forked from this process (harness.forked): the whole run has the launcher
    check(fork_launch(["--config", str(halves), "--device", "cpu", "--set", "training.max_steps=2"], 2))
    check(fork_launch(["--config", str(halves), "--device", "cpu", "--resume", "latest"], 2))
    want = load_file(str(tmp_path / "whole" / "out" / "final" / "generator" / "model.safetensors"))
    got = load_file(str(tmp_path / "halves" / "out" / "final" / "generator" / "model.safetensors"))
    assert want.keys() == got.keys() and all(torch.equal(got[k], v) for k, v in want.items())


def test_a_task_that_draws_samples_with_gradients_refuses_sharing(tmp_path):
    config = write_run(tmp_path, {"training": {"share_samples": True}})
    with pytest.raises(ConfigError, match="key 'training.share_samples': task 'gaussian_mixture' draws"):
        Trainer(load_config(config), device="cpu").fit()
