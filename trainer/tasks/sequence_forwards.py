"""The forwards of the text recipes' models on token sequences: the generator's per-token
log-probabilities and the discriminator's ratings (of each sequence, or of every prefix), each
on packed rows of valid tokens (restarting ``position_ids``) where the model takes them and the
batch holds enough padding, else on the batch cut after its longest sequence.

Sequences are token tensors [batch, length]. With an end-of-sequence token, each sequence ends
at its first one and what follows is padding (:meth:`SequenceForwards.valid_mask`); without one
every position counts."""

from __future__ import annotations

import functools
import logging
import weakref
from typing import Any

import torch
from accelerate.utils import extract_model_from_parallel
from torch import nn

from trainer.contract.logs import without_log_records
from trainer.state.adapters import AdapterOff
from trainer.tasks.packing import (
    PADDING_KEPT,
    PackedLayout,
    at_least_float32,
    captured_output,
    chosen_log_probs,
    packed_layout,
    takes_packed_rows,
    widened,
)

logger = logging.getLogger("trainer")


def without_mask_notice() -> Any:
    """transformers' notice that padding ids were seen without an attention mask, dropped: a
    forward of packed rows has none by design (the restarts of ``position_ids`` are its mask),
    and ``generate``'s first forward drops the all-ones mask it is given when the start token
    doubles as the padding id (it does for GPT-2's tokenizer)."""
    return without_log_records("transformers.modeling_utils", "passing in an `attention_mask`")


