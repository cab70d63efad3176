"""Forwards that compute valid tokens only: sequences of several lengths packed into rows with
restarting ``position_ids``, and the chosen tokens' log-probabilities without a float32 copy of
the logits.

A batch of sequences [batch, length] whose sequence i has ``lengths[i]`` valid tokens (what
follows is padding) is laid out in a few rows, each sequence whole in one row, its positions
counting from 0. transformers' models that build their attention mask with
``create_causal_mask`` (GPT-2, Llama and most causal models since transformers 4.5x) read the
restarts of ``position_ids`` as sequence boundaries when no attention mask and no cache is
given: each token attends to its own sequence's earlier tokens only, so a packed row gives the
padded forward's values. :func:`takes_packed_rows` checks that a model does, once, on a small
input, instead of trusting a version number.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import torch
from torch import nn

#: tokens a packed row aims at. Attention costs each token about ``2 x width x hidden`` multiply-adds
#: against ``12 x hidden^2`` for its projections, so rows of 256 add about 5% at GPT-2-small's
#: width (768) where one row of all tokens (2,000 and more) would add 40%.
ROW_TOKENS = 256


#: padding a batch may carry and still run as a batch: packing it could save that much at most,
#: and packed rows cost each token more attention than a short batch's rows
PADDING_KEPT = 0.05


def widened(values: torch.Tensor, width: int) -> torch.Tensor:
    """Per-position values [batch, n] of a batch cut after its longest sequence, 0 up to ``width``."""
    return torch.nn.functional.pad(values, (0, width - values.shape[1])) if values.shape[1] < width else values


@dataclass
class PackedLayout:
    """Where each valid token of a [batch, length] batch sits in [rows, width] packed rows."""

    rows: int
    width: int
    batch_shape: tuple[int, int]
    #: per valid token (sequence by sequence, in order): its sequence, its position in it, and
    #: its place in the flattened rows
    sequence: torch.Tensor
    offset: torch.Tensor
    place: torch.Tensor
    #: [rows, width] positions: each sequence's from 0, and the filler at a row's end its own
    positions: torch.Tensor

    @property
    def valid_tokens(self) -> int:
        return int(self.place.numel())

    def pack(self, values: torch.Tensor, fill: int | float) -> torch.Tensor:
        """``values`` [batch, length] laid out in [rows, width], ``fill`` where no token is."""
        rows = values.new_full((self.rows * self.width,), fill)
        rows[self.place] = values[self.sequence, self.offset]
        return rows.view(self.rows, self.width)

    def unpack(self, rows: torch.Tensor) -> torch.Tensor:
        """Per-position values [rows, width] back to [batch, length], 0 where no token is
        (differentiable)."""
        flat = rows.reshape(self.rows * self.width)
        out = flat.new_zeros(self.batch_shape)
        return out.index_put((self.sequence, self.offset), flat[self.place])


def packed_layout(sizes: list[int], length: int, device: torch.device, row_tokens: int = ROW_TOKENS) -> PackedLayout:
    """The layout of sequences of ``sizes`` valid tokens (of a batch ``length`` wide) in rows of
    about ``row_tokens`` on ``device``: longest first, each to the row that holds fewest tokens
    so far (rows end up within one sequence of each other); the width is the fullest row's.
    ``sizes`` is a list: the caller reads the lengths off the device once, for this and for its
    own choice of path."""
    total = sum(sizes)
    rows = max(1, math.ceil(total / max(row_tokens, max(sizes, default=1))))
    fill, starts, row_of = [0] * rows, [0] * len(sizes), [0] * len(sizes)
    for index in sorted(range(len(sizes)), key=lambda i: -sizes[i]):
        row = min(range(rows), key=fill.__getitem__)
        row_of[index], starts[index] = row, fill[row]
        fill[row] += sizes[index]
    width = max(max(fill), 1)
    counts = torch.tensor(sizes, dtype=torch.long, device=device)
    sequence = torch.repeat_interleave(torch.arange(len(sizes), device=device), counts)
    first = torch.cumsum(counts, 0) - counts
    offset = torch.arange(total, device=device) - torch.repeat_interleave(first, counts)
    begin = torch.tensor([r * width + s for r, s in zip(row_of, starts, strict=True)], dtype=torch.long, device=device)
    place = torch.repeat_interleave(begin, counts) + offset
    # The filler after a row's last sequence counts from 0 too: a segment of its own, which no
    # real token attends to (it comes after them all, and the mask is causal).
    columns = torch.arange(width, device=device)
    used = torch.tensor(fill, device=device).unsqueeze(1)
    positions = torch.where(columns >= used, columns - used, 0).reshape(-1)
    positions[place] = offset
    return PackedLayout(rows, width, (len(sizes), length), sequence, offset, place, positions.view(rows, width))


class ChosenLogProbs(torch.autograd.Function):
    """``log_softmax(logits / temperature)`` at the chosen tokens, banned tokens at -inf, in
    float32, a chunk of rows at a time: no float32 [rows, width, vocabulary] copy is kept (the
    logits themselves are, in their own dtype, as the backward needs them), where
    ``log_softmax(...).gather(...)`` keeps its whole float32 output for the backward and makes
    more copies for the temperature and the ban."""

    #: rows of [width, vocabulary] computed at once (a 64 x 50k float32 chunk: 13 MB)
    CHUNK_POSITIONS = 64

    @staticmethod
    def forward(
        ctx: torch.autograd.function.FunctionCtx,
        logits: torch.Tensor,
        tokens: torch.Tensor,
        temperature: float,
        banned: torch.Tensor | None,
    ) -> torch.Tensor:
        flat, chosen = logits.reshape(-1, logits.shape[-1]), tokens.reshape(-1, 1)
        out = torch.empty(chosen.shape[0], dtype=at_least_float32(logits).dtype, device=logits.device)
        normalisers = torch.empty_like(out)
        for part in _chunks(flat.shape[0]):
            scaled = _scaled(flat[part], temperature, banned)
            normalisers[part] = scaled.logsumexp(-1)
            out[part] = scaled.gather(1, chosen[part]).squeeze(1) - normalisers[part]
        ctx.save_for_backward(logits, tokens, normalisers, banned)
        ctx.temperature = temperature
        return out.view(tokens.shape)

    @staticmethod
    def backward(ctx: torch.autograd.function.FunctionCtx, grad: torch.Tensor) -> tuple[torch.Tensor, None, None, None]:
        logits, tokens, normalisers, banned = ctx.saved_tensors
        flat, chosen, upstream = logits.reshape(-1, logits.shape[-1]), tokens.reshape(-1, 1), grad.reshape(-1, 1)
        grad_logits = torch.empty_like(flat)
        for part in _chunks(flat.shape[0]):
            # d log p(chosen) / d logit_v = (1[v = chosen] - p_v) / temperature; p_v = 0 where banned
            probs = (_scaled(flat[part], ctx.temperature, banned) - normalisers[part].unsqueeze(1)).exp_()
            weights = upstream[part].to(probs.dtype)
            local = probs.mul_(-weights).scatter_add_(1, chosen[part], weights)
            grad_logits[part] = local.div_(ctx.temperature) if ctx.temperature != 1.0 else local
        return grad_logits.view(logits.shape), None, None, None


def _chunks(count: int) -> Iterator[slice]:
    for start in range(0, count, ChosenLogProbs.CHUNK_POSITIONS):
        yield slice(start, start + ChosenLogProbs.CHUNK_POSITIONS)


def at_least_float32(values: torch.Tensor) -> torch.Tensor:
    """``values`` in float32, or as they are in a wider type (float64)."""
    return values.to(torch.promote_types(values.dtype, torch.float32))


def _scaled(logits: torch.Tensor, temperature: float, banned: torch.Tensor | None) -> torch.Tensor:
    scaled = at_least_float32(logits)
    if temperature != 1.0:
        scaled = scaled / temperature
    if banned is not None:  # in place on a copy of this function's own, never on the saved logits
        scaled = (
            scaled.masked_fill(banned, -float("inf"))
            if scaled is logits
            else scaled.masked_fill_(banned, -float("inf"))
        )
    return scaled


def chosen_log_probs(
    logits: torch.Tensor, tokens: torch.Tensor, temperature: float = 1.0, banned: torch.Tensor | None = None
) -> torch.Tensor:
    """``log_softmax(logits / temperature)`` [..., vocabulary] at ``tokens`` [...], in float32 (or wider),
    with ``banned`` (a [vocabulary] bool mask) at -inf (see :class:`ChosenLogProbs`)."""
    return ChosenLogProbs.apply(logits, tokens, temperature, banned)


@contextlib.contextmanager
def captured_output(module: nn.Module) -> Iterator[list[torch.Tensor]]:
    """The outputs of ``module``'s forward while the block runs (a classifier's ``score`` head
    on every position, before the model pools one of them)."""
    seen: list[torch.Tensor] = []
    handle = module.register_forward_hook(lambda _module, _args, output: seen.append(output))
    try:
        yield seen
    finally:
        handle.remove()


#: a call of a model on (input_ids, position_ids, attention_mask or None) that returns its
#: per-position values [1, length, ...]
PerPosition = Callable[[nn.Module, torch.Tensor, torch.Tensor, "torch.Tensor | None"], torch.Tensor]


@torch.no_grad()
def takes_packed_rows(model: nn.Module, outputs: PerPosition, vocabulary: int) -> bool:
    """Whether ``model`` gives a sequence packed behind another (restarting ``position_ids``, no
    attention mask, no cache) the values it gives the sequence alone.

    The difference is weighed against what a model that ignored the restart would give (the
    same row under an all-ones mask: the second sequence sees the first), so the answer does not
    depend on the precision the forward runs in. Dropout is off for the check. Every rank gets
    the same answer (the same weights and inputs); the module is called, not a DDP wrapper, so
    no collective runs."""
    device = next(model.parameters()).device
    tokens = torch.randint(0, vocabulary, (1, 16), generator=torch.Generator().manual_seed(0)).to(device)
    positions = torch.arange(8, device=device).repeat(2).unsqueeze(0)
    training = model.training
    model.eval()
    try:
        try:
            packed = outputs(model, tokens, positions, None)[:, 8:].double()
        except (TypeError, ValueError):  # no position_ids argument, or a shape it refuses
            return False
        alone = outputs(model, tokens[:, 8:], positions[:, 8:], None).double()
        joined = outputs(model, tokens, positions, torch.ones_like(tokens))[:, 8:].double()
    finally:
        model.train(training)
    seen_first = (joined - alone).abs().max()
    return bool(seen_first > 0 and (packed - alone).abs().max() <= 0.1 * seen_first)
