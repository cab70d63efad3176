"""Tasks used by the tests, loaded by launched runs as ``fixture_tasks:Class``."""

from __future__ import annotations

import json
import os
import signal
import time
from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar

import torch

from trainer.tasks.gaussian_mixture import GaussianMixtureOptions, GaussianMixtureTask
from trainer.tasks.oracle_text import OracleTextTask

FIXED_LATENTS = torch.randn(64, 2, generator=torch.Generator().manual_seed(99))


class FixedNoiseMixture(GaussianMixtureTask):
    """The ring recipe with the same latent rows at every call, so that the samples of a step
    are known to a hand-written reference whatever the number of processes."""

    def generate(self, generator, num, rng, batch=None):
        return generator(FIXED_LATENTS[:num].to(rng.device))


class Overflow(GaussianMixtureTask):
    """Makes the discriminator's loss infinite while ``armed`` is set."""

    armed = False

    def discriminator_loss(self, discriminator, real, fake, rng, penalties):
        loss, parts = super().discriminator_loss(discriminator, real, fake, rng, penalties)
        return (loss * float("inf") if Overflow.armed else loss), parts


class PenaltyScale(GaussianMixtureTask):
    """Records the gradient scale each discriminator step's penalties were given."""

    seen: ClassVar[list[float]] = []

    def discriminator_loss(self, discriminator, real, fake, rng, penalties):
        PenaltyScale.seen.append(float(penalties.grad_scale))
        return super().discriminator_loss(discriminator, real, fake, rng, penalties)


class ReducerWatch(FixedNoiseMixture):
    """FixedNoiseMixture that counts the discriminator's DDP all-reduces and fails the run if
    any happens between the start of a generator phase and the next discriminator phase."""

    reductions = 0
    seen_at_generator_phase: int | None = None

    def discriminator_loss(self, discriminator, real, fake, rng, penalties):
        cls = ReducerWatch
        if isinstance(discriminator, torch.nn.parallel.DistributedDataParallel):
            if not getattr(discriminator, "_test_hooked", False):
                from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import allreduce_hook

                def counting(state, bucket):
                    cls.reductions += 1
                    return allreduce_hook(None, bucket)

                discriminator.register_comm_hook(None, counting)
                discriminator._test_hooked = True
        if cls.seen_at_generator_phase is not None and cls.reductions != cls.seen_at_generator_phase:
            raise RuntimeError("the discriminator's DDP reducer ran during the generator phase")
        cls.seen_at_generator_phase = None
        return super().discriminator_loss(discriminator, real, fake, rng, penalties)

    def generator_loss(self, generator, discriminator, num, rng, batch=None):
        if isinstance(discriminator, torch.nn.parallel.DistributedDataParallel):
            raise RuntimeError("the generator phase got the DDP-wrapped discriminator")
        if ReducerWatch.seen_at_generator_phase is None:
            ReducerWatch.seen_at_generator_phase = ReducerWatch.reductions
        return super().generator_loss(generator, discriminator, num, rng, batch)


class DropoutMixture(GaussianMixtureTask):
    """The ring recipe with dropout in the discriminator: its masks come from torch's global
    CPU generator, so an exact resume needs that generator's stream to continue exactly."""

    def build_discriminator(self):
        return torch.nn.Sequential(torch.nn.Dropout(0.3), super().build_discriminator())


class IndexedEval(GaussianMixtureTask):
    """Eval outputs carry each sample's index and a row whose length differs by rank, so a test
    can see that every eval sample was scored exactly once after padding and gathering."""

    eval_pad_value = -1

    def eval_dataset(self):
        dataset = super().eval_dataset()
        dataset.columns["index"] = torch.arange(len(dataset))
        return dataset

    def eval_outputs(self, generator, discriminator, batch):
        outputs = super().eval_outputs(generator, discriminator, batch)
        rank = torch.distributed.get_rank() if torch.distributed.is_initialized() else 0
        outputs["index"] = batch["index"]
        outputs["row"] = batch["index"][:, None].repeat(1, 3 + rank)
        return outputs

    def eval_metrics(self, outputs):
        metrics = super().eval_metrics(outputs)
        index, row = outputs["index"], outputs["row"]
        filled = row != -1
        metrics["distinct"] = int(index.unique().numel())
        metrics["index_sum"] = int(index.sum())
        metrics["rows_match"] = bool(((row == index[:, None]) | ~filled).all())
        metrics["row_lengths"] = sorted(set(filled.sum(dim=1).tolist()))
        return metrics


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
        checksum = sum(p.double().sum() for p in [*generator.parameters(), *discriminator.parameters()])
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


class RankLengthOracle(OracleTextTask):
    """oracle_text whose generated eval sequences are shorter on rank r by r tokens, so that a
    test can see sequences of different lengths gathered across ranks with an exact count; each
    rank writes when it read the training data to OUTPUT/read-rank{r}.json."""

    def train_dataset(self):
        rank = torch.distributed.get_rank() if torch.distributed.is_initialized() else 0
        start = time.time()
        dataset = super().train_dataset()
        record = {"start": start, "end": time.time()}
        path = Path(self.config.output_dir) / f"read-rank{rank}.json"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(record))
        return dataset

    def eval_outputs(self, generator, discriminator, batch):
        outputs = super().eval_outputs(generator, discriminator, batch)
        rank = torch.distributed.get_rank() if torch.distributed.is_initialized() else 0
        outputs["generated"] = outputs["generated"][:, : outputs["generated"].shape[1] - rank]
        return outputs

    def eval_metrics(self, outputs):
        generated = outputs["generated"]
        lengths = (generated >= 0).sum(1)
        return {
            **super().eval_metrics(outputs),
            "generated_rows": len(generated),
            "generated_width": generated.shape[1],
            "shortest": int(lengths.min()),
        }
