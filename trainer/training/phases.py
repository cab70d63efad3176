"""The parts of a training step: the two phases (one model, its optimizer and what it
computes, with its counters), what each computes (the losses, and what follows a generator
step), and the optimizers."""

from __future__ import annotations

import contextlib
import functools
import math
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import torch
from accelerate import Accelerator
from torch import nn

from trainer.contract.config import Config, OptimizerSection, TrainingSection
from trainer.contract.task import Penalties, Task
from trainer.distributed import collectives, sharding
from trainer.state.ema import GeneratorEma

OPTIMIZERS = {
    "adam": torch.optim.Adam,
    "adamw": torch.optim.AdamW,
    "sgd": torch.optim.SGD,
    "rmsprop": torch.optim.RMSprop,
}

#: a phase's loss on one micro-batch (None when the phase takes no data), and its parts
Compute = Callable[["Phase", Any], tuple[torch.Tensor, dict[str, torch.Tensor]]]


def build_optimizer(section: OptimizerSection, model: nn.Module) -> torch.optim.Optimizer:
    """The optimizer a config section describes, over ``model``'s parameters."""
    kwargs: dict[str, Any] = {"lr": section.lr, "weight_decay": section.weight_decay}
    if section.name in ("adam", "adamw"):
        kwargs.update(betas=tuple(section.betas), eps=section.eps)
    elif section.name == "rmsprop":
        kwargs.update(eps=section.eps)
    return OPTIMIZERS[section.name](model.parameters(), **kwargs)


@dataclass
class Trainable:
    """A model as accelerate prepared it, with its optimizer and schedule (None: a frozen model)."""

    model: nn.Module
    optimizer: Any = None
    scheduler: Any = None


