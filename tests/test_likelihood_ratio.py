"""Stage 2 with the generator's likelihood ratio as the discriminator (task_options.
generator_objective: ddo, spin): the losses against a hand computation, rounds that move the
reference, resume, config errors."""

from __future__ import annotations

import math
import shutil
from pathlib import Path

import pytest
import torch
from helpers import check, fork_launch, launch, records
from safetensors.torch import load_file
from test_oracle_text import TINY_MODEL, VOCAB, write_oracle_run
from transformers import AutoModelForCausalLM, GPT2Config

from trainer.commands.cli import main
from trainer.contract.config import load_config
from trainer.contract.registry import load_task

DDO = {"generator_objective": "ddo", "beta": 0.3, "ddo_alpha": 0.7, "mle_weight": 0.0}


def stage1_generator(tmp: Path, seed: int = 3) -> Path:
    """A tiny GPT-2 saved as a stage-1 generator (the reference DDO starts from)."""
    torch.manual_seed(seed)
    path = tmp / "stage1-generator"
    AutoModelForCausalLM.from_config(
        GPT2Config(**{k: v for k, v in TINY_MODEL.items() if k != "model_type"})
    ).save_pretrained(path)
    return path


def ddo_run(tmp: Path, options: dict | None = None, training: dict | None = None) -> Path:
    init = {"generator": str(stage1_generator(tmp))}
    return write_oracle_run(
        tmp,
        {
            "init": init,
            "task_options": {**DDO, **(options or {})},
            "training": {"d_steps_per_g_step": 0, **(training or {})},
        },
    )


def hand_log_likelihood(model: torch.nn.Module, sequences: torch.Tensor, start: int) -> torch.Tensor:
    """log p(sequence) of each row: the start token first, the start token never a choice."""
    inputs = torch.cat([torch.full_like(sequences[:, :1], start), sequences[:, :-1]], dim=1)
    logits = model(input_ids=inputs).logits.float()
    logits[..., start] = -math.inf
    return logits.log_softmax(-1).gather(2, sequences.unsqueeze(2)).squeeze(2).sum(1)


@pytest.mark.timeout(120)
def test_ddo_loss_matches_a_hand_computation(tmp_path):
    config = ddo_run(tmp_path, {"mle_weight": 0.25})
    task = load_task(load_config(config))
    generator = task.build_generator()
    generator.load_state_dict(task.reference.state_dict())
    with torch.no_grad():  # the generator a few steps away from the reference
        for param in generator.parameters():
            param.add_(0.05 * torch.randn_like(param))
    real = torch.randint(0, VOCAB, (5, 8))
    rng = torch.Generator().manual_seed(11)
    loss, parts = task.likelihood_ratio_loss(generator, 4, rng, {"input_ids": real})

    # By hand: the reference's samples from the same noise, then the GAN classification loss
    # on beta times the sequence log-likelihood ratio.
    fake = task.generate(task.reference, 4, torch.Generator().manual_seed(11))
    start = task.start_id
    with torch.no_grad():
        ratio_real = hand_log_likelihood(generator, real, start) - hand_log_likelihood(task.reference, real, start)
        ratio_fake = hand_log_likelihood(generator, fake, start) - hand_log_likelihood(task.reference, fake, start)
        nll = -hand_log_likelihood(generator, real, start).sum() / real.numel()
    beta, alpha = 0.3, 0.7
    expected = (
        -torch.log(torch.sigmoid(beta * ratio_real)).mean()
        - alpha * torch.log(1 - torch.sigmoid(beta * ratio_fake)).mean()
        + 0.25 * nll
    )
    assert torch.allclose(loss, expected, atol=1e-5), (float(loss), float(expected))
    assert torch.allclose(parts["log_ratio_fake"], ratio_fake.mean(), atol=1e-4)
    assert torch.allclose(parts["nll_real"], nll, atol=1e-5)
    loss.backward()
    assert all(p.grad is not None for p in generator.parameters() if p.requires_grad)
    assert all(p.grad is None for p in task.reference.parameters())


@pytest.mark.timeout(120)
def test_spin_loss_matches_a_hand_computation(tmp_path):
    config = ddo_run(tmp_path, {"generator_objective": "spin"})
    task = load_task(load_config(config))
    generator = task.build_generator()
    generator.load_state_dict(task.reference.state_dict())
    with torch.no_grad():
        for param in generator.parameters():
            param.add_(0.05 * torch.randn_like(param))
    real = torch.randint(0, VOCAB, (4, 8))
    loss, _ = task.likelihood_ratio_loss(generator, 4, torch.Generator().manual_seed(2), {"input_ids": real})
    fake = task.generate(task.reference, 4, torch.Generator().manual_seed(2))
    start = task.start_id
    with torch.no_grad():
        ratio_real = hand_log_likelihood(generator, real, start) - hand_log_likelihood(task.reference, real, start)
        ratio_fake = hand_log_likelihood(generator, fake, start) - hand_log_likelihood(task.reference, fake, start)
    # Pair i: real sequence i against sample i.
    expected = -torch.log(torch.sigmoid(0.3 * (ratio_real - ratio_fake))).mean()
    assert torch.allclose(loss, expected, atol=1e-5), (float(loss), float(expected))


