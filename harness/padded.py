"""The text recipes' forwards as they were before packing: one padded batch per forward (a KV
cache built where the model's default says so), the log-softmax of the whole float32 logits, and
a classifier's head run a second time on its last hidden states. The baseline that
tests/test_packing.py checks the packed forwards against and benchmarks/bench_text.py measures
them against."""

from __future__ import annotations

import functools
from typing import Any

import torch
from accelerate.utils import extract_model_from_parallel

from trainer.tasks.packing import at_least_float32


def token_log_probs(task: Any, generator: Any, sequences: torch.Tensor, temperature: float = 1.0) -> torch.Tensor:
    start = torch.full_like(sequences[:, :1], task.start_id)
    inputs = torch.cat([start, sequences[:, :-1]], dim=1)
    logits = at_least_float32(generator(input_ids=inputs, attention_mask=torch.ones_like(inputs)).logits)
    if temperature != 1.0:
        logits = logits / temperature
    if task.banned:
        banned = torch.zeros(logits.shape[-1], dtype=torch.bool, device=logits.device)
        banned[task.banned] = True
        logits = logits.masked_fill(banned, -float("inf"))
    return logits.log_softmax(-1).gather(2, sequences.unsqueeze(2)).squeeze(2)


def score(task: Any, discriminator: Any, samples: torch.Tensor) -> torch.Tensor:
    return discriminator(input_ids=samples, attention_mask=task._attention(samples)).logits.reshape(-1)


def prefix_scores(task: Any, discriminator: Any, samples: torch.Tensor) -> torch.Tensor:
    out = discriminator(input_ids=samples, attention_mask=task._attention(samples), output_hidden_states=True)
    head = extract_model_from_parallel(discriminator).score
    return at_least_float32(head(out.hidden_states[-1]).squeeze(-1))


def use_padded(task: Any) -> None:
    """``task`` (a SequenceGanTask) computes its forwards as before packing, from now on."""
    for name, function in (("token_log_probs", token_log_probs), ("score", score), ("prefix_scores", prefix_scores)):
        setattr(task, name, functools.partial(function, task))
