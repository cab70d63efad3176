"""Each rank's running statistics after every step of a run, and the average's final state,
written to OUT/rank{R}.pt: a caller driving a Trainer step by step.

    python tests/batch_norm_ranks.py CONFIG OUT
"""

from __future__ import annotations

import sys

import torch

from trainer.contract.config import load_config
from trainer.training.loop import Trainer


def main(config: str, out: str) -> None:
    seen = []
    with Trainer(load_config(config), device="cpu").start() as trainer:
        while trainer.state.step < trainer.config.training.max_steps:
            trainer.step()
            statistics = {name: b.clone() for name, b in trainer.g.unwrapped.named_buffers()}
            if trainer.ema is not None:
                statistics.update({f"ema.{n}": b.clone() for n, b in trainer.ema.model.named_buffers()})
            seen.append(statistics)
        rank, world = trainer.accelerator.process_index, trainer.accelerator.num_processes
        average = trainer.ema.model.state_dict() if trainer.ema is not None else {}
    torch.save({"world_size": world, "steps": seen, "average": average}, f"{out}/rank{rank}.pt")


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
