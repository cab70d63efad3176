"""The loop's updates against a plain-torch reference written out by hand, in 1 and 2 processes."""

from __future__ import annotations

import json

import pytest
import torch
import torch.nn.functional as F
from fixture_tasks import FIXED_LATENTS
from helpers import TINY_DISCRIMINATOR, TINY_GENERATOR, check, fork_launch, launch, records, write_run
from safetensors.torch import load_file, save_file
from transformers import get_scheduler

from trainer.contract.config import load_config
from trainer.tasks.gaussian_mixture import mlp, sample_mixture
from trainer.training.loop import Trainer

STEPS, D_STEPS, BATCH, TRAIN_SIZE, SEED = 3, 2, 2, 8, 5
LR_G, LR_D, CLIP_D = 2e-3, 1e-3, 0.05


def initial_models():
    torch.manual_seed(123)
    g = mlp(2, TINY_GENERATOR["hidden_dim"], TINY_GENERATOR["num_layers"], 2)
    d = mlp(2, TINY_DISCRIMINATOR["hidden_dim"], TINY_DISCRIMINATOR["num_layers"], 1)
    return g, d


def reference(d_steps=D_STEPS, simultaneous=False):
    """Plain torch: each D step sees all 8 real points (one epoch per D phase, whatever the
    split into processes and micro-batches) and the fixed latents; each G step the latents.
    ``simultaneous``: both gradients at the step's starting weights, then both steps.

    Returns the final weights and, per step, the gradient norms of its last D phase (before
    clipping) and of its G phase."""
    g, d = initial_models()
    opt_g = torch.optim.Adam(g.parameters(), lr=LR_G, betas=(0.5, 0.999))
    opt_d = torch.optim.Adam(d.parameters(), lr=LR_D, betas=(0.5, 0.999))
    sched_g = get_scheduler("linear", opt_g, num_warmup_steps=1, num_training_steps=STEPS)
    sched_d = get_scheduler("linear", opt_d, num_warmup_steps=1, num_training_steps=STEPS * d_steps)
    real = sample_mixture("ring", TRAIN_SIZE, SEED)
    z = FIXED_LATENTS[:BATCH]
    norms = []

    def step_d():
        opt_d.step()
        sched_d.step()

    for _ in range(STEPS):
        for _ in range(d_steps):
            fake = g(z).detach()
            loss = F.softplus(-d(real)).mean() + F.softplus(d(fake)).mean()
            opt_d.zero_grad()
            loss.backward()
            norm_d = float(torch.nn.utils.clip_grad_norm_(d.parameters(), CLIP_D))
            if not simultaneous:
                step_d()
        opt_g.zero_grad()
        for p in d.parameters():
            p.requires_grad_(False)
        F.softplus(-d(g(z))).mean().backward()
        for p in d.parameters():
            p.requires_grad_(True)
        norms.append(
            {"grad_norm_d": norm_d, "grad_norm_g": float(torch.nn.utils.get_total_norm(p.grad for p in g.parameters()))}
        )
        if simultaneous:
            step_d()
        opt_g.step()
        sched_g.step()
    return g.state_dict(), d.state_dict(), norms


def expected_lr(base, step, total):
    """transformers' linear schedule with one warm-up step, after ``step`` scheduler steps."""
    return base * (step / 1 if step < 1 else max(0.0, (total - step) / (total - 1)))


def write_reference_run(tmp_path, accumulation, task="fixture_tasks:ReducerWatch", d_steps=D_STEPS, updates=None):
    g, d = initial_models()
    save_file(g.state_dict(), str(tmp_path / "g.safetensors"))
    save_file(d.state_dict(), str(tmp_path / "d.safetensors"))
    return write_run(
        tmp_path,
        {
            "task": task,
            "training": {
                "max_steps": STEPS,
                "batch_size": BATCH,
                "gradient_accumulation_steps": accumulation,
                "d_steps_per_g_step": d_steps,
                "seed": SEED,
                **({"updates": updates} if updates else {}),
                "eval_every": 100,
                "save_every": 100,
            },
            "optim": {
                "generator": {"lr": LR_G, "scheduler": "linear", "warmup_steps": 1},
                "discriminator": {"lr": LR_D, "scheduler": "linear", "warmup_steps": 1, "max_grad_norm": CLIP_D},
            },
            "data": {"train_size": TRAIN_SIZE},
            "init": {"generator": str(tmp_path / "g.safetensors"), "discriminator": str(tmp_path / "d.safetensors")},
        },
    )


def assert_weights(out, ref_g, ref_d):
    """The run's final weights are the reference's, and training moved them."""
    got_g = load_file(out / "final" / "generator" / "model.safetensors")
    got_d = load_file(out / "final" / "discriminator" / "model.safetensors")
    initial_g, _ = initial_models()
    assert any(not torch.equal(got_g[k], v) for k, v in initial_g.state_dict().items())
    for key, value in ref_g.items():
        torch.testing.assert_close(got_g[key], value, rtol=1e-5, atol=1e-6)
    for key, value in ref_d.items():
        torch.testing.assert_close(got_d[key], value, rtol=1e-5, atol=1e-6)


