"""The text recipes' eval metrics beyond likelihoods: the discriminator's accuracy, the
correlation of its ratings with quality, the variety of generated sequences, BLEU."""

from __future__ import annotations

import math
from collections.abc import Callable

import torch


def discriminator_accuracy(outputs: dict[str, torch.Tensor]) -> float:
    """The eval's ``d_accuracy``: real rated above 0, generated at or below, over both."""
    correct = (outputs["d_real"] > 0).sum() + (outputs["d_fake"] <= 0).sum()
    return float(correct) / (2 * len(outputs["d_real"]))


def distinct_bigrams(rows: list[list[int]]) -> float:
    """The eval's ``distinct2``: distinct bigrams over all bigrams of the generated rows (padding,
    negative, dropped); low when samples repeat themselves or one another."""
    bigrams: list[tuple[int, int]] = []
    for row in rows:
        tokens = [t for t in row if t >= 0]
        bigrams.extend(zip(tokens, tokens[1:], strict=False))
    return len(set(bigrams)) / len(bigrams) if bigrams else 0.0


def pearson(x: torch.Tensor, y: torch.Tensor) -> float:
    """Pearson's correlation of two equally long vectors; NaN where either is constant (a
    rating that never changes says nothing about quality)."""
    x, y = x.double() - x.double().mean(), y.double() - y.double().mean()
    spread = float((x.square().sum() * y.square().sum()).sqrt())
    return float((x * y).sum()) / spread if spread > 0 else math.nan


def mean_bleu(hypotheses: list[list[str]], references: Callable[[int], list[list[str]]]) -> float:
    """The mean sentence BLEU-4 of word lists against ``references(i)`` for the i-th, as the
    text-GAN literature computes BLEU (against held-out texts: quality) and Self-BLEU (against
    the other generated texts: lack of diversity): nltk's ``sentence_bleu`` with uniform
    weights and smoothing method 1 (Texygen's). An empty hypothesis, or one without
    references, scores 0."""
    from nltk.translate.bleu_score import SmoothingFunction, sentence_bleu

    smoothing = SmoothingFunction().method1
    scores = []
    for i, words in enumerate(hypotheses):
        refs = references(i)
        scores.append(sentence_bleu(refs, words, smoothing_function=smoothing) if words and refs else 0.0)
    return float(sum(scores) / len(scores)) if scores else 0.0
