"""Sampling tokens by inverse CDF from uniforms drawn in advance.

Every sampled token is a function of the model and one uniform number fixed beforehand, so a
sequence is the same whatever batch or rank it is generated in, and the randomness of a
run comes from the run's own generator only. It is also several times faster on the CPU than
``torch.multinomial`` over a large vocabulary.
"""

from __future__ import annotations

import torch
from transformers import LogitsProcessor


def inverse_cdf_sample(logits: torch.Tensor, uniforms: torch.Tensor) -> torch.Tensor:
    """One token per row of ``logits`` [batch, vocab], drawn from their softmax with ``uniforms`` [batch]."""
    cdf = logits.float().softmax(-1).cumsum(-1)
    threshold = uniforms.to(cdf).unsqueeze(1) * cdf[:, -1:]
    return torch.searchsorted(cdf, threshold).clamp_(max=logits.shape[-1] - 1).squeeze(1)


class InverseCdfSampling(LogitsProcessor):
    """Turns ``generate``'s greedy search into sampling driven by ``uniforms`` [batch, new tokens].

    The chosen token keeps its score and every other token gets -inf, so greedy search picks it;
    ``banned`` tokens (the start token) are never drawn.
    """

    def __init__(self, uniforms: torch.Tensor, prompt_length: int, banned: list[int]) -> None:
        self.uniforms = uniforms
        self.prompt_length = prompt_length
        self.banned = banned

    def __call__(self, input_ids: torch.LongTensor, scores: torch.FloatTensor) -> torch.FloatTensor:
        step = input_ids.shape[1] - self.prompt_length
        scores = scores.clone()
        scores[:, self.banned] = -float("inf")
        token = inverse_cdf_sample(scores, self.uniforms[:, step])
        chosen = torch.full_like(scores, -float("inf"))
        return chosen.scatter_(1, token.unsqueeze(1), 0.0)
