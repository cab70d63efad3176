"""The stage-2 loop: discriminator phase(s), then a generator phase, per optimizer step.

Reading guide. Every collective of a step stands in this file, at points every rank reaches:
the DDP backward of each phase, the per-step agreement (one all-reduce), and the log, eval
and save blocks, which run when the global step says so. The global step is the same on
every rank because every rank runs the same number of phases with the same number of
micro-batches.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import math
import signal
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from accelerate import Accelerator
from accelerate.logging import get_logger
from accelerate.utils import DistributedType, set_seed
from torch import nn
from tqdm.auto import tqdm
from tqdm.contrib.logging import logging_redirect_tqdm
from transformers import get_scheduler

from trainer import checkpoint, peers, runtime
from trainer.checkpoint import TrainState
from trainer.config import InitSection, OptimizerSection, RunConfig, write_resolved
from trainer.errors import CheckpointError, DataError, NonFiniteError
from trainer.evaluation import evaluate
from trainer.metrics import MetricsLog, flat_hparams, resolve_trackers
from trainer.tasks import Task, load_task
from trainer.tasks.base import Penalties
from trainer.watchdog import HEARTBEAT, Watchdog

logger = get_logger("trainer")

OPTIMIZERS = {
    "adam": torch.optim.Adam,
    "adamw": torch.optim.AdamW,
    "sgd": torch.optim.SGD,
    "rmsprop": torch.optim.RMSprop,
}
#: what the progress bar calls a run, by training.objective
PROGRESS_NAMES = {"adversarial": "stage 2", "mle": "stage 1: generator", "discriminator": "stage 1: discriminator"}


def build_optimizer(section: OptimizerSection, model: nn.Module) -> torch.optim.Optimizer:
    """The optimizer a config section describes, over ``model``'s parameters."""
    kwargs: dict[str, Any] = {"lr": section.lr, "weight_decay": section.weight_decay}
    if section.name in ("adam", "adamw"):
        kwargs.update(betas=tuple(section.betas), eps=section.eps)
    elif section.name == "rmsprop":
        kwargs.update(eps=section.eps)
    return OPTIMIZERS[section.name](model.parameters(), **kwargs)


@dataclass
class Phase:
    """One side of the game: its model, optimizer, scheduler and clipping bound."""

    name: str
    role: str
    #: the prepared (possibly DDP-wrapped) model, and the bare module inside it
    model: nn.Module
    bare: nn.Module
    optimizer: Any
    scheduler: Any
    max_grad_norm: float
    #: this window's detached losses and loss parts, one per micro-batch: kept on the device
    #: and reduced at the log step, so a step costs no sync and no arithmetic for the log
    losses: list[torch.Tensor] = field(default_factory=list)
    parts: dict[str, list[torch.Tensor]] = field(default_factory=dict)
    grad_norm: float | None = None

    def __post_init__(self) -> None:
        self.params = list(self.bare.parameters())

    def record(self, loss: torch.Tensor, parts: dict[str, torch.Tensor]) -> None:
        self.losses.append(loss.detach())
        for key, value in parts.items():
            self.parts.setdefault(key, []).append(value.detach())

    def window_means(self) -> dict[str, torch.Tensor]:
        """Mean loss and loss parts over the window (empty if untrained); starts a new window."""
        if not self.losses:
            return {}
        means = {f"{self.name}_loss": torch.stack(self.losses).float().mean()}
        means.update({key: torch.stack(values).float().mean() for key, values in self.parts.items()})
        self.losses, self.parts = [], {}
        return means


class BatchStream:
    """Endless micro-batches from a prepared dataloader, with a resumable position.

    The shuffle of epoch e is a function of (seed, e) (accelerate's seedable sampler), so
    (epoch, position) is enough to continue exactly where a checkpoint was taken.
    """

    def __init__(self, accelerator: Accelerator, dataloader: Any, epoch: int, position: int) -> None:
        self.accelerator = accelerator
        self.dataloader = dataloader
        self.epoch = epoch
        self.position = position
        self.iterator: Iterator[Any] | None = None

    def next(self) -> Any:
        if self.iterator is None:
            HEARTBEAT.collective_entered("train dataloader start (sampler RNG broadcast)")
            self.dataloader.set_epoch(self.epoch)
            loader = self.dataloader
            if self.position:
                loader = self.accelerator.skip_first_batches(self.dataloader, self.position)
            self.iterator = iter(loader)
        try:
            batch = next(self.iterator)
        except StopIteration:
            self.epoch, self.position, self.iterator = self.epoch + 1, 0, None
            return self.next()
        self.position += 1
        return batch