class SequenceForwards:
    """What :class:`trainer.tasks.sequence_gan.SequenceGanTask` computes with its models' forwards,
    from the token ids it sets: ``start_id`` (generated after), ``pad_id``, ``eos_id`` (None:
    fixed-length sequences) and ``banned`` (never sampled)."""

    start_id: int
    pad_id: int
    eos_id: int | None
    banned: list[int]
    options: Any  # the recipe's task options: ``packed``

    def valid_mask(self, sequences: torch.Tensor) -> torch.Tensor | None:
        """1.0 up to and including each sequence's first end-of-sequence token, 0.0 after it
        (None without such a token: every position counts)."""
        if self.eos_id is None:
            return None
        ends = (sequences == self.eos_id).long()
        return ((ends.cumsum(1) - ends) == 0).float()

    def lengths(self, sequences: torch.Tensor) -> torch.Tensor:
        """Each sequence's valid tokens (:meth:`valid_mask`; all of them without an end token)."""
        mask = self.valid_mask(sequences)
        if mask is None:
            return torch.full((sequences.shape[0],), sequences.shape[1], device=sequences.device)
        return mask.sum(1).long()

    @functools.cached_property
    def _packing(self) -> weakref.WeakKeyDictionary:
        return weakref.WeakKeyDictionary()

    def packs(self, model: nn.Module, role: str) -> bool:
        """Whether ``model``'s training forwards take packed rows (checked once per model with
        :func:`takes_packed_rows`; one log line per role says which path the run takes). A
        classifier packs through its per-position ``score`` head; one without it takes padded
        batches."""
        module = extract_model_from_parallel(model)
        if isinstance(module, AdapterOff):  # the generator's own answer
            module = module.adapted
        if module not in self._packing:
            vocabulary = module.config.vocab_size
            has_head = role == "generator" or isinstance(getattr(module, "score", None), nn.Module)
            if not self.options.packed:
                answer, why = False, "task_options.packed is false"
            elif not has_head:
                answer, why = False, "no per-position score head"
            else:
                outputs = self._token_logits if role == "generator" else self._position_scores
                answer, why = takes_packed_rows(module, outputs, vocabulary), "it ignores the restarts"
            if role not in {r for r, _ in self._packing.values()}:
                packed = f"packed rows (restarting position_ids) for batches of over {PADDING_KEPT:.0%} padding"
                path = packed if answer else f"padded batches ({why})"
                logger.info(f"{role} forwards ({type(module).__name__}): {path}")
            self._packing[module] = (role, answer)
        return self._packing[module][1]

    @staticmethod
    def _token_logits(
        model: nn.Module, inputs: torch.Tensor, positions: torch.Tensor | None, mask: torch.Tensor | None
    ) -> torch.Tensor:
        # no KV cache in a training forward: it costs memory, and a cache turns packing off
        with without_mask_notice():
            return model(input_ids=inputs, position_ids=positions, attention_mask=mask, use_cache=False).logits

    @staticmethod
    def _position_scores(
        model: nn.Module, inputs: torch.Tensor, positions: torch.Tensor | None, mask: torch.Tensor | None
    ) -> torch.Tensor:
        """The classifier's head on every position [batch, length] (read from the head's own
        output, before the model pools one position: the head runs once)."""
        with captured_output(extract_model_from_parallel(model).score) as seen, without_mask_notice():
            model(input_ids=inputs, position_ids=positions, attention_mask=mask, use_cache=False)
        return at_least_float32(seen[-1].squeeze(-1))

    def _layout(self, model: nn.Module, role: str, sequences: torch.Tensor) -> tuple[PackedLayout | None, int]:
        """How a forward of ``sequences`` runs: on packed rows (their layout), or as one batch cut
        after its longest sequence (None), the longest sequence's length beside. A batch whose
        padding is at most ``PADDING_KEPT`` of its tokens stays a batch (the oracle's, of one
        length, has none)."""
        sizes = self.lengths(sequences).tolist()  # one read off the device for the choice and the layout
        longest = max(sizes)
        # The choice follows this rank's lengths, and changes no collective: either path is one
        # forward of the same model (through DDP where it is wrapped), with the same parameters.
        if self.packs(model, role) and len(sizes) * longest > (1 + PADDING_KEPT) * sum(sizes):
            return packed_layout(sizes, sequences.shape[1], sequences.device), longest
        return None, longest

    def token_log_probs(self, generator: nn.Module, sequences: torch.Tensor, temperature: float = 1.0) -> torch.Tensor:
        """The generator's ``log p(token_t | start, tokens_<t)`` [batch, length] at ``temperature``,
        start token excluded, valid tokens only (0 past a sequence's end: the caller's mask
        excludes those positions): on packed rows, or as one batch (padding is right of every
        real token, so a causal model's real positions never see it)."""
        start = torch.full_like(sequences[:, :1], self.start_id)
        inputs = torch.cat([start, sequences[:, :-1]], dim=1)
        layout, longest = self._layout(generator, "generator", sequences)
        if layout is not None:
            logits = self._token_logits(generator, layout.pack(inputs, self.pad_id), layout.positions, None)
            return layout.unpack(chosen_log_probs(logits, layout.pack(sequences, 0), temperature, self._ban(logits)))
        # The start token may double as the padding id: the mask says nothing here is padding.
        inputs, chosen = inputs[:, :longest], sequences[:, :longest]
        logits = self._token_logits(generator, inputs, None, torch.ones_like(inputs))
        return widened(chosen_log_probs(logits, chosen, temperature, self._ban(logits)), sequences.shape[1])

    def _ban(self, logits: torch.Tensor) -> torch.Tensor | None:
        if not self.banned:
            return None
        banned = torch.zeros(logits.shape[-1], dtype=torch.bool, device=logits.device)
        banned[self.banned] = True
        return banned

    def _attention(self, samples: torch.Tensor) -> torch.Tensor:
        mask = self.valid_mask(samples)
        return torch.ones_like(samples) if mask is None else mask.long()

    def _pooled_positions(self, discriminator: nn.Module, samples: torch.Tensor) -> torch.Tensor:
        """The position a sequence classifier rates a sequence at: its last valid token that is
        not the padding id (as transformers' classifiers pool; the first when there is none)."""
        pad = extract_model_from_parallel(discriminator).config.pad_token_id
        columns = torch.arange(samples.shape[1], device=samples.device)
        kept = columns < self.lengths(samples).unsqueeze(1)
        if pad is not None:
            kept = kept & (samples != pad)
        return (columns * kept).argmax(1)

    def score(self, discriminator: nn.Module, samples: torch.Tensor) -> torch.Tensor:
        if not self.packs(discriminator, "discriminator"):  # no per-position head, or it ignores restarts
            trimmed = samples[:, : int(self.lengths(samples).max())]
            mask = self._attention(trimmed)
            return discriminator(input_ids=trimmed, attention_mask=mask, use_cache=False).logits.reshape(-1)
        ratings = self.prefix_scores(discriminator, samples)
        return ratings.gather(1, self._pooled_positions(discriminator, samples).unsqueeze(1)).squeeze(1)

    def prefix_scores(self, discriminator: nn.Module, samples: torch.Tensor) -> torch.Tensor:
        """The discriminator's rating of every prefix of ``samples`` [batch, length]: its head on
        each position's final hidden state (0 past a sequence's end)."""
        layout, longest = self._layout(discriminator, "discriminator", samples)
        if layout is None:
            trimmed = samples[:, :longest]
            ratings = self._position_scores(discriminator, trimmed, None, self._attention(trimmed))
            return widened(ratings, samples.shape[1])
        rows = self._position_scores(discriminator, layout.pack(samples, self.pad_id), layout.positions, None)
        return layout.unpack(rows)
