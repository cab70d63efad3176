"""Eval over the sharded eval set: every sample scored exactly once, on every rank alike.

Entered by every rank at the same optimizer step (a pure function of the step), so the
collectives inside (padding, gathering, one broadcast of the metrics) line up without a
barrier.
"""

from __future__ import annotations

from typing import Any

import torch
from accelerate import Accelerator
from torch import nn
from tqdm.auto import tqdm

from trainer.contract.task import Task
from trainer.distributed import collectives
from trainer.distributed.watchdog import HEARTBEAT

#: seconds an eval runs before its progress bar shows
EVAL_BAR_DELAY_S = 3.0


def _pad_to(tensor: torch.Tensor, length: int, value: float) -> torch.Tensor:
    if tensor.dim() < 2 or tensor.shape[1] == length:
        return tensor
    pad = tensor.new_full((tensor.shape[0], length - tensor.shape[1], *tensor.shape[2:]), value)
    return torch.cat([tensor, pad], dim=1)


def concatenate(chunks: list[dict[str, torch.Tensor]], pad_value: float) -> dict[str, torch.Tensor]:
    """Join per-batch outputs along the sample dimension, padding dimension 1 where lengths differ."""
    joined = {}
    for key in chunks[0]:
        parts = [chunk[key] for chunk in chunks]
        longest = max((p.shape[1] for p in parts if p.dim() >= 2), default=0)
        joined[key] = torch.cat([_pad_to(p, longest, pad_value) for p in parts])
    return joined


def output_layout(outputs: dict[str, torch.Tensor]) -> str:
    """Keys (in order), number of dimensions and dtype of a batch of eval outputs."""
    return ", ".join(
        f"{key} {value.dim()} dims {str(value.dtype).removeprefix('torch.')}" for key, value in outputs.items()
    )


@torch.no_grad()
def evaluate(
    accelerator: Accelerator,
    task: Task,
    generator: nn.Module,
    discriminator: nn.Module,
    dataloader: Any,
) -> tuple[dict[str, Any], dict[str, torch.Tensor]]:
    """Score the eval set; returns the metrics (with ``num_samples``) and the gathered outputs.

    Metrics are computed from the gathered outputs and then taken from the main process, so
    every rank acts on exactly the same numbers (best checkpoint, logging).
    """
    unwrapped_g, unwrapped_d = accelerator.unwrap_model(generator), accelerator.unwrap_model(discriminator)
    modes = unwrapped_g.training, unwrapped_d.training  # a frozen discriminator stays in eval mode
    unwrapped_g.eval()
    unwrapped_d.eval()
    chunks = []
    # A bar on the main process, shown once the eval has taken EVAL_BAR_DELAY_S (a short eval
    # shows none); like the training bar, none in a log file or pipe.
    bar = tqdm(
        total=len(dataloader),
        desc="eval",
        disable=None if accelerator.is_main_process else True,
        delay=EVAL_BAR_DELAY_S,
        leave=False,
        dynamic_ncols=True,
    )
    try:
        for batch in collectives.start_iterator(dataloader, "eval"):
            HEARTBEAT.beat("eval")
            bar.update(1)
            outputs = task.eval_outputs(unwrapped_g, unwrapped_d, batch)
            if not chunks:  # the keys, ranks and dtypes decide the collectives that follow
                collectives.check_same_on_every_rank(
                    accelerator,
                    output_layout(outputs),
                    f"{type(task).__name__} returns different eval outputs",
                    "eval_outputs must return the same keys, each with the same number of "
                    "dimensions and dtype, on every rank (they are gathered across ranks)",
                )
            gathered = collectives.gather_outputs(accelerator, outputs, task.eval_pad_value)
            chunks.append({key: value.cpu() for key, value in gathered.items()})
    finally:
        bar.close()
        unwrapped_g.train(modes[0])
        unwrapped_d.train(modes[1])
    outputs = concatenate(chunks, task.eval_pad_value)
    metrics: dict[str, Any] = dict(task.eval_metrics(outputs))
    metrics["num_samples"] = len(next(iter(outputs.values())))
    return collectives.from_main_process(accelerator, metrics, "the eval metrics"), outputs