def gradients_finite(params: list[nn.Parameter]) -> bool:
    """Whether every gradient element is finite, from one sum per tensor.

    A NaN or an infinity makes the sum non-finite; finite gradients whose sum overflows
    float32 count as non-finite too, which they are for practical purposes. Half the cost of
    a norm (no squares, no square root), which matters when the norm is not needed.
    """
    return math.isfinite(float(torch.stack([p.grad.sum(dtype=torch.float32) for p in params]).sum()))


@contextlib.contextmanager
def frozen(params: list[nn.Parameter]) -> Iterator[None]:
    """Parameters with requires_grad off, so a backward pass through them leaves them untouched."""
    flags = [p.requires_grad for p in params]
    for param in params:
        param.requires_grad_(False)
    try:
        yield
    finally:
        for param, flag in zip(params, flags, strict=True):
            param.requires_grad_(flag)


def weights_kind(path: Path) -> str:
    """``checkpoint`` (a checkpoints/step-N directory) or ``weights`` (generator/ and
    discriminator/ inside, like best/ and final/); anything else is a CheckpointError."""
    if (path / checkpoint.STATE_NAME).is_file():
        return "checkpoint"
    if (path / "generator").is_dir() and (path / "discriminator").is_dir():
        return "weights"
    raise CheckpointError(
        f"{path}: neither a checkpoint (no {checkpoint.STATE_NAME}) nor a weights directory "
        "with generator/ and discriminator/"
    )


def improves(value: float, best: float | None, mode: str) -> bool:
    """Whether an eval's ``value`` beats the best so far (``mode``: min or max); a non-finite
    value never does, or every later comparison with it would be false."""
    if not math.isfinite(value):
        return False
    return best is None or (value < best if mode == "min" else value > best)


def noise_seed(seed: int, rank: int) -> int:
    """Each rank draws its own noise, reproducibly."""
    return seed * 1_000_003 + 7919 * (rank + 1)