@dataclass
class Phase:
    """One side of the game: its model, optimizer, scheduler and clipping bound, what it
    computes on a micro-batch, and its counters.

    ``opponent`` is the other model's unwrapped module, which the phase's computation calls;
    ``frozen`` are models held still while the phase runs (the discriminator, for the generator
    phase, which calls the unwrapped discriminator: its DDP reducer does no work and no gradient
    reaches it)."""

    name: str
    role: str
    #: the prepared (possibly DDP-wrapped) model, and the unwrapped module inside it
    model: nn.Module
    unwrapped: nn.Module
    #: None for a frozen model (a fixed reward model): the phase never runs
    optimizer: Any
    scheduler: Any
    max_grad_norm: float
    compute: Compute
    needs_data: bool
    opponent: nn.Module
    frozen: list[nn.Module] = field(default_factory=list)
    #: called with the phase after each of its optimizer steps (the generator's moving average)
    after_step: Callable[[Phase], None] | None = None
    #: optimizer steps taken, steps skipped (non-finite gradients), skips in a row
    steps: int = 0
    skipped: int = 0
    consecutive_skips: int = 0
    #: this window's detached losses and loss parts, one per micro-batch: kept on the device
    #: and reduced at the log step, so a step costs no sync and no arithmetic for the log
    losses: list[torch.Tensor] = field(default_factory=list)
    parts: dict[str, list[torch.Tensor]] = field(default_factory=dict)
    grad_norm: float | None = None

    def __post_init__(self) -> None:
        self.params = list(self.unwrapped.parameters())

    def loss(self, batch: Any) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        """The phase's loss on one micro-batch (None when it takes no data), and its parts."""
        return self.compute(self, batch)

    def record(self, loss: torch.Tensor, parts: dict[str, torch.Tensor]) -> None:
        self.losses.append(loss.detach())
        for key, value in parts.items():
            self.parts.setdefault(key, []).append(value.detach())

    def step_optimizer(self, scaler: Any, step_torch_optimizer: bool, log_norm: bool) -> tuple[bool, bool]:
        """Clip, step and zero this phase's optimizer only, or skip a non-finite step; count
        it. ``step_torch_optimizer``: step the torch optimizer itself (no GradScaler, plain DDP); ``log_norm``:
        the step's gradient norm is logged. Returns (skipped, gradients finite)."""
        params = [p for p in self.params if p.grad is not None]
        if scaler is not None:
            # accelerate's clip_grad_norm_ unscales every prepared optimizer; only this phase's
            # gradients exist now, so only its optimizer is unscaled.
            scaler.unscale_(self.optimizer.optimizer)
        if self.max_grad_norm > 0:
            self.grad_norm = sharding.value(torch.nn.utils.clip_grad_norm_(params, self.max_grad_norm))
            finite = math.isfinite(self.grad_norm)
        elif log_norm:
            self.grad_norm = sharding.value(torch.nn.utils.get_total_norm([p.grad for p in params]))
            finite = math.isfinite(self.grad_norm)
        else:
            finite = gradients_finite(params)
        # At a sync point with no GradScaler and plain DDP, the prepared optimizer would only
        # forward to the torch one, after an importlib look-up per step() and a signature
        # inspection per zero_grad(): about 1 ms a step, 5% of a small model's.
        optimizer = self.optimizer.optimizer if step_torch_optimizer else self.optimizer
        if finite or scaler is not None:
            # With a GradScaler an overflow is routine: the scaler skips the step and lowers
            # its scale, which it only does from inside the prepared optimizer's step().
            optimizer.step()
        skipped = self.optimizer.step_was_skipped if scaler is not None else not finite
        optimizer.zero_grad(set_to_none=True)
        self.scheduler.step()  # the learning rate follows the step count, skipped or not
        self.steps += 1
        self.skipped += skipped
        self.consecutive_skips = self.consecutive_skips + 1 if skipped else 0
        return skipped, finite

    def stop_reason(self, max_in_a_row: int, refuse_nonfinite: bool, skipped: bool, finite: bool) -> str | None:
        """Why the run must stop after this step's skip (None: it goes on): ``max_in_a_row``
        skips in a row, or non-finite gradients when ``refuse_nonfinite``."""
        if skipped and self.consecutive_skips >= max_in_a_row:
            return f"{self.consecutive_skips} {self.role} steps in a row skipped (training.max_consecutive_skips)"
        if skipped and not finite and refuse_nonfinite:
            return f"non-finite {self.role} gradients with training.nonfinite=error"
        return None

    def log_values(self) -> dict[str, Any]:
        """The learning rate, last gradient norm and counters, for the train record (none for a
        frozen model)."""
        if self.optimizer is None:
            return {}
        return {
            f"lr_{self.name}": self.scheduler.get_last_lr()[0],
            f"grad_norm_{self.name}": self.grad_norm,
            f"{self.name}_steps": self.steps,
            f"skipped_{self.name}": self.skipped,
        }

    def window_means(self) -> dict[str, torch.Tensor]:
        """Mean loss and loss parts over the window (empty if untrained); starts a new window."""
        if not self.losses:
            return {}
        means = {f"{self.name}_loss": torch.stack(self.losses).float().mean()}
        means.update({key: torch.stack(values).float().mean() for key, values in self.parts.items()})
        self.losses, self.parts = [], {}
        return means

    def state_dict(self) -> dict[str, int]:
        """The counters (a checkpoint keeps them under the phase's role)."""
        return {"steps": self.steps, "skipped": self.skipped, "consecutive_skips": self.consecutive_skips}

    def load_state_dict(self, record: dict[str, Any]) -> None:
        self.steps, self.skipped = record["steps"], record["skipped"]
        self.consecutive_skips = record["consecutive_skips"]


class SharedSamples:
    """``training.share_samples``: the samples of a step's last discriminator phase, one tensor per
    micro-batch, which its generator phase takes in the same order. A discriminator phase that
    finds a whole phase's samples kept starts anew (several discriminator phases a step: the last
    one's are shared, all drawn from the same generator); the generator phase takes them all, so
    nothing is kept from one step to the next (or in a checkpoint)."""

    def __init__(self, micro_batches: int) -> None:
        self.micro_batches = micro_batches
        self.kept: list[torch.Tensor] = []

    def keep(self, samples: torch.Tensor) -> None:
        if len(self.kept) == self.micro_batches:
            self.kept = []
        self.kept.append(samples)

    def take(self) -> torch.Tensor:
        return self.kept.pop(0)


