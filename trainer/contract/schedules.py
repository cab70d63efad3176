"""Learning-rate schedules: transformers' ``get_scheduler``, by name.

Importing transformers' scheduler module imports its Trainer utilities, and they import peft
where it is installed, and with it transformers' modeling stack: about 1 s of CPU in every
process of a run whose models are plain torch (a mixture, a user's own models; a few steps of
the ring on one 2-core CPU, three runs each, interleaved beside a training run: 4.6-5.1 s of
CPU without it, 5.3-6.1 s with it). The constant
schedule, the default, is built here as transformers builds it (a ``LambdaLR`` whose factor is
1 at every step; ``num_warmup_steps`` ignored), so such a run never imports that module; every
other name goes to ``get_scheduler``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch

CONSTANT = "constant"


def scheduler_names() -> list[str]:
    """Every name ``get_scheduler`` knows."""
    from transformers import SchedulerType

    return [s.value for s in SchedulerType]


def constant_factor(_step: int) -> float:
    """The constant schedule's factor on the learning rate (a named function: ``LambdaLR`` saves
    no function in its state, so a checkpoint holds the same state as transformers' own)."""
    return 1.0


def build_scheduler(name: str, optimizer: torch.optim.Optimizer, warmup_steps: int, steps: int) -> Any:
    """The schedule ``name`` of ``optimizer`` over ``steps`` optimizer steps."""
    if name == CONSTANT:
        from torch.optim.lr_scheduler import LambdaLR  # here: a config's check imports this module

        return LambdaLR(optimizer, constant_factor)
    from transformers import get_scheduler

    return get_scheduler(name, optimizer, num_warmup_steps=warmup_steps, num_training_steps=steps)