@pytest.mark.timeout(120)
def test_ddo_starts_as_scaled_maximum_likelihood(tmp_path):
    """From the reference itself, ratios are 0 and the loss is (1 + alpha) log 2; its gradient
    on the real side is beta/2 times maximum likelihood's (the fake side's is zero in
    expectation, so it is left out here with alpha 0)."""
    config = ddo_run(tmp_path, {"ddo_alpha": 0.0})
    task = load_task(load_config(config))
    generator = task.build_generator()
    generator.load_state_dict(task.reference.state_dict())
    real = torch.randint(0, VOCAB, (6, 8))
    loss, _ = task.likelihood_ratio_loss(generator, 3, torch.Generator().manual_seed(0), {"input_ids": real})
    assert math.isclose(float(loss), math.log(2), rel_tol=1e-6)
    loss.backward()
    ddo_grads = [p.grad.clone() for p in generator.parameters()]
    generator.zero_grad()
    mle = -hand_log_likelihood(generator, real, task.start_id).mean()
    mle.backward()
    for ddo_grad, param in zip(ddo_grads, generator.parameters(), strict=True):
        assert torch.allclose(ddo_grad, 0.3 / 2 * param.grad, atol=1e-6)


@pytest.mark.timeout(600)
@pytest.mark.parametrize("processes", [1, 2])
def test_ddo_rounds_move_the_reference_and_resume_is_bit_identical(tmp_path, processes):
    # A round every 3 steps, checkpoints every 2: the step-4 checkpoint's reference is the
    # generator of step 3, which only the checkpoint holds.
    config = ddo_run(tmp_path, {"round_steps": 3}, {"max_steps": 6, "save_every": 2, "eval_every": 3, "log_every": 1})
    out = tmp_path / "out"
    args = ["--config", str(config), "--device", "cpu"]
    run = launch if processes == 2 else fork_launch  # one row on the real launcher (harness.forked)
    check(run(args, processes, timeout=300))
    train = records(out, "train")
    assert [r["world_size"] for r in records(out, "eval")] == [processes, processes]
    assert all({"log_ratio_real", "log_ratio_fake"} <= set(r) and "d_loss" not in r for r in train)
    # At step 1 the generator is the reference, so its ratio on its own samples starts near 0
    # and on each round's first step it is 0 again (the reference moved to the generator).
    by_step = {r["step"]: r for r in train}
    assert by_step[1]["log_ratio_fake"] == pytest.approx(0.0, abs=1e-5)
    assert by_step[4]["log_ratio_fake"] == pytest.approx(0.0, abs=1e-5)
    assert abs(by_step[3]["log_ratio_fake"]) > 1e-3
    step4 = out / "checkpoints" / "step-0000004"
    uninterrupted = load_file(out / "final" / "generator" / "model.safetensors")
    shutil.rmtree(out / "final")
    (out / "metrics.jsonl").unlink()
    check(run([*args, "--resume", str(step4)], processes, timeout=300))
    resumed = load_file(out / "final" / "generator" / "model.safetensors")
    assert resumed.keys() == uninterrupted.keys()
    for key, value in resumed.items():
        assert torch.equal(value, uninterrupted[key]), f"{key} differs after resume"
    # The reference the step-4 checkpoint holds is round 2's, not the starting generator.
    initial = load_file(tmp_path / "stage1-generator" / "model.safetensors")
    reference = load_file(step4 / "reference.safetensors")
    assert not torch.equal(reference["lm_head.weight"], initial["transformer.wte.weight"])  # tied


@pytest.mark.timeout(120)
@pytest.mark.parametrize(
    ("options", "training", "key"),
    [
        ({}, {"d_steps_per_g_step": 1}, "training.d_steps_per_g_step"),
        ({"beta": 0.0}, {}, "task_options.beta"),
    ],
)
def test_ddo_config_errors_name_the_key(tmp_path, capsys, options, training, key):
    config = ddo_run(tmp_path, options, training)
    capsys.readouterr()  # the stage-1 generator's saving
    assert main(["--config", str(config), "--device", "cpu"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and key in err[0] and str(config) in err[0], err


@pytest.mark.timeout(300)
@pytest.mark.parametrize(
    "options", [{"generator_objective": "ddo"}, {"generator_objective": "reinforce", "kl_coef": 0.1}]
)
def test_a_missing_reference_fails_every_rank_at_start_up(tmp_path, options):
    """The reference is read with the models, where a failure on any rank fails them all, not
    at the first generator step (inside the step, after the first discriminator phase)."""
    config = write_oracle_run(
        tmp_path,
        {
            "task_options": {**options, "mle_weight": 0.0},
            "training": {"d_steps_per_g_step": 0 if options["generator_objective"] == "ddo" else 1},
        },
    )
    result = launch(["--config", str(config), "--device", "cpu"], 2, timeout=200)
    assert result.returncode != 0
    errors = sorted(line for line in result.stderr.splitlines() if line.startswith("error (rank"))
    assert len(errors) == 2, result.stderr[-3000:]
    assert "key 'task_options.kl_coef'/'generator_objective' needs a reference generator" in errors[0]
    assert (
        errors[1]
        == "error (rank 1): reading the models and data (main process) failed on rank(s) 0; see that rank's error"
    )


def test_a_placed_reference_keeps_its_forward_signature():
    """The frozen reference's forward runs under the run's autocast; transformers' generate
    (4.45) reads the forward's signature to check its keyword arguments, so the wrapper keeps
    it (else: "model_kwargs are not used by the model: ['attention_mask']")."""
    import inspect

    from accelerate import Accelerator

    from trainer.distributed.world import release_accelerator
    from trainer.training.run_parts import place_frozen

    model = AutoModelForCausalLM.from_config(GPT2Config(n_layer=1, n_embd=8, n_head=2, vocab_size=20))
    expected = inspect.signature(model.forward)
    try:
        placed = place_frozen(Accelerator(cpu=True), [], model)
    finally:
        release_accelerator()
    assert inspect.signature(placed.forward) == expected
    assert "attention_mask" in inspect.signature(placed.forward).parameters
