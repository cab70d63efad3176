"""The stage-2 loop: discriminator phase(s), then a generator phase, per optimizer step.

Reading guide. A run is built by :meth:`Trainer.start` and driven by :meth:`Trainer.step`:
the per-step agreement (one all-reduce), the phases (the DDP backward of each), then the log,
eval and save (:mod:`trainer.training.outputs`), which run when the global step says so. The global
step is the same on every rank because every rank runs the same number of phases with the
same number of micro-batches. One optimizer step, from :meth:`Trainer.fit`: ``fit`` ->
``step`` (this file) -> ``train_step`` -> ``run_phase`` (:mod:`trainer.training.step`) ->
:meth:`Phase.step_optimizer`, the phases being the table
:func:`trainer.training.phases.build_phases` makes. The pieces a run is built from are
:mod:`trainer.training.run_parts`'s.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import time
from pathlib import Path
from typing import Any

import torch
from accelerate.logging import get_logger
from accelerate.utils import set_seed
from tqdm.contrib.logging import logging_redirect_tqdm

from trainer.contract.config import RunConfig
from trainer.contract.errors import ConfigError
from trainer.contract.logs import ensure_logging
from trainer.contract.registry import load_task
from trainer.contract.task import Task
from trainer.distributed import collectives, peer_watch, sharding, world
from trainer.distributed.stop_signals import StopSignals
from trainer.distributed.watchdog import HEARTBEAT, Watchdog, watched
from trainer.state import adapters, checkpoint, resuming
from trainer.state.checkpoint import Checkpoints, TrainState
from trainer.state.ema import GeneratorEma
from trainer.training import batch_norm, run_parts
from trainer.training.metrics import MetricsLog, finish_trackers, resolve_trackers, start_trackers
from trainer.training.outputs import RunOutputs
from trainer.training.phases import build_phases
from trainer.training.sample_order import BatchStream
from trainer.training.step import OptimizerStep

logger = get_logger("trainer")

#: what the progress bar calls a run, by training.objective
PROGRESS_NAMES = {"adversarial": "stage 2", "mle": "stage 1: generator", "discriminator": "stage 1: discriminator"}


class Trainer(OptimizerStep):
    """Stage-2 adversarial training of a task's generator against its discriminator.

    ``fit()`` runs in the current process (which may be one rank of a launched job). A run
    that does not resume refuses an output directory holding checkpoints, unless
    ``overwrite`` (then that run's checkpoints, records and weights are deleted first).

    ``fit()`` is :meth:`start`, :meth:`step` until ``training.max_steps`` or an agreed stop,
    then the final export; a caller may drive the same steps itself::

        with trainer.start():
            while trainer.state.step < 100:
                trainer.step()  # or train_step(), log(), run_eval(), save() one by one
    """

    #: set by :meth:`start`, beside what :class:`OptimizerStep` lists (the accelerator, the two
    #: phases, the micro-batch stream, the run's counters, what the run writes): the checkpoints
    #: and the generator's average (None without one)
    checkpoints: Checkpoints
    ema: GeneratorEma | None

    def __init__(
        self,
        run: RunConfig,
        device: str = "auto",
        resume: str | None = None,
        overwrite: bool = False,
    ) -> None:
        self.run = run
        self.config = run.config
        self.device = device
        self.resume = resume
        self.overwrite = overwrite
        # Building the task checks its options and model configs: still no device touched.
        self.task: Task = load_task(run)
        self.output_dir = Path(self.config.output_dir)
        #: the cause of an agreed stop ("a stop signal", "training.max_time"), else None
        self.stopped: str | None = None
        self.signals = StopSignals()
        self._session: contextlib.ExitStack | None = None
        self._steps_run = 0
        self._started = 0.0

    # -- the lifecycle -------------------------------------------------------------------------
    @watched
    def start(self, training: bool = True) -> Trainer:
        """Build the run on this rank: the accelerator, models, data, optimizers and the state
        (from the checkpoint ``resume`` names). With ``training`` off (eval only) nothing is
        written. Every rank of a launched job calls it. Until :meth:`close` (the end of a
        ``with trainer.start():`` block) the watchdog runs and SIGTERM/SIGINT ask for a stop."""
        ensure_logging()
        self._session = contextlib.ExitStack()
        try:
            self._build_accelerator()
            self._session.enter_context(self.watchdog)
            self._session.enter_context(self.signals)
            self._session.enter_context(peer_watch.run_in_progress())
            self.stopped = None
            with HEARTBEAT.long_work("start-up"):
                self._setup(training)
        except BaseException:
            self.close()
            raise
        self._started = time.monotonic()
        self.outputs.start_window()
        return self

    @watched
    def close(self) -> None:
        """End the run on this rank: the watchdog and the signal handlers stop, and the
        accelerator is released (a later run in this process starts clean)."""
        try:
            if self._session is not None:
                self._session.close()
                self._session = None
        finally:
            world.release_accelerator()

    def __enter__(self) -> Trainer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _build_accelerator(self) -> None:
        self.trackers = resolve_trackers(self.config.training.log_with)
        self.accelerator = world.build_accelerator(self.config, self.device, str(self.output_dir), self.trackers)
        # Entered by start(); the rank is known only now.
        self.watchdog = Watchdog(self.config.distributed.watchdog_s, self.output_dir, self.accelerator.process_index)
        if self.accelerator.num_processes > 1:
            d, acc = self.config.distributed, self.accelerator
            peer_watch.start_watch(acc.process_index, acc.num_processes, d.stop_grace_s, d.timeout_s)

    def _setup(self, training: bool) -> None:
        """Models, data, optimizers and state on every rank; with ``training`` off (eval only)
        nothing is written: no resolved config, metrics log or trackers."""
        cfg, t, acc, task = self.config, self.config.training, self.accelerator, self.task
        logger.info(world.describe_rank(acc), main_process_only=False)
        logger.info(world.describe_precision(acc, self.run))
        self.watchdog.peers = world.check_devices(acc)
        if t.mixed_precision == "fp16" and acc.device.type == "cpu" and acc.scaler is None:
            logger.warning("fp16 was requested but accelerate runs fp32 on the CPU (no autocast, no GradScaler)")
        if t.updates == "simultaneous" and acc.scaler is not None:
            # accelerate updates the scale inside each optimizer's step(): the second step
            # would unscale gradients scaled by the first step's scale
            error = ConfigError(
                f"{self.run.source}: key 'training.updates' is simultaneous, which fp16's GradScaler "
                "cannot serve (its scale may change between the two steps); use mixed_precision bf16 or no"
            )
            error.agreed = True  # the config and the accelerate setup are the same on every rank
            raise error
        if t.share_samples and not task.takes_shared_samples:
            error = ConfigError(
                f"{self.run.source}: key 'training.share_samples': task {cfg.task!r} draws its generator phase's "
                "samples with gradients (Task.takes_shared_samples is false); set it to false"
            )
            error.agreed = True  # the config and the task are the same on every rank
            raise error
        sharding.check_config(acc, cfg, self.run.source)
        set_seed(t.seed)
        frozen_to_shard: list[torch.nn.Module] = []  # under FSDP2 (see place_frozen)
        task.prepare_frozen = functools.partial(run_parts.place_frozen, acc, frozen_to_shard)
        adapters.checkpoint_adapters_only(acc)
        resume_from = run_parts.find_checkpoint(acc, self.resume, self.output_dir) if self.resume else None
        if resume_from is not None:  # on another number of processes, another accumulation
            self.config = run_parts.resumed_config(acc, self.config, resume_from)
            self.run = dataclasses.replace(self.run, config=self.config)
            cfg, t = self.config, self.config.training
        run_id = run_parts.claim_run(acc, self.run, not self.resume, self.overwrite) if training else ""
        # The main process first: a task may build a data cache that the other ranks then read.
        generator, discriminator, train_set, eval_set = collectives.main_process_first(
            acc, "reading the models and data", lambda: run_parts.read_inputs(task, cfg)
        )
        run_parts.set_modes(generator, discriminator, t, cfg.model.disable_dropout)
        batch_norm.check_refresh(cfg.eval.batch_norm_refresh, generator, self.run.source)
        # the average starts as a copy of the generator before accelerate wraps it
        self.ema = GeneratorEma(generator, t.ema_decay, t.ema_start, t.ema_warmup, acc.device) if t.ema_decay else None
        generator, discriminator, eval_loader = run_parts.prepare(
            acc, cfg, task, generator, discriminator, train_set, eval_set
        )
        if sharding.is_sharded(acc):
            logger.info(sharding.describe(acc, {"generator": generator.model, "discriminator": discriminator.model}))
            if self.ema is not None:  # kept per shard, as the generator
                self.ema.shard(acc)
            for model in frozen_to_shard:  # a task's reference: sharded in place, as the generator
                sharding.shard_like_prepared(acc, model)
        # seeded again before each micro-batch (see compute_gradients)
        self.noise = torch.Generator(device=acc.device)
        self.d, self.g = build_phases(task, cfg, acc, self.noise, self.ema, generator, discriminator)
        # world.check_supported admits plain DDP alone: without a GradScaler the prepared
        # optimizer only forwards to the torch one
        self.step_torch_optimizer = acc.scaler is None
        self.state = TrainState(run_id=run_id)
        self.stream = BatchStream(acc, train_set, t, task.collate)
        self.checkpoints = Checkpoints(
            acc,
            self.output_dir,
            {"run": self.state, "data": self.stream, "discriminator": self.d, "generator": self.g}
            | ({"ema": self.ema} if self.ema else {}),
            t.keep_checkpoints,
            resuming.run_shape(cfg, acc.num_processes, sharding.is_sharded(acc)),
            {**({"ema": self.ema.averaged} if self.ema else {}), **task.checkpoint_modules()},
        )
        resumed_from = run_parts.resume(acc, self.checkpoints, resume_from) if resume_from is not None else None
        metrics = None
        if training:  # the main process writes; agreed, so a full disk there stops every rank here

            def open_metrics() -> MetricsLog:
                with checkpoint.writing(self.output_dir / "metrics.jsonl", self.output_dir):
                    return MetricsLog(acc, self.output_dir, resumed_from)

            metrics = collectives.agreed(acc, "opening the metrics log", open_metrics)
        phases = (self.d, self.g)
        self.outputs = RunOutputs(
            acc, cfg, task, self.output_dir, phases, self.state, self.checkpoints, self.ema, eval_loader, metrics
        )
        if not training:
            return
        start_trackers(acc, cfg, self.trackers)
        collectives.barrier(acc, "after start-up")

    # -- the loop ----------------------------------------------------------------------------
    @watched
    def fit(self) -> dict[str, Any]:
        """Train to ``training.max_steps`` (or an agreed stop); returns the last eval metrics.

        After an agreed stop (a signal, ``training.max_time``) :attr:`stopped` names the cause
        and the last checkpoint holds the state to resume from.
        """
        with self.start():
            acc, t = self.accelerator, self.config.training
            bar = self.outputs.progress_bar(PROGRESS_NAMES[t.objective])
            last_eval: dict[str, Any] = {}
            with logging_redirect_tqdm() if not bar.disable else contextlib.nullcontext():
                if self.state.step >= t.max_steps:
                    # Resumed from the end of a finished run: nothing to train; its models' scores
                    # are the answer (not written again: the run's records hold them already).
                    last_eval, _ = self.outputs.score()
                while self.state.step < t.max_steps and not self.stopped:
                    metrics = self.step()
                    bar.update(1)
                    last_eval = last_eval if metrics is None else metrics
            bar.close()
            if not self.stopped:
                self.outputs.export("final")
            collectives.barrier(acc, "at the end")
            finish_trackers(acc)
            return last_eval

    @watched
    def step(self) -> dict[str, Any] | None:
        """One step of :meth:`fit`: :meth:`train_step`, then the train log, eval and checkpoint
        due after it; the eval's metrics when one ran. A stop asked on any rank (a signal,
        ``training.max_time``) ends the step with a checkpoint instead, :attr:`stopped` naming
        its cause."""
        t, state = self.config.training, self.state
        stop = self.train_step()
        if self.outputs.logs_at(state.step):
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

    # -- what a step writes, for a caller that drives the steps itself ------------------------
    def log(self) -> None:
        """The train record of the steps since the last one (see :meth:`RunOutputs.log`)."""
        self.outputs.log()

    def run_eval(self) -> dict[str, Any]:
        """Score the eval set, write its record and ``best/`` when it improves; the metrics."""
        return self.outputs.run_eval()

    def save(self) -> None:
        """Write a checkpoint of the whole run (every rank takes part)."""
        self.outputs.save()

    @watched
    def evaluate(self, source: str | Path | None = None) -> dict[str, Any]:
        """Score the eval set once and return the metrics, writing nothing.

        ``source``: a ``checkpoints/step-N`` directory, or a weights directory holding
        ``generator/`` and ``discriminator/`` (``best/``, ``final/``); None: the models the
        config builds and initialises. Every rank of a launched job calls it.
        """
        ensure_logging()
        try:
            self._build_accelerator()
            with self.watchdog, peer_watch.run_in_progress(), HEARTBEAT.long_work("evaluation"):
                if source is not None:
                    self.config, self.resume = run_parts.evaluation_source(self.accelerator, self.config, Path(source))
                self._setup(training=False)
                metrics, _ = self.outputs.score()
            return metrics
        finally:
            world.release_accelerator()