def assert_train_records(out, processes, accumulation):
    """Steps, learning rates and phase counts of the records; the data position."""
    train = records(out, "train")
    assert [r["step"] for r in train] == [1, 2, 3]
    assert all(r["world_size"] == processes for r in train)
    for r in train:
        assert r["lr_g"] == pytest.approx(expected_lr(LR_G, r["step"], STEPS), abs=1e-12)
        assert r["lr_d"] == pytest.approx(expected_lr(LR_D, r["step"] * D_STEPS, STEPS * D_STEPS), abs=1e-12)
    assert train[-1]["d_steps"] == STEPS * D_STEPS and train[-1]["g_steps"] == STEPS

    # Exactly `accumulation` micro-batches per D phase: the data position says how many
    # micro-batches all ranks took (the G phase of this task takes none).
    state = json.loads((out / "checkpoints" / "step-0000003" / "trainer_state.json").read_text())
    assert state["data"]["micro_batches"] == STEPS * D_STEPS * accumulation * processes


@pytest.mark.timeout(300)
@pytest.mark.parametrize("processes", [1, 2])
def test_updates_equal_reference(tmp_path, processes):
    # Same micro-batch size, so 1 x 4 and 2 x 2 micro-batches make the same global batch.
    accumulation = 4 // processes
    config = write_reference_run(tmp_path, accumulation)
    run = launch if processes == 2 else fork_launch  # one row on the real launcher (harness.forked)
    check(run(["--config", str(config), "--device", "cpu"], processes))
    out = tmp_path / "out"
    assert_weights(out, *reference()[:2])
    assert_train_records(out, processes, accumulation)


@pytest.mark.timeout(300)
@pytest.mark.parametrize("processes", [1, 2])
def test_simultaneous_updates_take_both_gradients_at_the_steps_starting_weights(tmp_path, processes):
    # training.updates simultaneous (PacGAN's and ALI's code): the G gradient against the
    # discriminator as it was before its step, the D gradient on samples of the generator as
    # it was before its own; then both steps
    config = write_reference_run(tmp_path, 4 // processes, d_steps=1, updates="simultaneous")
    run = launch if processes == 2 else fork_launch  # one row on the real launcher (harness.forked)
    check(run(["--config", str(config), "--device", "cpu"], processes))
    out = tmp_path / "out"
    assert_weights(out, *reference(d_steps=1, simultaneous=True)[:2])
    assert [r["world_size"] for r in records(out, "train")] == [processes] * STEPS
    # not the alternating order's weights
    alternating_g = reference(d_steps=1)[0]
    got_g = load_file(out / "final" / "generator" / "model.safetensors")
    assert any(not torch.allclose(got_g[k], v, rtol=1e-5, atol=1e-6) for k, v in alternating_g.items())


@pytest.mark.timeout(120)
def test_logged_gradient_norms_are_those_of_the_log_step(tmp_path):
    # Logging every 2 steps: G (not clipped) computes its norm at log steps only, D (clipped)
    # at every step; both must be the norms of step 2's gradients, not of an earlier step.
    config = write_reference_run(tmp_path, 4)
    Trainer(load_config(config, {"training.log_every": 2}), device="cpu").fit()
    (logged,) = records(tmp_path / "out", "train")
    assert logged["step"] == 2
    expected = reference()[2][1]
    for key in ("grad_norm_d", "grad_norm_g"):
        assert logged[key] == pytest.approx(expected[key], rel=1e-5), key


@pytest.mark.timeout(120)
def test_generator_phase_leaves_discriminator_untouched(tmp_path):
    config = write_reference_run(tmp_path, 2, task="fixture_tasks:FixedNoiseMixture")
    with Trainer(load_config(config), device="cpu").start() as trainer:
        trainer.run_phase(trainer.d, 0)
        g_before = {k: v.clone() for k, v in trainer.g.model.state_dict().items()}
        # The first step of the linear warm-up has learning rate 0; the second moves G.
        for _ in range(2):
            trainer.run_phase(trainer.g, 1)
        # Only D's optimizer could change D's weights; what the G phase could do wrong is leave
        # gradients in D, which its next step would apply.
        assert all(p.grad is None for p in trainer.d.model.parameters())
        assert all(p.requires_grad for p in trainer.d.model.parameters())
        assert any(not torch.equal(v, g_before[k]) for k, v in trainer.g.model.state_dict().items())


def test_the_constant_schedule_is_transformers_own():
    # built without importing transformers' scheduler module (tests/test_startup.py says why):
    # the same factors, and the same state, so a checkpoint from either loads into the other
    from trainer.contract.schedules import build_scheduler

    def optimizer():
        return torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=0.1)

    ours = build_scheduler("constant", optimizer(), warmup_steps=2, steps=5)
    theirs = get_scheduler("constant", optimizer(), num_warmup_steps=2, num_training_steps=5)
    for _ in range(3):
        for schedule in (ours, theirs):
            schedule.optimizer.step()
            schedule.step()
        assert ours.get_last_lr() == theirs.get_last_lr() == [0.1]
    assert ours.state_dict() == theirs.state_dict()
    ours.load_state_dict(theirs.state_dict())
    linear = build_scheduler("linear", optimizer(), warmup_steps=2, steps=5)
    assert [group["lr"] for group in linear.optimizer.param_groups] == [0.0]  # the first warm-up step
