"""Losses and penalties against their formulas, and every loss through the real 2-process loop."""

from __future__ import annotations

import math

import pytest
import torch
from helpers import check, launch, records, write_run

from trainer import losses

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


@pytest.mark.timeout(300)
@pytest.mark.parametrize(
    "training",
    [
        {"loss": "wasserstein", "gp_weight": 10.0},
        {"loss": "hinge", "r1_weight": 1.0, "r1_interval": 2},
        {"loss": "least_squares", "d_steps_per_g_step": 2},
    ],
    ids=["wgan-gp", "hinge-lazy-r1", "lsgan-2d"],
)
def test_losses_run_in_two_processes(tmp_path, training):
    config = write_run(tmp_path, {"training": {"max_steps": 4, **training}, "task_options": {"packing": 2}})
    check(launch(["--config", str(config), "--device", "cpu"], 2))
    train = records(tmp_path / "out", "train")
    assert all(math.isfinite(r["d_loss"]) and math.isfinite(r["g_loss"]) for r in train)
    if training.get("loss") == "wasserstein":
        assert all(r["gradient_penalty"] >= 0 for r in train)
    if "r1_weight" in training:
        assert "r1" in train[0]
