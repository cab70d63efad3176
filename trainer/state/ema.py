"""An exponential moving average of the generator's weights (``training.ema_decay``).

GAN practice evaluates and ships the average (StyleGAN's ``G_ema``, diffusers' ``--use_ema``):
the raw generator's quality swings from one step to the next. The average is torch's
``AveragedModel`` of a copy of the generator made before accelerate prepares it (a copy of
the prepared one would carry accelerate's forward wrapper, which calls the original model).
It is updated after every generator optimizer step from the unwrapped weights, which are the same
on every rank: no collective.
"""

from __future__ import annotations

import torch
from accelerate import Accelerator
from torch import nn
from torch.optim.swa_utils import AveragedModel

from trainer.distributed import sharding


class GeneratorEma:
    """The average of ``model``'s weights and buffers over generator steps.

    Until generator step ``start`` the average is a copy of the weights; after it, each step
    moves it by ``1 - decay`` towards them, with ``warmup`` by ``1 - min(decay, (1 + n) /
    (10 + n))`` at its n-th update, so that an early average does not remember the first
    steps' weights for long."""

    def __init__(self, model: nn.Module, decay: float, start: int, warmup: bool, device: torch.device) -> None:
        self.decay, self.start, self.warmup = decay, start, warmup
        self.averaged = AveragedModel(model, device=device, multi_avg_fn=self._average, use_buffers=True)
        self.averaged.requires_grad_(False)
        # The copy counts as averaged once (AveragedModel would copy at its first update): with
        # ema_start 0 the average starts from the initial weights, as StyleGAN's G_ema does.
        self.averaged.n_averaged.fill_(1)
        #: updates since the average started (its ``n_averaged`` lives on the device)
        self.updates = 0

    def shard(self, accelerator: Accelerator) -> None:
        """Under FSDP2: the average sharded as the prepared generator is, so each rank averages
        its own shards (no collective) and holds a shard's worth of memory."""
        self.averaged.module = sharding.shard_like_prepared(accelerator, self.averaged.module)

    @property
    def model(self) -> nn.Module:
        """The averaged generator, a module like the generator."""
        return self.averaged.module

    def _average(self, averaged: list[torch.Tensor], current: list[torch.Tensor], _: torch.Tensor) -> None:
        """One group of tensors of one dtype (AveragedModel groups them by device and dtype)."""
        if not averaged[0].is_floating_point():
            # counters and masks (BatchNorm's num_batches_tracked, a boolean attention mask)
            # follow the model: an average of them means nothing, and lerp rejects them
            torch._foreach_copy_(averaged, current)
            return
        decay = min(self.decay, (1 + self.updates) / (10 + self.updates)) if self.warmup else self.decay
        # Under FSDP2 a group mixes the parameters' DTensor shards and the buffers' plain tensors,
        # and torch's foreach ops take one kind at a time.
        for kind in {type(tensor) for tensor in averaged}:
            pairs = [(a, c) for a, c in zip(averaged, current, strict=True) if type(a) is kind]
            # as torch's get_ema_multi_avg_fn
            torch._foreach_lerp_([a for a, _ in pairs], [c for _, c in pairs], 1 - decay)

    @torch.no_grad()
    def update(self, generator: nn.Module, step: int) -> None:
        """After generator optimizer step ``step`` (counted from 1), from the unwrapped generator."""
        if step <= self.start:
            self.averaged.n_averaged.zero_()  # the next update copies the weights
        else:
            self.updates += 1
        for model in (self.averaged.module, generator):  # shards with shards, under FSDP2
            sharding.reshard(model)
        self.averaged.update_parameters(generator)

    def state_dict(self) -> dict[str, int]:
        return {"updates": self.updates}

    def load_state_dict(self, record: dict[str, int]) -> None:
        self.updates = record["updates"]
