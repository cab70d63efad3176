"""The order in which a run takes its real samples and draws its noise, one for every number
of processes, so that a run is a function of its seed and config and resumes on another world;
and the resumable stream of micro-batches in that order.

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
from typing import Any

import torch
from accelerate import Accelerator
from accelerate.logging import get_logger
from accelerate.utils import send_to_device

from trainer.contract.config import TrainingSection
from trainer.contract.task import EndlessRows

logger = get_logger("trainer")


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


class EndlessBatches(torch.utils.data.Sampler):
    """The index lists of rank ``rank``'s micro-batches of an endless training set
    (:class:`~trainer.contract.task.EndlessRows`): global micro-batch ``j`` is rows
    ``[j*b, (j+1)*b)``, from ``start`` on."""

    def __init__(self, batch_size: int, rank: int, world: int, start: int) -> None:
        self.batch_size, self.rank, self.world, self.start = batch_size, rank, world, start

    def __iter__(self) -> Iterator[list[int]]:
        index = self.start + self.rank
        while True:
            yield list(range(index * self.batch_size, (index + 1) * self.batch_size))
            index += self.world


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


class BatchStream:
    """Endless micro-batches of the training set in the run's order (:mod:`trainer.training.sample_order`:
    the same samples in each optimizer step at any number of processes), on the device, with a
    resumable position: the global micro-batches every rank has taken between them."""

    def __init__(self, accelerator: Accelerator, dataset: Any, training: TrainingSection, collate: Any) -> None:
        self.accelerator, self.dataset, self.collate = accelerator, dataset, collate
        self.batch_size, self.seed, self.num_workers = training.batch_size, training.seed, training.num_workers
        self.taken = 0
        self.iterator: Iterator[Any] | None = None

    def next(self) -> Any:
        acc = self.accelerator
        if self.iterator is None:
            rank, world = acc.process_index, acc.num_processes
            batches: torch.utils.data.Sampler = (
                EndlessBatches(self.batch_size, rank, world, self.taken)
                if isinstance(self.dataset, EndlessRows)
                else GlobalBatches(len(self.dataset), self.batch_size, self.seed, rank, world, self.taken)
            )
            # a generator of its own for the workers' base seed: none drawn from torch's global one
            loader = torch.utils.data.DataLoader(
                self.dataset, batch_sampler=batches, collate_fn=self.collate, num_workers=self.num_workers,
                generator=torch.Generator().manual_seed(self.seed),
            )  # fmt: skip
            self.iterator = iter(loader)
        batch = next(self.iterator)
        self.taken += acc.num_processes  # every rank takes one at the same point
        return send_to_device(batch, acc.device)

    def state_dict(self) -> dict[str, int]:
        return {"micro_batches": self.taken}

    def load_state_dict(self, record: dict[str, Any]) -> None:
        if "micro_batches" not in record:  # checkpoints before 2026-12-07: accelerate's order
            world = self.accelerator.num_processes
            per_epoch = len(self.dataset) // self.batch_size
            taken = record["epoch"] * per_epoch + record["position"] * world
            self.taken = -(-taken // world) * world
            logger.warning(
                f"the checkpoint's data position is in the order of checkpoints before 2026-12-07: the run goes on "
                f"at global micro-batch {self.taken} of the current order (about as many samples, not the same ones)"
            )
        else:
            self.taken = record["micro_batches"]
        self.iterator = None