def discriminator_loss(
    task: Task,
    training: TrainingSection,
    accelerator: Accelerator,
    noise: torch.Generator,
    shared: SharedSamples | None,
    phase: Phase,
    batch: Any,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """The discriminator phase's computation: real against generated (by the unwrapped generator,
    without gradients, kept for the generator phase when ``shared``), with the penalties due at
    this discriminator step."""
    real = task.real(batch)
    with torch.no_grad():
        fake = task.generate(phase.opponent, real.shape[0], noise, batch)
    if shared is not None:
        shared.keep(fake)
    penalties = Penalties.of_step(training, phase.steps, accelerator)
    return task.discriminator_loss(phase.model, real, fake, noise, penalties)


def generator_loss(
    task: Task,
    training: TrainingSection,
    noise: torch.Generator,
    shared: SharedSamples | None,
    phase: Phase,
    batch: Any,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """The generator phase's computation: stage 1's maximum likelihood, else the task's loss
    through the unwrapped discriminator (frozen by the phase), on the discriminator phase's
    samples when ``shared``."""
    if training.objective == "mle":
        return task.mle_loss(phase.model, batch)
    if shared is not None:
        samples = shared.take()
        return task.generator_loss(phase.model, phase.opponent, samples.shape[0], noise, batch, samples=samples)
    return task.generator_loss(phase.model, phase.opponent, training.batch_size, noise, batch)


def after_generator_step(task: Task, accelerator: Accelerator, ema: GeneratorEma | None, phase: Phase) -> None:
    """The moving average, then the task's own update (a DDO round), from the unwrapped weights
    (and rank 0's running statistics, so that the average is the same on every rank)."""
    collectives.share_running_statistics(accelerator, phase.unwrapped, "generator running statistics")
    if ema is not None:
        ema.update(phase.unwrapped, phase.steps)
    task.after_generator_step(phase.unwrapped, phase.steps)


def build_phases(
    task: Task,
    cfg: Config,
    accelerator: Accelerator,
    noise: torch.Generator,
    ema: GeneratorEma | None,
    generator: Trainable,
    discriminator: Trainable,
) -> tuple[Phase, Phase]:
    """The phase table: the discriminator's phase and the generator's, each with what it computes
    on a micro-batch against its opponent (the other's unwrapped model) and what it holds still."""
    acc, t, optim = accelerator, cfg.training, cfg.optim
    unwrapped_d, unwrapped_g = acc.unwrap_model(discriminator.model), acc.unwrap_model(generator.model)
    sharing = t.share_samples and t.objective == "adversarial" and t.d_steps_per_g_step > 0
    shared = SharedSamples(t.gradient_accumulation_steps) if sharing else None
    d_loss = functools.partial(discriminator_loss, task, t, acc, noise, shared)
    g_loss = functools.partial(generator_loss, task, t, noise, shared)
    d = Phase("d", "discriminator", discriminator.model, unwrapped_d, discriminator.optimizer, discriminator.scheduler,
              optim.discriminator.max_grad_norm, d_loss, needs_data=True, opponent=unwrapped_g)  # fmt: skip
    g = Phase("g", "generator", generator.model, unwrapped_g, generator.optimizer, generator.scheduler,
              optim.generator.max_grad_norm, g_loss, task.generator_needs_data, opponent=unwrapped_d,
              frozen=[unwrapped_d], after_step=functools.partial(after_generator_step, task, acc, ema))  # fmt: skip
    return d, g


def gradients_finite(params: list[nn.Parameter]) -> bool:
    """Whether every gradient element is finite, from one sum per tensor.

    A NaN or an infinity makes the sum non-finite; finite gradients whose sum overflows
    float32 count as non-finite too, which they are for practical purposes. Half the cost of
    a norm (no squares, no square root), which matters when the norm is not needed. Under
    FSDP2 the sums are of each rank's shards, and their total is reduced over the ranks.
    """
    return math.isfinite(sharding.value(torch.stack([p.grad.sum(dtype=torch.float32) for p in params]).sum()))


@contextlib.contextmanager
def frozen(models: list[nn.Module]) -> Iterator[None]:
    """The models' parameters with requires_grad off, so a backward pass through them leaves
    them untouched.

    Under FSDP2 each model is resharded at both ends: torch gives a gathered parameter the flag
    of its shard when it gathers it, and a group still gathered from before (the last one, which
    accelerate keeps gathered after a forward) would train while frozen, or stay frozen after."""
    for model in models:
        sharding.reshard(model)
    params = [param for model in models for param in model.parameters()]
    flags = [p.requires_grad for p in params]
    for param in params:
        param.requires_grad_(False)
    try:
        yield
    finally:
        for model in models:
            sharding.reshard(model)
        for param, flag in zip(params, flags, strict=True):
            param.requires_grad_(flag)
