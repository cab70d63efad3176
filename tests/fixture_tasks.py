"""Tasks used by the tests, loaded by launched runs as ``fixture_tasks:Class``."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import ClassVar

import torch

from trainer.tasks.gaussian_mixture import GaussianMixtureTask
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


class ScoredWeights(GaussianMixtureTask):
    """The eval reports the sum of the scored generator's weights (which generator it was)."""

    def eval_outputs(self, generator, discriminator, batch):
        outputs = super().eval_outputs(generator, discriminator, batch)
        total = sum(p.double().sum() for p in generator.parameters())
        outputs["weight_sum"] = total.expand(len(batch["real"])).clone()
        return outputs

    def eval_metrics(self, outputs):
        return {**super().eval_metrics(outputs), "weight_sum": float(outputs["weight_sum"][0])}


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


class ModeRecorder(torch.nn.Module):
    """A model with BatchNorm and dropout on its output that records, at every forward, the
    part of the run that called it (:attr:`ModeWatch.where`) and the modes of its modules."""

    def __init__(self, role: str, body: torch.nn.Module, features: int) -> None:
        super().__init__()
        self.role = role
        self.body = body
        self.norm = torch.nn.BatchNorm1d(features)
        self.dropout = torch.nn.Dropout(0.2)

    def forward(self, inputs):
        ModeWatch.seen.append((ModeWatch.where, self.role, sorted({m.training for m in self.modules()})))
        return self.dropout(self.norm(self.body(inputs)))


class ModeWatch(GaussianMixtureTask):
    """The ring recipe whose builders return models in eval mode, as ``from_pretrained`` does,
    each with BatchNorm and dropout, recording the modes every forward saw (:class:`ModeRecorder`)."""

    seen: ClassVar[list[tuple[str, str, list[bool]]]] = []
    #: "eval" inside eval_outputs, else "training"
    where = "training"

    def build_generator(self):
        return ModeRecorder("generator", super().build_generator(), 2).eval()

    def build_discriminator(self):
        return ModeRecorder("discriminator", super().build_discriminator(), 1).eval()

    def eval_outputs(self, generator, discriminator, batch):
        ModeWatch.where = "eval"
        try:
            outputs = super().eval_outputs(generator, discriminator, batch)
            # the discriminator too, so that its mode in the eval is seen
            outputs["score"] = discriminator(outputs["fake"]).reshape(-1).float()
            return outputs
        finally:
            ModeWatch.where = "training"


class IndexedTraining(GaussianMixtureTask):
    """The ring recipe whose training samples carry their index: each rank appends the indices
    of each real micro-batch it takes, in order, to OUTPUT/indices-rank{R}.jsonl."""

    def train_dataset(self):
        dataset = super().train_dataset()
        dataset.columns["index"] = torch.arange(len(dataset))
        return dataset

    def real(self, batch):
        rank = torch.distributed.get_rank() if torch.distributed.is_initialized() else 0
        with (Path(self.config.output_dir) / f"indices-rank{rank}.jsonl").open("a") as log:
            log.write(json.dumps(batch["index"].tolist()) + "\n")
        return super().real(batch)
