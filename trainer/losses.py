"""Adversarial losses and discriminator penalties.

Each loss maps discriminator scores (one per sample or per pack of samples) to a scalar;
``discriminator_loss`` and ``generator_loss`` are what the loop's two phases minimise.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F


def discriminator_loss(kind: str, real_scores: torch.Tensor, fake_scores: torch.Tensor) -> torch.Tensor:
    """The discriminator's loss for scores on real and generated samples."""
    if kind == "non_saturating":
        return F.softplus(-real_scores).mean() + F.softplus(fake_scores).mean()
    if kind == "hinge":
        return F.relu(1 - real_scores).mean() + F.relu(1 + fake_scores).mean()
    if kind == "least_squares":
        return 0.5 * ((real_scores - 1).pow(2).mean() + fake_scores.pow(2).mean())
    if kind == "wasserstein":
        return fake_scores.mean() - real_scores.mean()
    raise ValueError(f"unknown loss {kind!r}")


def generator_loss(kind: str, fake_scores: torch.Tensor) -> torch.Tensor:
    """The generator's loss for the discriminator's scores on its samples."""
    if kind == "non_saturating":
        return F.softplus(-fake_scores).mean()
    if kind in ("hinge", "wasserstein"):
        return -fake_scores.mean()
    if kind == "least_squares":
        return 0.5 * (fake_scores - 1).pow(2).mean()
    raise ValueError(f"unknown loss {kind!r}")


def gradient_penalty(point_scores: torch.Tensor, points: torch.Tensor) -> torch.Tensor:
    """WGAN-GP: mean of (||grad D|| - 1)^2 at ``points`` (which must require grad).

    The norm is taken per discriminator input, so packed samples count as one input.
    """
    (grads,) = torch.autograd.grad(point_scores.sum(), points, create_graph=True)
    return (grads.reshape(point_scores.shape[0], -1).norm(dim=1) - 1).pow(2).mean()


def r1_penalty(real_scores: torch.Tensor, real: torch.Tensor) -> torch.Tensor:
    """R1: mean of ||grad D||^2 at the real inputs (``real`` must require grad)."""
    (grads,) = torch.autograd.grad(real_scores.sum(), real, create_graph=True)
    return grads.reshape(real_scores.shape[0], -1).pow(2).sum(dim=1).mean()
