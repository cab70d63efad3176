"""The order in which a run takes its real samples and draws its noise, one for every number
of processes, so that a run is a function of its seed and config and resumes on another world.

Global micro-batch ``j`` holds positions ``[j*b, (j+1)*b)`` of epoch ``j // M``'s permutation
(``b`` the per-process batch, ``M`` the whole batches of ``b`` in the training set; each
epoch's last ``size mod b`` samples wait for a later shuffle, as with ``drop_last``). Rank
``r`` of ``W`` takes ``j = r, r + W, r + 2W, ...``: the ``A`` micro-batches an optimizer phase
accumulates on each rank are, over all ranks, the ``A * W`` consecutive global micro-batches,
whatever ``W`` is, as long as ``A * W`` (the global batch over ``b``) is the run's.

Accelerate's prepared loader shards an epoch by the world size (its ``even_batches`` repeats
samples at an epoch's end to give every rank the same count, and without it the ranks' counts
differ), so no position in it continues on another world: the run keeps this order itself.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterator

import torch


def epoch_order(size: int, seed: int, epoch: int) -> torch.Tensor:
    """Epoch ``epoch``'s permutation of ``range(size)``, a function of the seed and the epoch
    (a tensor: 8 bytes a sample, where a list of ints would take about 36)."""
    return torch.randperm(size, generator=torch.Generator().manual_seed(derived_seed("epoch", seed, epoch)))


def derived_seed(*key: object) -> int:
    """A 63-bit seed from ``key``; keys that differ give unrelated seeds."""
    digest = hashlib.blake2b("/".join(map(str, key)).encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little") & (2**63 - 1)


def noise_seed(seed: int, step: int, phase: int, micro_batch: int) -> int:
    """The seed of the noise of one global micro-batch: optimizer step ``step`` (counted from
    0), phase ``phase`` of the step (the discriminator phases first, then the generator's) and
    its global index among the phase's micro-batches, ``k * W + r`` for rank ``r``'s ``k``-th."""
    return derived_seed("noise", seed, step, phase, micro_batch)


class GlobalBatches(torch.utils.data.Sampler):
    """The index lists of rank ``rank``'s micro-batches, endless, from global micro-batch
    ``start`` (a multiple of ``world``: the micro-batches all ranks have taken) on."""

    def __init__(self, size: int, batch_size: int, seed: int, rank: int, world: int, start: int) -> None:
        if size < batch_size:
            raise ValueError(f"{size} samples are fewer than one batch of {batch_size}")
        self.size, self.batch_size, self.seed = size, batch_size, seed
        self.rank, self.world, self.start = rank, world, start
        self.per_epoch = size // batch_size

    def __iter__(self) -> Iterator[list[int]]:
        index, cached, order = self.start + self.rank, -1, torch.empty(0, dtype=torch.long)
        while True:
            epoch, batch = divmod(index, self.per_epoch)
            if epoch != cached:
                cached, order = epoch, epoch_order(self.size, self.seed, epoch)
            yield order[batch * self.batch_size : (batch + 1) * self.batch_size].tolist()
            index += self.world
