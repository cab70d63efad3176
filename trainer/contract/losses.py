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


def input_gradients(scores: torch.Tensor, inputs: torch.Tensor, grad_scale: float | torch.Tensor = 1.0) -> torch.Tensor:
    """The gradient of the summed ``scores`` with respect to ``inputs``, kept in the graph.

    Under fp16 autocast the backward through the discriminator runs in half precision, where
    small gradients underflow to zero; following PyTorch's AMP recipe for gradient penalties,
    the scores are multiplied by the GradScaler's scale (``grad_scale``) before
    ``autograd.grad`` and the result divided by it in float32.
    """
    (grads,) = torch.autograd.grad(scores.sum() * grad_scale, inputs, create_graph=True)
    return grads.float() / grad_scale


def gradient_penalty(
    point_scores: torch.Tensor, points: torch.Tensor, grad_scale: float | torch.Tensor = 1.0
) -> torch.Tensor:
    """WGAN-GP: mean of (||grad D|| - 1)^2 at ``points`` (which must require grad).

    The norm is taken per discriminator input, so packed samples count as one input.
    """
    grads = input_gradients(point_scores, points, grad_scale)
    return (grads.reshape(point_scores.shape[0], -1).norm(dim=1) - 1).pow(2).mean()


def r1_penalty(real_scores: torch.Tensor, real: torch.Tensor, grad_scale: float | torch.Tensor = 1.0) -> torch.Tensor:
    """R1: mean of ||grad D||^2 at the real inputs (``real`` must require grad)."""
    grads = input_gradients(real_scores, real, grad_scale)
    return grads.reshape(real_scores.shape[0], -1).pow(2).sum(dim=1).mean()
