"""The fault matrix's task: the ring recipe with faults injected by option (a NaN, a kill, a
freeze, a stop signal, an error in a task method, a collective on one rank, a slow rename, a
broken task contract), and a checksum of every rank's weights in each eval.

Launched runs name it ``task: harness.faultmatrix.inject:Faults``.
"""

from __future__ import annotations

import os
import signal
import time
from dataclasses import dataclass
from pathlib import Path

import torch
from torch.distributed.tensor import DTensor

from trainer.tasks.gaussian_mixture import GaussianMixtureOptions, GaussianMixtureTask


@dataclass
class FaultOptions(GaussianMixtureOptions):
    #: the discriminator loss is NaN on this rank for D-loss calls first..last (1-based)
    nan_rank: int = -1
    nan_first_call: int = 0
    nan_last_call: int = 0
    #: each process writes its pid to DIR/rank{R}.pid at its first step
    pid_dir: str = ""
    step_sleep_s: float = 0.0
    #: on this D-loss call, rank 0 alone enters an all_reduce (0: never)
    rogue_collective_call: int = 0
    #: on this D-loss call, rank ``kill_rank`` kills itself with SIGKILL, once per job: it first
    #: creates the file ``kill_marker``, and a process that finds it there does not kill itself
    kill_call: int = 0
    kill_rank: int = -1
    kill_marker: str = ""
    #: the task method that raises ``raise_error`` on rank ``raise_rank`` at its
    #: ``raise_call``-th call: train_dataset, generate, eval_outputs or on_eval ("": none)
    raise_in: str = ""
    raise_rank: int = 0
    raise_call: int = 1
    raise_error: str = "RuntimeError"
    #: the main process sleeps this long before each rename of a checkpoint or a weights
    #: directory (a slow shared filesystem), while the other ranks wait
    slow_rename_s: float = 0.0
    #: on this D-loss call, each rank sends itself SIGTERM (0: never)
    sigterm_call: int = 0
    #: rank 1 breaks the task contract: "loss_part" (an extra loss part), "eval_key" (an
    #: extra eval output) or "eval_rank" (an eval output with one more dimension) ("": never)
    uneven: str = ""


def whole(param: torch.Tensor) -> torch.Tensor:
    """A parameter whole: under FSDP2 its shards gathered (every rank's eval calls this alike)."""
    return param.full_tensor() if isinstance(param, DTensor) else param


ERRORS = {
    "RuntimeError": RuntimeError,
    "OSError": OSError,
    "OutOfMemoryError": torch.OutOfMemoryError,
}


class Faults(GaussianMixtureTask):
    """Injects faults by option, and reports a checksum of every rank's weights at eval."""

    Options = FaultOptions
    calls = 0
    method_calls: dict[str, int] = {}

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        # Path.rename for the whole process: this process is a fault-matrix run, nothing else
        # runs in it, and the trainer renames through Path.rename alone.
        if self.options.slow_rename_s and not getattr(Path, "_slowed", False):
            rename, delay = Path.rename, self.options.slow_rename_s

            def slow_rename(path, target):
                if torch.distributed.is_initialized() and torch.distributed.get_rank() == 0:
                    time.sleep(delay)
                return rename(path, target)

            Path.rename, Path._slowed = slow_rename, True

    def _maybe_raise(self, method: str) -> None:
        o = self.options
        Faults.method_calls[method] = Faults.method_calls.get(method, 0) + 1
        rank = torch.distributed.get_rank() if torch.distributed.is_initialized() else 0
        if o.raise_in == method and rank == o.raise_rank and Faults.method_calls[method] == o.raise_call:
            raise ERRORS[o.raise_error](f"injected in {method} on rank {rank}")

    def train_dataset(self):
        self._maybe_raise("train_dataset")
        return super().train_dataset()

    def generate(self, generator, num, rng, batch=None):
        self._maybe_raise("generate")
        return super().generate(generator, num, rng, batch)

    def on_eval(self, step, outputs, output_dir, trackers):
        self._maybe_raise("on_eval")
        return super().on_eval(step, outputs, output_dir, trackers)

    def discriminator_loss(self, discriminator, real, fake, rng, penalties):
        rank = torch.distributed.get_rank() if torch.distributed.is_initialized() else 0
        Faults.calls += 1
        o = self.options
        if Faults.calls == 1 and o.pid_dir:
            Path(o.pid_dir, f"rank{rank}.pid").write_text(str(os.getpid()))
        if o.step_sleep_s:
            time.sleep(o.step_sleep_s)
        if rank == 0 and Faults.calls == o.rogue_collective_call:
            torch.distributed.all_reduce(torch.ones(3))
        if Faults.calls == o.sigterm_call:
            os.kill(os.getpid(), signal.SIGTERM)
        if rank == o.kill_rank and Faults.calls == o.kill_call and not Path(o.kill_marker).exists():
            Path(o.kill_marker).write_text(str(os.getpid()))
            os.kill(os.getpid(), signal.SIGKILL)
        loss, parts = super().discriminator_loss(discriminator, real, fake, rng, penalties)
        if rank == o.nan_rank and o.nan_first_call <= Faults.calls <= o.nan_last_call:
            loss = loss * float("nan")
        if rank == 1 and o.uneven == "loss_part":
            parts["extra"] = loss.detach()
        return loss, parts

    def eval_outputs(self, generator, discriminator, batch):
        self._maybe_raise("eval_outputs")
        outputs = super().eval_outputs(generator, discriminator, batch)
        checksum = sum(whole(p).double().sum() for p in [*generator.parameters(), *discriminator.parameters()])
        outputs["checksum"] = checksum.expand(len(batch["real"])).clone()
        rank = torch.distributed.get_rank() if torch.distributed.is_initialized() else 0
        if rank == 1 and self.options.uneven == "eval_key":
            outputs["extra"] = outputs["checksum"].clone()
        if rank == 1 and self.options.uneven == "eval_rank":
            outputs["checksum"] = outputs["checksum"][:, None]
        return outputs

    def eval_metrics(self, outputs):
        metrics = super().eval_metrics(outputs)
        metrics["checksum_spread"] = float(outputs["checksum"].max() - outputs["checksum"].min())
        metrics["checksum_finite"] = bool(torch.isfinite(outputs["checksum"]).all())
        return metrics
