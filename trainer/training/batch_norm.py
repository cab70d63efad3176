"""``eval.batch_norm_refresh``: the generator's BatchNorm statistics recomputed at its current
weights before an eval.

Training moves each layer's running statistics by a share of every training forward's batch
statistics, so they trail the weights by the last few dozen forwards. PacGAN's code refreshes
them from 50 generated batches after every epoch, just before its metrics; here they are the
plain average over a set number of batches, drawn the same on every rank (a seed of the run's
seed and the step), so every rank, and a resumed run, computes the same statistics.
"""

from __future__ import annotations

import torch
from torch import nn

from trainer.contract.errors import ConfigError
from trainer.contract.task import Task
from trainer.distributed.watchdog import HEARTBEAT


def norm_layers(model: nn.Module) -> list[nn.modules.batchnorm._BatchNorm]:
    """``model``'s normalisation layers that keep running statistics."""
    return [
        module
        for module in model.modules()
        if isinstance(module, nn.modules.batchnorm._BatchNorm) and module.track_running_stats
    ]


def check_refresh(batches: int, generator: nn.Module, source: str) -> None:
    """A refresh asked for a generator without BatchNorm layers is a config error."""
    if batches and not norm_layers(generator):
        error = ConfigError(
            f"{source}: key 'eval.batch_norm_refresh' is {batches}, but the generator has no "
            "BatchNorm layer whose statistics it could refresh; set it to 0"
        )
        error.agreed = True  # the generator is built alike on every rank
        raise error


def refresh_seed(seed: int, step: int) -> int:
    """The seed of the batches the refresh before the eval at ``step`` generates."""
    return seed * 1_000_003 + 104_729 * (step + 1)


@torch.no_grad()
def refresh_statistics(task: Task, generator: nn.Module, batches: int, batch_size: int, rng: torch.Generator) -> None:
    """Set the running mean and variance of ``generator``'s BatchNorm layers to their plain
    average over ``batches`` calls of ``task.generate`` (``batch_size`` samples each, drawn from
    ``rng``), in training mode: every forward normalised by its own batch, as in training.

    The layers' momentum, counters and the generator's mode are restored afterwards, and the
    global random generators (dropout) are left as they were. (torch.optim.swa_utils.update_bn
    does this for a loader of model inputs; a task's generate draws its inputs itself.)
    """
    layers = norm_layers(generator)
    saved = [(layer.momentum, layer.num_batches_tracked.clone()) for layer in layers]
    mode = generator.training
    device = rng.device
    try:
        for layer in layers:
            layer.reset_running_stats()
            layer.momentum = None  # None: a cumulative average over the forwards
        generator.train()
        # the CPU's generator is always forked; an accelerator's, for its one device
        with torch.random.fork_rng(devices=[] if device.type == "cpu" else [device], device_type=device.type):
            for _ in range(batches):
                HEARTBEAT.beat("BatchNorm refresh before the eval")
                task.generate(generator, batch_size, rng)
    finally:
        generator.train(mode)
        for layer, (momentum, count) in zip(layers, saved, strict=True):
            layer.momentum = momentum
            layer.num_batches_tracked.copy_(count)