class Trainer:
    """Stage-2 adversarial training of a task's generator against its discriminator.

    ``fit()`` runs in the current process (which may be one rank of a launched job). A run
    that does not resume refuses an output directory holding checkpoints, unless
    ``overwrite`` (then that run's checkpoints, records and weights are deleted first).
    ``scaler``: a GradScaler to use instead of accelerate's (another initial scale; on the CPU,
    where accelerate makes none, the fp16 path).

    ``fit()`` is :meth:`start`, :meth:`step` until ``training.max_steps`` or an agreed stop,
    then the final export; a caller may drive the same steps itself::

        with trainer.start():
            while trainer.state.step < 100:
                trainer.step()  # or train_step(), log(), run_eval(), save() one by one
    """

    #: set by :meth:`start`: the accelerator, the two phases (model, optimizer, scheduler),
    #: the train state (step, counters, best), and the records
    accelerator: Accelerator
    d: Phase
    g: Phase
    state: TrainState
    metrics: MetricsLog

    def __init__(
        self,
        run: RunConfig,
        device: str = "auto",
        resume: str | None = None,
        scaler: torch.amp.GradScaler | None = None,
        overwrite: bool = False,
    ) -> None:
        self.run = run
        self.config = run.config
        self.device = device
        self.resume = resume
        self.scaler = scaler
        self.overwrite = overwrite
        # Building the task checks its options and model configs: still no device touched.
        self.task: Task = load_task(run)
        self.output_dir = Path(self.config.output_dir)
        #: the cause of an agreed stop ("a stop signal", "training.max_time"), else None
        self.stopped: str | None = None
        self.signal_received: str | None = None
        #: no progress bar: a log line per train record instead
        self.progress_lines = True
        self._session: contextlib.ExitStack | None = None
        self._steps_run = 0
        self._started = self._window_start = 0.0
        self._window_step = 0

    # -- the lifecycle -------------------------------------------------------------------------
    def start(self, training: bool = True) -> Trainer:
        """Build the run on this rank: the accelerator, models, data, optimizers and the state
        (from the checkpoint ``resume`` names). With ``training`` off (eval only) nothing is
        written. Every rank of a launched job calls it. Until :meth:`close` (the end of a
        ``with trainer.start():`` block) the watchdog runs and SIGTERM/SIGINT ask for a stop."""
        self._session = contextlib.ExitStack()
        try:
            self._build_accelerator()
            self._session.enter_context(self.watchdog)
            self._session.enter_context(self._stop_signals())
            with HEARTBEAT.long_work("start-up"):
                self._setup(training)
        except BaseException:
            self.close()
            raise
        self._started = self._window_start = time.monotonic()
        self._window_step = self.state.step
        return self

    def close(self) -> None:
        """End the run on this rank: the watchdog and the signal handlers stop, and the
        accelerator is released (a later run in this process starts clean)."""
        try:
            if self._session is not None:
                self._session.close()
                self._session = None
        finally:
            runtime.release_accelerator()

    def __enter__(self) -> Trainer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- set-up ----------------------------------------------------------------------------
    def _load_model(self, role: str, build: Any) -> nn.Module:
        init = getattr(self.config.init, role)
        if init:
            pretrained = self.task.load_pretrained(role, Path(init))
            if pretrained is not None:
                return pretrained
        model = build()
        if init:
            checkpoint.load_weights(model, init, role)
        return model

    def _build_accelerator(self) -> None:
        self.trackers = resolve_trackers(self.config.training.log_with)
        self.accelerator = runtime.build_accelerator(
            self.config, self.device, str(self.output_dir), self.trackers, self.scaler
        )
        # Started by fit(); the rank is known only now.
        self.watchdog = Watchdog(self.config.distributed.watchdog_s, self.output_dir, self.accelerator.process_index)
        if self.accelerator.num_processes > 1:
            d = self.config.distributed
            peers.start_watch(
                self.accelerator.process_index, self.accelerator.num_processes, d.stop_grace_s, d.timeout_s
            )

    def _setup(self, training: bool = True) -> None:
        """Models, data, optimizers and state on every rank; with ``training`` off (eval only)
        nothing is written: no resolved config, metrics log or trackers."""
        cfg, t, accelerator = self.config, self.config.training, self.accelerator
        logger.info(runtime.describe_rank(accelerator), main_process_only=False)
        self.watchdog.peers = runtime.check_devices(accelerator)
        if t.mixed_precision == "fp16" and accelerator.device.type == "cpu" and accelerator.scaler is None:
            logger.warning("fp16 was requested but accelerate runs fp32 on the CPU (no autocast, no GradScaler)")
        set_seed(t.seed)
        self.shape = checkpoint.run_shape(cfg, accelerator.num_processes)
        if training and not self.resume:
            # The main process's view of the directory decides, for every rank.
            runtime.on_main_process(
                accelerator,
                "claiming the output directory",
                lambda: checkpoint.claim_output_dir(self.output_dir, self.overwrite),
            )
        # A fresh run's id, recorded in its checkpoints (a resume takes the checkpoint's): rank
        # 0's, so that the state is the same on every rank.
        run_id = runtime.from_main_process(accelerator, uuid.uuid4().hex, "the run id")
        if training:
            runtime.check_shared_output_dir(accelerator, self.output_dir, run_id)
        if accelerator.is_main_process and training:
            write_resolved(self.run, self.output_dir)

        def read_inputs() -> tuple[Any, ...]:
            generator = self._load_model("generator", self.task.build_generator)
            discriminator = self._load_model("discriminator", self.task.build_discriminator)
            return generator, discriminator, self.task.train_dataset(), self.task.eval_dataset()

        # The main process first: a task may build a data cache that the other ranks then read.
        generator, discriminator, train_set, eval_set = runtime.main_process_first(
            accelerator, "reading the models and data", read_inputs
        )
        opt_g = build_optimizer(cfg.optim.generator, generator)
        opt_d = build_optimizer(cfg.optim.discriminator, discriminator)
        sched_g = self._scheduler(cfg.optim.generator, opt_g, t.max_steps)
        sched_d = self._scheduler(cfg.optim.discriminator, opt_d, t.max_steps * t.d_steps_per_g_step)
        # Each loader draws its iterators' base seed from a generator of its own, not from torch's
        # global one: a resumed run starts its iterator mid-epoch, and a draw there would shift
        # every global draw after it (dropout masks), and an eval would shift training's.
        train_loader = torch.utils.data.DataLoader(
            train_set,
            batch_size=t.batch_size,
            shuffle=True,
            drop_last=True,
            collate_fn=self.task.collate,
            num_workers=t.num_workers,
            generator=torch.Generator().manual_seed(t.seed),
        )
        eval_loader = torch.utils.data.DataLoader(
            eval_set,
            batch_size=cfg.eval.batch_size,
            shuffle=False,
            collate_fn=self.task.collate,
            generator=torch.Generator().manual_seed(t.seed),
        )
        (generator, discriminator, opt_g, opt_d, sched_g, sched_d, self.train_loader, self.eval_loader) = (
            accelerator.prepare(generator, discriminator, opt_g, opt_d, sched_g, sched_d, train_loader, eval_loader)
        )
        if len(self.train_loader) == 0:
            raise DataError(
                f"{cfg.data.path or 'data.train_size'}: {len(train_set)} training samples are fewer than "
                f"one batch per process ({t.batch_size} x {accelerator.num_processes} processes)"
            )
        self.d = Phase(
            "d",
            "discriminator",
            discriminator,
            accelerator.unwrap_model(discriminator),
            opt_d,
            sched_d,
            cfg.optim.discriminator.max_grad_norm,
        )
        self.g = Phase(
            "g",
            "generator",
            generator,
            accelerator.unwrap_model(generator),
            opt_g,
            sched_g,
            cfg.optim.generator.max_grad_norm,
        )

        plain = (DistributedType.NO, DistributedType.MULTI_CPU, DistributedType.MULTI_GPU)
        self.direct_step = accelerator.scaler is None and accelerator.distributed_type in plain
        self.state = TrainState(run_id=run_id)
        self.noise = torch.Generator(device=accelerator.device)
        self.noise.manual_seed(noise_seed(t.seed, accelerator.process_index))
        resumed_from = None
        if self.resume:
            # Which checkpoint (or none) changes what every rank does next: rank 0's choice
            # is taken by all, and a rank that cannot read it fails them all.
            path = runtime.agreed(
                accelerator, "finding the checkpoint", lambda: checkpoint.resolve_resume(self.resume, self.output_dir)
            )
            path = runtime.from_main_process(accelerator, path, "the checkpoint to resume from")
            if path is None:
                logger.info(f"--resume {self.resume}: no checkpoint in {self.output_dir}; starting fresh")
            else:
                self.state, rank_state = runtime.agreed(
                    accelerator,
                    "loading the checkpoint",
                    lambda: checkpoint.load_checkpoint(accelerator, path, self.shape),
                )
                self.noise.set_state(rank_state["noise"])
                resumed_from = self.state.step
                logger.info(f"resumed from {path} at step {self.state.step}")
        self.stream = BatchStream(accelerator, self.train_loader, self.state.epoch, self.state.position)
        if not training:
            return
        self.metrics = MetricsLog(accelerator, self.output_dir, resumed_from)
        if self.trackers:
            accelerator.init_trackers(t.project_name, config=flat_hparams(cfg))
        HEARTBEAT.collective_entered("barrier after start-up")
        accelerator.wait_for_everyone()

    def _scheduler(self, section: OptimizerSection, optimizer: Any, total: int) -> Any:
        return get_scheduler(
            section.scheduler, optimizer, num_warmup_steps=section.warmup_steps, num_training_steps=total
        )

    # -- one optimizer step ------------------------------------------------------------------
    def _finish_phase(self, phase: Phase) -> None:
        """Clip, step and zero this phase's optimizer only, or skip a non-finite step.

        The gradients were all-reduced by DDP, so whether they are finite is the same on every
        rank: a NaN produced on one rank reaches all of them, and every rank skips together.
        """
        params = [p for p in phase.params if p.grad is not None]
        scaler = self.accelerator.scaler
        if scaler is not None:
            # accelerate's clip_grad_norm_ unscales every prepared optimizer; only this phase's
            # gradients exist now, so only its optimizer is unscaled.
            scaler.unscale_(phase.optimizer.optimizer)
        if phase.max_grad_norm > 0:
            phase.grad_norm = float(torch.nn.utils.clip_grad_norm_(params, phase.max_grad_norm))
            finite = math.isfinite(phase.grad_norm)
        elif self.logs_at(self.state.step + 1):  # the norm is logged
            phase.grad_norm = float(torch.nn.utils.get_total_norm([p.grad for p in params]))
            finite = math.isfinite(phase.grad_norm)
        else:
            finite = gradients_finite(params)
        # At a sync point with no GradScaler and plain DDP, the prepared optimizer would only
        # forward to the torch one, after an importlib look-up per step() and a signature
        # inspection per zero_grad(): about 1 ms a step, 5% of a small model's.
        optimizer = phase.optimizer.optimizer if self.direct_step else phase.optimizer
        if finite or scaler is not None:
            # With a GradScaler an overflow is routine: the scaler skips the step and lowers
            # its scale, which it only does from inside the prepared optimizer's step().
            optimizer.step()
        skipped = phase.optimizer.step_was_skipped if scaler is not None else not finite
        optimizer.zero_grad(set_to_none=True)
        phase.scheduler.step()  # the learning rate follows the step count, skipped or not
        self._count_skip(phase, skipped, finite)

    def _count_skip(self, phase: Phase, skipped: bool, finite: bool) -> None:
        """Update the skip counters; stop every rank when the policy or the bound says so."""
        t, state = self.config.training, self.state
        total, consecutive = f"skipped_{phase.name}", f"consecutive_skips_{phase.name}"
        setattr(state, total, getattr(state, total) + skipped)
        setattr(state, consecutive, getattr(state, consecutive) + 1 if skipped else 0)
        too_many = getattr(state, consecutive) >= t.max_consecutive_skips
        # Under a GradScaler a non-finite step is a routine overflow: only the bound applies.
        refused = not finite and t.nonfinite == "error" and self.accelerator.scaler is None
        if not (skipped and (refused or too_many)):
            return
        # Every rank is here at the same point (the decision is a function of all-reduced
        # gradients and agreed counters), so one gather may name the ranks that went wrong.
        this_phase = phase.losses[-self.config.training.gradient_accumulation_steps :]
        local = not all(bool(torch.isfinite(loss)) for loss in this_phase)
        ranks = runtime.ranks_with(self.accelerator, local, "ranks with a non-finite loss")
        where = f"non-finite loss on rank(s) {', '.join(map(str, ranks))}" if ranks else "no rank saw a non-finite loss"
        step = state.step + 1
        if too_many:
            count = getattr(state, consecutive)
            reason = f"{count} {phase.role} steps in a row skipped (training.max_consecutive_skips)"
        else:
            reason = f"non-finite {phase.role} gradients with training.nonfinite=error"
        error = NonFiniteError(f"step {step}: {reason}; {where}")
        error.agreed = True
        raise error

    def _micro_batch(self, phase: Phase) -> contextlib.AbstractContextManager[None]:
        """accelerate's accumulate(): DDP syncs only on a phase's last micro-batch. A phase of
        one micro-batch always syncs, and skipping the context saves ~1% of a small model's step."""
        if self.config.training.gradient_accumulation_steps == 1:
            return contextlib.nullcontext()
        return self.accelerator.accumulate(phase.model)

    def _backward(self, loss: torch.Tensor, phase: Phase) -> None:
        if self.accelerator.sync_gradients and self.accelerator.num_processes > 1:
            HEARTBEAT.collective_entered(f"DDP all-reduce of {phase.role} gradients (backward)")
        self.accelerator.backward(loss)

    def _penalties(self) -> Penalties:
        t = self.config.training
        lazy_r1 = t.r1_weight > 0 and self.state.d_steps % t.r1_interval == 0
        penalties = Penalties(
            gradient_penalty=t.gp_weight if t.loss == "wasserstein" else 0.0,
            r1=t.r1_weight * t.r1_interval if lazy_r1 else 0.0,
        )
        scaler = self.accelerator.scaler
        if scaler is not None and (penalties.gradient_penalty > 0 or penalties.r1 > 0):
            # The scale as a tensor on the device: get_scale() would sync the GPU every D step.
            penalties.grad_scale = scaler.scale(torch.ones((), device=self.accelerator.device))
        return penalties

    def discriminator_phase(self) -> None:
        """Micro-batches of real vs generated under accumulate(D); then D's optimizer steps."""
        task, phase = self.task, self.d
        bare_g = self.g.bare
        penalties = self._penalties()
        for _ in range(self.config.training.gradient_accumulation_steps):
            HEARTBEAT.beat("discriminator phase", self.state.step)
            batch = self.stream.next()
            with self._micro_batch(phase):
                real = task.real(batch)
                with torch.no_grad():
                    fake = task.generate(bare_g, real.shape[0], self.noise, batch)
                loss, parts = task.discriminator_loss(phase.model, real, fake, self.noise, penalties)
                self._backward(loss, phase)
            phase.record(loss, parts)
        self._finish_phase(phase)
        self.state.d_steps += 1

    def generator_phase(self) -> None:
        """Micro-batches through the frozen, unwrapped D under accumulate(G); then G steps.

        D is called without its DDP wrapper and with requires_grad off: its reducer does no
        work and no gradient reaches its parameters.
        """
        task, phase = self.task, self.g
        size = self.config.training.batch_size
        bare_d = self.d.bare
        with frozen(self.d.params):
            for _ in range(self.config.training.gradient_accumulation_steps):
                HEARTBEAT.beat("generator phase", self.state.step)
                batch = self.stream.next() if task.generator_needs_data else None
                with self._micro_batch(phase):
                    if self.config.training.objective == "mle":
                        loss, parts = task.mle_loss(phase.model, batch)
                    else:
                        loss, parts = task.generator_loss(phase.model, bare_d, size, self.noise, batch)
                    self._backward(loss, phase)
                phase.record(loss, parts)
        self._finish_phase(phase)
        self.state.g_steps += 1

    # -- the loop ----------------------------------------------------------------------------
    def fit(self) -> dict[str, Any]:
        """Train to ``training.max_steps`` (or an agreed stop); returns the last eval metrics.

        After an agreed stop (a signal, ``training.max_time``) :attr:`stopped` names the cause
        and the last checkpoint holds the state to resume from.
        """
        with self.start():
            return self._train()

    def evaluate(self, source: str | Path | None = None) -> dict[str, Any]:
        """Score the eval set once and return the metrics, writing nothing.

        ``source``: a ``checkpoints/step-N`` directory, or a weights directory holding
        ``generator/`` and ``discriminator/`` (``best/``, ``final/``); None: the models the
        config builds and initialises. Every rank of a launched job calls it.
        """
        try:
            self._build_accelerator()
            with self.watchdog, HEARTBEAT.long_work("evaluation"):
                if source is not None:
                    # What the source is decides which collectives set-up runs (a checkpoint
                    # load or none): rank 0's answer is taken by all.
                    kind = runtime.agreed(self.accelerator, "finding the weights", lambda: weights_kind(Path(source)))
                    kind = runtime.from_main_process(self.accelerator, kind, "the kind of weights to evaluate")
                    if kind == "checkpoint":
                        self.resume = str(source)
                    else:  # a copy: the caller's config keeps its own init paths
                        init = InitSection(str(Path(source) / "generator"), str(Path(source) / "discriminator"))
                        self.config = dataclasses.replace(self.config, init=init)
                self._setup(training=False)
                metrics, _ = evaluate(self.accelerator, self.task, self.g.model, self.d.model, self.eval_loader)
            return metrics
        finally:
            runtime.release_accelerator()

    @contextlib.contextmanager
    def _stop_signals(self) -> Iterator[None]:
        """SIGTERM and SIGINT request an agreed stop; a second SIGINT interrupts at once. In a
        launched job a rank that cannot reach the agreed stop (blocked on a peer) exits after
        ``distributed.stop_grace_s`` (see :mod:`trainer.peers`)."""
        self.signal_received = None
        self.stopped = None

        def request_stop(signum: int, frame: Any) -> None:
            if signum == signal.SIGINT and self.signal_received:
                raise KeyboardInterrupt
            self.signal_received = signal.Signals(signum).name

        previous = {}
        for signum in (signal.SIGTERM, signal.SIGINT):
            try:
                previous[signum] = signal.signal(signum, request_stop)
            except ValueError:  # not the main thread: leave signals to the host
                pass
        watch = peers.WATCH if previous else None
        try:
            with watch.stop_signals_seen() if watch is not None else contextlib.nullcontext():
                yield
        finally:
            for signum, handler in previous.items():
                signal.signal(signum, handler)

    def _train(self) -> dict[str, Any]:
        acc, t = self.accelerator, self.config.training
        # disable=None: a bar on a terminal or in a notebook, none in a log file or pipe, where
        # the train lines of training.log_every show progress instead of carriage returns.
        bar = tqdm(
            total=t.max_steps,
            initial=self.state.step,
            disable=None if acc.is_main_process else True,
            desc=PROGRESS_NAMES[t.objective],
            dynamic_ncols=True,
        )
        self.progress_lines = bar.disable
        last_eval: dict[str, Any] = {}
        with logging_redirect_tqdm() if not bar.disable else contextlib.nullcontext():
            if self.state.step >= t.max_steps:
                # Resumed from the end of a finished run: nothing to train; its models' scores
                # are the answer (not written again: the run's records hold them already).
                last_eval, _ = evaluate(acc, self.task, self.g.model, self.d.model, self.eval_loader)
            while self.state.step < t.max_steps and not self.stopped:
                metrics = self.step()
                bar.update(1)
                last_eval = last_eval if metrics is None else metrics
        bar.close()
        if not self.stopped:
            self.export("final")
        HEARTBEAT.collective_entered("barrier at the end")
        acc.wait_for_everyone()
        if acc.is_main_process and acc.trackers:
            for tracker in acc.trackers:
                tracker.finish()
        return last_eval

    def step(self) -> dict[str, Any] | None:
        """One step of :meth:`fit`: :meth:`train_step`, then the train log, eval and checkpoint
        due after it; the eval's metrics when one ran. A stop asked on any rank (a signal,
        ``training.max_time``) ends the step with a checkpoint instead, :attr:`stopped` naming
        its cause."""
        t, state = self.config.training, self.state
        stop = self.train_step()
        if self.logs_at(state.step):
            self.log()
        # A stop asked at the last step is moot: the run ends here anyway, with its eval.
        if stop and state.step < t.max_steps:
            self.stopped = stop
            self.save()
            logger.info(f"stopped at step {state.step} by {stop}; continue with --resume latest")
            return None
        metrics = None
        if state.step % t.eval_every == 0 or state.step == t.max_steps:
            metrics = self.run_eval()
        if state.step % t.save_every == 0 or state.step == t.max_steps:
            self.save()
        return metrics

    def train_step(self) -> str | None:
        """One optimizer step on every rank: the D phases, then the G phase (stage 1 trains one
        model alone, see ``training.objective``). Returns the cause of a stop asked on any rank
        by now, agreed by all ("a stop signal", "training.max_time"), or None."""
        t, state = self.config.training, self.state
        # The one agreement of the step: a stop asked on any rank by now stops every rank at
        # the end of this step. Its all-reduce runs while the step computes.
        time_up = t.max_time > 0 and time.monotonic() - self._started >= t.max_time
        stop = runtime.AnyRank(self.accelerator, [time_up, self.signal_received is not None], "per-step agreement")
        # The first step may build caches, kernels and communicators: it gets a longer bound.
        with HEARTBEAT.long_work("first step") if self._steps_run == 0 else contextlib.nullcontext():
            if t.objective != "mle":
                for _ in range(t.d_steps_per_g_step):
                    self.discriminator_phase()
            if t.objective != "discriminator":
                self.generator_phase()
        state.step += 1
        self._steps_run += 1
        HEARTBEAT.beat("end of step (agreement, log, eval, save)", state.step)
        state.epoch, state.position = self.stream.epoch, self.stream.position
        time_up, signalled = stop.result()
        return "a stop signal" if signalled else "training.max_time" if time_up else None

    @contextlib.contextmanager
    def _outside_throughput(self) -> Iterator[None]:
        """Time spent inside does not count in the logged steps/s (evals, checkpoints)."""
        paused = time.monotonic()
        try:
            yield
        finally:
            self._window_start += time.monotonic() - paused

    # -- log, eval, save ---------------------------------------------------------------------
    def logs_at(self, step: int) -> bool:
        """Whether step ``step`` (counted from 1) ends with a train log: a function of the step
        alone, the same on every rank (the log all-reduces the losses)."""
        return step % self.config.training.log_every == 0

    def log(self) -> None:
        """The train record of the steps since the last one: mean losses, averaged over ranks
        (one reduce), and steps/s over the training time (evals and checkpoints excluded).
        Every rank calls it at the same step.

        ``grad_norm_*`` are the norms of the last step, before clipping (computed at that
        step only when no clipping needs them at every step).
        """
        acc, t = self.accelerator, self.config.training
        steps, elapsed = self.state.step - self._window_step, time.monotonic() - self._window_start
        self._window_start, self._window_step = time.monotonic(), self.state.step
        window = {name: mean for phase in (self.d, self.g) for name, mean in phase.window_means().items()}
        names, sums = list(window), list(window.values())
        runtime.check_same_on_every_rank(
            acc,
            ", ".join(names),
            f"{type(self.task).__name__} returns different loss parts",
            "discriminator_loss and generator_loss must return the same keys on every rank "
            "(they are averaged across ranks)",
        )
        means = torch.stack(sums)
        if acc.num_processes > 1:
            HEARTBEAT.collective_entered("all_reduce (train losses for the log)")
            means = acc.reduce(means, reduction="mean")
        values: dict[str, Any] = dict(zip(names, means.tolist(), strict=True))
        # real samples drawn per step: by each D phase, and by the G phase when it takes data
        d_phases = 0 if t.objective == "mle" else t.d_steps_per_g_step
        g_data = t.objective != "discriminator" and self.task.generator_needs_data
        samples = steps * (d_phases + g_data) * t.gradient_accumulation_steps * t.batch_size * acc.num_processes
        values.update(
            lr_d=self.d.scheduler.get_last_lr()[0],
            lr_g=self.g.scheduler.get_last_lr()[0],
            grad_norm_d=self.d.grad_norm,
            grad_norm_g=self.g.grad_norm,
            d_steps=self.state.d_steps,
            g_steps=self.state.g_steps,
            skipped_d=self.state.skipped_d,
            skipped_g=self.state.skipped_g,
            samples_per_s=samples / elapsed if elapsed > 0 else None,
            steps_per_s=steps / elapsed if elapsed > 0 else None,
            peak_memory_mb=runtime.peak_memory_mb(acc.device),
        )
        self.metrics.write("train", self.state.step, values)
        if self.progress_lines:  # no progress bar: one line per log step instead
            losses = " ".join(f"{name} {values[name]:.4g}" for name in names)
            rate = f", {values['steps_per_s']:.2f} steps/s" if values["steps_per_s"] else ""
            logger.info(f"step {self.state.step}/{t.max_steps}: {losses}{rate}")

    def run_eval(self) -> dict[str, Any]:
        """Score the eval set on every rank, write the eval record (the main process: samples,
        plots) and, when ``training.best_metric`` improves, export ``best/``; the metrics."""
        acc, t, state = self.accelerator, self.config.training, self.state
        with self._outside_throughput():
            metrics, outputs = evaluate(acc, self.task, self.g.model, self.d.model, self.eval_loader)
            self.metrics.write("eval", state.step, metrics)
            # The others wait for the main process's plots and samples here, named and with the
            # long-work bound, rather than in the next step's all-reduce with the short one.
            with HEARTBEAT.long_work("waiting for the main process's on_eval"):
                if acc.is_main_process:
                    self.task.on_eval(state.step, outputs, self.output_dir, acc.trackers)
                HEARTBEAT.collective_entered("barrier after on_eval")
                acc.wait_for_everyone()
            if t.best_metric:
                value = metrics.get(t.best_metric)
                if value is None:
                    raise DataError(
                        f"training.best_metric: the eval has no metric {t.best_metric!r}; it has {sorted(metrics)}"
                    )
                if improves(value, state.best_value, t.best_mode):
                    state.best_value, state.best_step = float(value), state.step
                    self.export("best")
            logger.info(f"eval at step {state.step}: {metrics}")
            return metrics

    def export(self, name: str) -> None:
        """Write both models to ``OUTPUT/<name>/`` (the main process; every rank waits)."""
        # The other ranks wait here for the main process's writes, with the long-work bound.
        with HEARTBEAT.long_work(f"writing {name}/ (main process)"):
            for role, phase in (("generator", self.g), ("discriminator", self.d)):
                extras = functools.partial(self.task.save_with, role)
                checkpoint.export_model(self.accelerator, phase.model, self.output_dir / name / role, extras)
            HEARTBEAT.collective_entered(f"barrier after writing {name}/")
            self.accelerator.wait_for_everyone()

    def save(self) -> None:
        """Write a checkpoint of the whole run (every rank takes part)."""
        self.state.epoch, self.state.position = self.stream.epoch, self.stream.position
        with self._outside_throughput(), HEARTBEAT.long_work("checkpoint write"):
            path = checkpoint.save_checkpoint(
                self.accelerator,
                self.output_dir,
                self.state,
                {"noise": self.noise.get_state()},
                self.config.training.keep_checkpoints,
                self.shape,
            )
        logger.info(f"saved {path}")
