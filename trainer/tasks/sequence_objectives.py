"""Stage 2's generator objectives of the text recipes: their options, and their arithmetic on
token log-probabilities and the discriminator's ratings (REINFORCE's returns and advantages, the
likelihood-ratio losses of ``ddo`` and ``spin``, the KL estimate). Sequences are token tensors
[batch, length]; a ``mask`` marks the positions that count (None: all of them)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import torch
from torch import nn

from trainer.contract.config.schema import require


@dataclass
class SequenceGanOptions:
    #: stage 2's generator objective: "reinforce", the policy gradient on the discriminator's
    #: ratings (SeqGAN, Yu et al. 2017); two whose discriminator is the generator's own
    #: log-likelihood ratio to the reference generator, ``beta * (log p(x) - log p_ref(x))``,
    #: telling real sequences from the reference's samples, so that no discriminator network is
    #: trained (training.d_steps_per_g_step: 0): "ddo", Direct Discriminative Optimization
    #: (Zheng et al., ICML 2025), the GAN classification loss on each side; "spin", Self-Play
    #: Fine-Tuning (Chen et al., ICML 2024), the logistic loss on each pair (real, sample)
    generator_objective: Literal["reinforce", "ddo", "spin"] = "reinforce"
    #: ddo, spin: the implicit discriminator's scale (of a whole sequence's log-likelihood ratio)
    beta: float = 0.05
    #: ddo: weight of the reference's samples (the "generated" side) in the classification loss
    ddo_alpha: float = 1.0
    #: ddo, spin: every this many generator steps the reference becomes the generator (a new
    #: round of the papers' self-play); 0: the reference stays the starting generator
    round_steps: int = 0
    #: stage 2: weight of a maximum-likelihood term on real data beside the policy gradient
    mle_weight: float = 0.0
    #: stage 2: weight of the KL divergence from the reference generator (init.generator, the
    #: stage-1 one, frozen), estimated on the sampled tokens (0: off)
    kl_coef: float = 0.0
    #: "prefix": the discriminator rates every prefix of a sequence (its classifier head on each
    #: position of its causal body), learns from every position, and each generated token is
    #: credited with the ratings of the prefixes it starts (see prefix_returns); "sequence": whole
    #: sequences only (one rating, the same for all of a sequence's tokens)
    reward: Literal["prefix", "sequence"] = "prefix"
    #: prefix rewards: weight of the rating of the prefix k tokens later in a token's return
    discount: float = 0.9
    #: stage 2: divide the advantages by their standard deviation, so the policy gradient keeps
    #: its scale as the discriminator's ratings spread or bunch up
    normalize_advantage: bool = True
    #: sampling: keep the k likeliest tokens (0: all)
    top_k: int = 0
    #: sampling: keep the smallest set of tokens whose probability is top_p (1: all)
    top_p: float = 1.0
    #: generated sequences written to OUTPUT/samples/step-N.txt at each eval
    write_samples: int = 10
    #: training and eval forwards on packed rows of valid tokens (restarting position_ids) where
    #: the model takes them, checked once per model; false: padded batches, as a model that
    #: ignores the restarts gets (the values are the same, the padding is computed)
    packed: bool = True

    def check(self, source: str) -> None:
        require(
            self.beta > 0 and self.ddo_alpha >= 0 and self.round_steps >= 0,
            source,
            "task_options.beta'/'ddo_alpha'/'round_steps",
            "beta must be positive, ddo_alpha and round_steps not negative",
        )
        for name in ("mle_weight", "kl_coef", "top_k", "write_samples"):
            require(getattr(self, name) >= 0, source, f"task_options.{name}", "must be 0 or more")
        require(0 <= self.discount <= 1, source, "task_options.discount", "must be in [0, 1]")
        require(0 < self.top_p <= 1, source, "task_options.top_p", "must be in (0, 1]")


def masked_mean(values: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
    """The mean of ``values`` where ``mask`` is set (all of them when it is None)."""
    if mask is None:
        return values.mean()
    return (values * mask).sum() / mask.sum().clamp(min=1)


def pad_right(sequences: list[torch.Tensor], value: int) -> list[torch.Tensor]:
    """Token tensors [batch, length_i] padded on the right to the longest length."""
    longest = max(s.shape[1] for s in sequences)
    return [
        torch.nn.functional.pad(s, (0, longest - s.shape[1]), value=value) if s.shape[1] < longest else s
        for s in sequences
    ]


def prefix_returns(ratings: torch.Tensor, mask: torch.Tensor | None, discount: float) -> torch.Tensor:
    """Each token's return [batch, length] from the ratings of the prefixes it starts:
    ``sum_k discount^k * ratings_{t+k}``. For sequences that end (a ``mask``; ratings 0 past
    the end) the sum is divided by the same sum of the weights of the positions that exist, a
    discounted mean: ratings are positive, so an undivided sum grows with every token still to
    come, ending a text would cost reward, and generated texts would grow to the token limit."""

    def discounted_sums(values: torch.Tensor) -> torch.Tensor:
        sums = torch.empty_like(values)
        running = torch.zeros_like(values[:, 0])
        for t in range(values.shape[1] - 1, -1, -1):  # from the end: one multiply-add a step
            running = values[:, t] + discount * running
            sums[:, t] = running
        return sums

    if mask is None:
        return discounted_sums(ratings)
    return discounted_sums(ratings) / discounted_sums(mask).clamp(min=1e-6) * mask


def baseline_advantages(returns: torch.Tensor, mask: torch.Tensor | None, normalize: bool) -> torch.Tensor:
    """REINFORCE's advantages: each token's return less the mean return of the sequences that
    reach its position (of the batch, without a mask), 0 past a sequence's end; with
    ``normalize`` divided by their standard deviation, so that the policy gradient keeps its
    scale as the ratings spread or bunch up."""
    if mask is None:
        advantage = returns - returns.mean(0, keepdim=True)
        spread = advantage.std() if normalize and returns.shape[0] > 1 else None
    else:
        baseline = (returns * mask).sum(0, keepdim=True) / mask.sum(0, keepdim=True).clamp(min=1)
        advantage = (returns - baseline) * mask
        spread = advantage[mask.bool()].std() if normalize and mask.sum() > 1 else None
    return advantage if spread is None else advantage / (spread + 1e-6)


def likelihood_ratio_objective(
    objective: str, beta: float, ddo_alpha: float, ratio_real: torch.Tensor, ratio_fake: torch.Tensor
) -> torch.Tensor:
    """The loss of the implicit discriminator ``d(x) = beta * ratio(x)`` (a sequence's log-likelihood
    ratio to the reference) on real sequences and the reference's samples.

    ``ddo`` (Zheng et al., ICML 2025): ``-log sigmoid(d(real)) - alpha * log(1 - sigmoid(d(fake)))``,
    the GAN classification loss. ``spin`` (Chen et al., ICML 2024): ``-log sigmoid(d(real_i) -
    d(fake_i))`` over pairs."""
    if objective == "ddo":
        softplus = nn.functional.softplus
        return softplus(-beta * ratio_real).mean() + ddo_alpha * softplus(beta * ratio_fake).mean()
    pairs = min(ratio_real.shape[0], ratio_fake.shape[0])
    return nn.functional.softplus(-beta * (ratio_real[:pairs] - ratio_fake[:pairs])).mean()


def kl_estimate(log_p: torch.Tensor, ref_log_p: torch.Tensor) -> torch.Tensor:
    """Per-token KL estimate from the reference on the sampled tokens (the k3 estimator:
    exp(r) - r - 1 with r = log p_ref - log p, non-negative and unbiased)."""
    ratio = ref_log_p - log_p
    return ratio.exp() - ratio - 1


def reinforce_advantages(
    ratings: torch.Tensor, mask: torch.Tensor | None, discount: float, normalize: bool
) -> tuple[torch.Tensor, torch.Tensor]:
    """REINFORCE's per-token advantages [batch, length] from the discriminator's ratings (logits)
    of whole sequences [batch] or of every prefix [batch, length], and the mean reward. A reward
    is a rating's sigmoid; a token's return is its sequence's reward, or the discounted mean of
    the rewards of the prefixes it starts (:func:`prefix_returns`); its advantage, the return
    against the batch's baseline (:func:`baseline_advantages`)."""
    if ratings.dim() == 1:
        reward = torch.sigmoid(ratings).unsqueeze(1)  # [batch, 1]
        returns = reward.expand_as(mask) if mask is not None else reward
        mean_reward = reward.mean()
    else:
        reward = torch.sigmoid(ratings)
        if mask is not None:
            reward = reward * mask
        returns = prefix_returns(reward, mask, discount)
        mean_reward = masked_mean(reward, mask)
    return baseline_advantages(returns, mask, normalize), mean_reward
