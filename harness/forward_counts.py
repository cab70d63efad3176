"""Positions computed against valid tokens, per part of a training step: what padding costs.

Forward pre-hooks on the models count the positions each training forward computes (its
``input_ids``; a forward with ``use_cache=True`` is generation and is not counted); the valid
tokens come from the caller: the attention mask's ones (TRL), or the text recipes' own count of
a batch's tokens up to each end token (the trainer, whose packed rows need no mask). Each count
goes to the part of the step running at the time (``part()``)."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable
from typing import Any

from torch import nn


class ForwardCounts:
    """Per part: positions computed and valid tokens, summed over the forwards counted."""

    def __init__(self, part: Callable[[], str]) -> None:
        self.part = part
        self.positions: dict[str, int] = defaultdict(int)
        self.valid: dict[str, int] = defaultdict(int)
        self._depth = 0

    def reset(self) -> None:
        self.positions.clear()
        self.valid.clear()

    def watch(self, model: nn.Module, valid_from_mask: bool = False) -> None:
        """Count ``model``'s training forwards (and, with ``valid_from_mask``, their valid tokens
        as the ones of their attention mask)."""

        def count(_module: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
            if kwargs.get("use_cache") is True:
                return
            inputs = kwargs.get("input_ids", args[0] if args else None)
            if inputs is None:
                return
            self.positions[self.part()] += inputs.numel()
            if valid_from_mask:
                mask = kwargs.get("attention_mask")
                self.valid[self.part()] += inputs.numel() if mask is None else int(mask.sum())

        model.register_forward_pre_hook(count, with_kwargs=True)

    def counting(self, function: Callable[..., Any], valid: Callable[..., int]) -> Callable[..., Any]:
        """``function`` adding ``valid(*its arguments)`` valid tokens (the outermost call only:
        a rating that calls another rating counts once)."""

        def counted(*args: Any, **kwargs: Any) -> Any:
            if self._depth == 0:
                self.valid[self.part()] += valid(*args, **kwargs)
            self._depth += 1
            try:
                return function(*args, **kwargs)
            finally:
                self._depth -= 1

        return counted

    def per_step(self, steps: int) -> dict[str, list[float]]:
        """Per part: [positions, valid tokens] per step."""
        return {part: [self.positions[part] / steps, self.valid.get(part, 0) / steps] for part in self.positions}


def count_task_tokens(counts: ForwardCounts, task: Any) -> None:
    """The trainer's text task counts the valid tokens of each batch its forwards take."""
    tokens = lambda _model, sequences, *a, **k: int(task.lengths(sequences).sum())  # noqa: E731
    for name in ("token_log_probs", "score", "prefix_scores"):
        setattr(task, name, counts.counting(getattr(task, name), tokens))
