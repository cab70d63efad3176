"""Losses and penalties against their formulas, and every loss through the real 2-process loop."""

from __future__ import annotations

import math

import pytest
import torch
from helpers import check, launch, records, use_scaler, write_run

from trainer.contract import losses

REAL = torch.tensor([0.5, -1.0, 2.0])
FAKE = torch.tensor([-0.3, 1.5, 0.0])


def softplus(x):
    return math.log1p(math.exp(x))


@pytest.mark.parametrize(
    "kind, d_expected, g_expected",
    [
        (
            "non_saturating",
            sum(softplus(-r) for r in REAL.tolist()) / 3 + sum(softplus(f) for f in FAKE.tolist()) / 3,
            sum(softplus(-f) for f in FAKE.tolist()) / 3,
        ),
        (
            "hinge",
            sum(max(0, 1 - r) for r in REAL.tolist()) / 3 + sum(max(0, 1 + f) for f in FAKE.tolist()) / 3,
            -sum(FAKE.tolist()) / 3,
        ),
        (
            "least_squares",
            0.5 * (sum((r - 1) ** 2 for r in REAL.tolist()) / 3 + sum(f**2 for f in FAKE.tolist()) / 3),
            0.5 * sum((f - 1) ** 2 for f in FAKE.tolist()) / 3,
        ),
        ("wasserstein", sum(FAKE.tolist()) / 3 - sum(REAL.tolist()) / 3, -sum(FAKE.tolist()) / 3),
    ],
)
def test_loss_formulas(kind, d_expected, g_expected):
    assert float(losses.discriminator_loss(kind, REAL, FAKE)) == pytest.approx(d_expected, rel=1e-6)
    assert float(losses.generator_loss(kind, FAKE)) == pytest.approx(g_expected, rel=1e-6)


def test_penalties_on_a_linear_critic():
    # D(x) = w . x has gradient w everywhere: GP = (|w| - 1)^2, R1 = |w|^2.
    w = torch.tensor([3.0, 4.0])
    points = torch.randn(5, 2, requires_grad=True)
    assert float(losses.gradient_penalty(points @ w, points)) == pytest.approx((5 - 1) ** 2)
    real = torch.randn(5, 2, requires_grad=True)
    assert float(losses.r1_penalty(real @ w, real)) == pytest.approx(25.0)


def half_precision_critic(points: torch.Tensor) -> torch.Tensor:
    """D(x) = sum(((x * a) * b) * c) in float16: dD/dx = a*b*c = 1e-4, but the gradient
    reaching x * a is b*c = 1e-8, below float16's smallest subnormal (6e-8). (A scale of 2**16
    would overflow float16 at the cast of the scores: a GradScaler then backs off.)"""
    a, b, c = (torch.tensor(v, dtype=torch.float16) for v in (1e4, 1e-4, 1e-4))
    return (((points * a) * b) * c).sum(dim=1).float()


@pytest.mark.parametrize("penalty", ["gradient_penalty", "r1_penalty"])
def test_penalties_under_fp16_follow_the_amp_recipe(penalty):
    a, b, c = (float(torch.tensor(v, dtype=torch.float16)) for v in (1e4, 1e-4, 1e-4))
    dims = 4
    norm = math.sqrt(dims) * a * b * c  # every sample's input gradient, in float64
    expected = (norm - 1) ** 2 if penalty == "gradient_penalty" else norm**2
    function = getattr(losses, penalty)
    points = torch.ones(3, dims, dtype=torch.float16, requires_grad=True)
    scaled = float(function(half_precision_critic(points), points, grad_scale=2.0**14))
    # float16 rounds each product (relative 5e-4): R1, the squared norm, to 1e-3 of the exact;
    # GP, (norm - 1)^2 for a norm of 2e-4, far closer than the 4e-4 an unscaled zero costs
    assert scaled == pytest.approx(expected, rel=1e-3 if penalty == "r1_penalty" else 1e-5)
    # Unscaled, the gradient underflows to zero: the case the scale exists for.
    unscaled = float(function(half_precision_critic(points), points))
    assert unscaled == pytest.approx((0 - 1) ** 2 if penalty == "gradient_penalty" else 0.0)


@pytest.mark.timeout(120)
def test_the_loop_gives_the_penalties_the_scalers_scale(tmp_path, monkeypatch):
    """Under a GradScaler each D step's penalties get its scale; in float32, scaling then
    unscaling by a power of two is exact, so the R1 term equals the unscaled run's."""
    from fixture_tasks import PenaltyScale

    from trainer.contract.config import load_config
    from trainer.training.loop import Trainer

    r1 = {}
    for name, scaler in (("plain", None), ("scaled", torch.amp.GradScaler("cpu", init_scale=2.0**16))):
        PenaltyScale.seen.clear()
        training = {"loss": "hinge", "r1_weight": 1.0, "max_steps": 2, "log_every": 1}
        config = write_run(tmp_path / name, {"task": "fixture_tasks:PenaltyScale", "training": training})
        if scaler is not None:
            use_scaler(monkeypatch, scaler)
        Trainer(load_config(config), device="cpu").fit()
        assert PenaltyScale.seen == [1.0 if scaler is None else 2.0**16] * 2
        r1[name] = [record["r1"] for record in records(tmp_path / name / "out", "train")]
    assert r1["scaled"] == r1["plain"] and all(value > 0 for value in r1["plain"])


@pytest.mark.timeout(300)
@pytest.mark.parametrize(
    "training",
    [
        {"loss": "wasserstein", "gp_weight": 10.0},
        {"loss": "wasserstein", "gp_weight": 0.0, "r1_weight": 1.0, "r1_interval": 2},
        {"loss": "hinge", "d_steps_per_g_step": 2},
    ],
    ids=["wgan-gp", "wgan-lazy-r1", "hinge-2d"],
)
def test_losses_run_in_two_processes(tmp_path, training):
    config = write_run(tmp_path, {"training": {"max_steps": 4, **training}, "task_options": {"packing": 2}})
    check(launch(["--config", str(config), "--device", "cpu"], 2))
    train = records(tmp_path / "out", "train")
    assert [r["step"] for r in train] == [1, 2, 3, 4] and all(r["world_size"] == 2 for r in train)
    assert all(math.isfinite(r["d_loss"]) and math.isfinite(r["g_loss"]) for r in train)
    if training["loss"] == "wasserstein":
        # The critic's loss is linear in its scores, so the logged means (over micro-batches and
        # ranks) add up: the weighted penalty must be in the loss D was trained on. Lazy R1
        # counts r1_interval times at every r1_interval-th D step.
        for r in train:
            penalty = 10.0 * r.get("gradient_penalty", 0.0) + 2.0 * r.get("r1", 0.0)
            assert r["d_loss"] == pytest.approx(r["d_fake"] - r["d_real"] + penalty, rel=1e-5, abs=1e-6), r
        assert all(("gradient_penalty" in r) == (training["gp_weight"] > 0) for r in train)
    if "r1_weight" in training:
        assert [("r1" in r) for r in train] == [True, False, True, False]
        assert all(r["r1"] > 0 for r in train if "r1" in r)
