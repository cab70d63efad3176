"""What the parts of bench_text.py share: the model sizes and objectives, the paths, the time of
each part of a step and the peak memory."""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

#: model shapes: layers, width, heads (the vocabulary is the example tokenizer's)
SIZES = {"tiny": (2, 64, 2), "small": (12, 768, 12)}
#: the trainer's objective of each row, and what TRL runs against it (see the docstring)
OBJECTIVES = {"minimal": "GRPO, beta 0", "shipped": "GRPO, beta = kl_coef, a reference model"}


def peak_mb(args: argparse.Namespace) -> float:
    """This process's peak memory: allocated GPU memory on CUDA, resident set size on the CPU."""
    import torch

    from trainer.distributed.world import peak_memory_mb

    return peak_memory_mb(torch.device(args.device))


#: the parts of a step timed on both sides, in the order of the table
PARTS = ("generation", "reward", "reference", "G forward", "G backward", "D step", "optimizer", "other")


class PartTimes:
    """Seconds spent in each part of a step, each second counted once: in the innermost timed
    call (a reward computed inside the generator's loss counts as reward), except inside an
    absorbing part (the D step holds its own sampling, forward, backward and optimizer)."""

    def __init__(self) -> None:
        self.seconds = dict.fromkeys(PARTS, 0.0)
        self._stack: list[list[Any]] = []  # [part, absorbing, start of its current stretch]

    def reset(self) -> None:
        self.seconds = dict.fromkeys(PARTS, 0.0)

    def wrap(self, function: Any, part: Any, absorbing: bool = False) -> Any:
        """``function`` timed as ``part`` (a name, or a function of the call's arguments giving
        the name or None: not timed)."""

        def timed(*a: Any, **k: Any) -> Any:
            name = part(*a, **k) if callable(part) else part
            if name is None or (self._stack and self._stack[-1][1]):
                return function(*a, **k)
            now = time.perf_counter()
            if self._stack:
                outer = self._stack[-1]
                self.seconds[outer[0]] += now - outer[2]
            self._stack.append([name, absorbing, now])
            try:
                return function(*a, **k)
            finally:
                now = time.perf_counter()
                self.seconds[name] += now - self._stack.pop()[2]
                if self._stack:
                    self._stack[-1][2] = now

        return timed

    def current(self) -> str:
        """The part running now (``other`` outside every timed part)."""
        return self._stack[-1][0] if self._stack else "other"

    def holds(self, part: str) -> bool:
        """Whether the call being made is inside ``part``."""
        return any(entry[0] == part for entry in self._stack)

    def per_step(self, steps: int, seconds: float) -> dict[str, float]:
        """Milliseconds per step of each part; ``other`` is the step's time outside them."""
        timed = {part: value for part, value in self.seconds.items() if part != "other"}
        timed["other"] = max(seconds - sum(timed.values()), 0.0)
        return {part: 1000 * value / steps for part, value in timed.items()}


def time_adamw(times: PartTimes) -> None:
    """AdamW's step timed as ``optimizer`` (both sides use torch's AdamW), for the optimizers
    made after this call."""
    import torch

    torch.optim.AdamW.step = times.wrap(torch.optim.AdamW.step, "optimizer")
