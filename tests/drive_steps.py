"""A caller driving a Trainer step by step, as a notebook or a benchmark does: ``start()``, one
``step()``, then a pause of PAUSE seconds either in the caller's code (``between``) or inside
the next step (``inside``, on the last rank only: the task's generator loss sleeps once), then
steps to the end. Prints the world size and the step reached.

    python tests/drive_steps.py CONFIG PAUSE between|inside
"""

from __future__ import annotations

import sys
import time

from trainer.contract.config import load_config
from trainer.training.loop import Trainer


def main(config: str, pause: float, where: str) -> None:
    with Trainer(load_config(config), device="cpu").start() as trainer:
        trainer.step()
        acc = trainer.accelerator
        if where == "between":
            time.sleep(pause)
        elif acc.process_index == acc.num_processes - 1:
            task, loss = trainer.task, trainer.task.generator_loss

            def sleep_once(*args, **kwargs):
                task.generator_loss = loss
                time.sleep(pause)
                return loss(*args, **kwargs)

            task.generator_loss = sleep_once
        while trainer.state.step < trainer.config.training.max_steps:
            trainer.step()
        print(f"world size {acc.num_processes}, step {trainer.state.step}", flush=True)


if __name__ == "__main__":
    main(sys.argv[1], float(sys.argv[2]), sys.argv[3])
