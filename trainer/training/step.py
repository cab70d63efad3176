"""One optimizer step of the loop: the discriminator phase(s), then the generator phase, each
its micro-batches' gradients and then its optimizer step, with the step's one agreement (a stop
asked on any rank) and the stop on non-finite steps. :class:`trainer.training.loop.Trainer`
takes these methods from :class:`OptimizerStep`; they read the pieces :meth:`Trainer.start`
builds."""

from __future__ import annotations

import contextlib
import time

import torch
from accelerate import Accelerator

from trainer.contract.config import Config
from trainer.contract.errors import NonFiniteError
from trainer.distributed import collectives
from trainer.distributed.stop_signals import StopSignals
from trainer.distributed.watchdog import HEARTBEAT, watched
from trainer.state.checkpoint import TrainState
from trainer.training.outputs import RunOutputs
from trainer.training.phases import Phase, frozen
from trainer.training.sample_order import BatchStream, noise_seed


class OptimizerStep:
    """The Trainer's step: :meth:`train_step` runs every phase of one optimizer step on every
    rank, in the same order, with the same number of micro-batches."""

    #: the pieces the step reads, set by :meth:`Trainer.start`: the accelerator, the two phases
    #: (model, optimizer, scheduler, counters), the micro-batch stream, the run's counters, and
    #: what the run writes (its log, eval and exports)
    config: Config
    accelerator: Accelerator
    d: Phase
    g: Phase
    stream: BatchStream
    state: TrainState
    outputs: RunOutputs
    noise: torch.Generator
    signals: StopSignals
    step_torch_optimizer: bool
    _steps_run: int
    _started: float

    def run_phase(self, phase: Phase, slot: int) -> None:
        """One optimizer step of ``phase``, the step's ``slot``-th: its gradients
        (:meth:`compute_gradients`), then its step (:meth:`finish_step`)."""
        self.compute_gradients(phase, slot)
        self.finish_step(phase)

    def compute_gradients(self, phase: Phase, slot: int) -> None:
        """The gradients of ``phase``, the step's ``slot``-th: its micro-batches under
        accelerate's accumulate() (DDP syncs on the last); ``phase.frozen`` held still. Each
        micro-batch's noise comes from a seed of the step, the slot and the micro-batch's
        global index, so a step draws the same noise at any number of processes."""
        t, acc = self.config.training, self.accelerator
        with frozen(phase.frozen):
            for k in range(t.gradient_accumulation_steps):
                HEARTBEAT.beat(f"{phase.role} phase", self.state.step)
                self.noise.manual_seed(
                    noise_seed(t.seed, self.state.step, slot, k * acc.num_processes + acc.process_index)
                )
                batch = self.stream.next() if phase.needs_data else None
                # accelerate's accumulate(); one micro-batch always syncs (skipping it saves ~1%)
                with acc.accumulate(phase.model) if t.gradient_accumulation_steps > 1 else contextlib.nullcontext():
                    loss, parts = phase.loss(batch)
                    collectives.backward(self.accelerator, loss, phase.role)
                phase.record(loss, parts)

    def finish_step(self, phase: Phase) -> None:
        """The optimizer step of ``phase`` on its gradients (:meth:`Phase.step_optimizer`), the
        skip check and what follows the step."""
        # The gradients were all-reduced by DDP, so whether they are finite is the same on every
        # rank: a NaN produced on one rank reaches all of them, and every rank skips together.
        log_norm = self.outputs.logs_at(self.state.step + 1)
        skipped, finite = phase.step_optimizer(self.accelerator.scaler, self.step_torch_optimizer, log_norm)
        self._check_skips(phase, skipped, finite)
        if phase.after_step is not None:
            phase.after_step(phase)

    def _check_skips(self, phase: Phase, skipped: bool, finite: bool) -> None:
        """Stop every rank when the non-finite policy or the bound on skips in a row says so."""
        t = self.config.training
        # Under a GradScaler a non-finite step is a routine overflow: only the bound applies.
        refuse = t.nonfinite == "error" and self.accelerator.scaler is None
        reason = phase.stop_reason(t.max_consecutive_skips, refuse, skipped, finite)
        if reason is None:
            return
        # Every rank is here at the same point (the decision is a function of all-reduced
        # gradients and agreed counters), so one gather may name the ranks that went wrong.
        local = not all(bool(torch.isfinite(loss)) for loss in phase.losses[-t.gradient_accumulation_steps :])
        ranks = collectives.ranks_with(self.accelerator, local, "ranks with a non-finite loss")
        where = f"non-finite loss on rank(s) {', '.join(map(str, ranks))}" if ranks else "no rank saw a non-finite loss"
        error = NonFiniteError(f"step {self.state.step + 1}: {reason}; {where}")
        error.agreed = True
        raise error

    @watched
    def train_step(self) -> str | None:
        """One optimizer step on every rank: the D phases, then the G phase (stage 1 trains one
        model alone, see ``training.objective``; ``training.updates: simultaneous`` takes both
        gradients before either step). Returns the cause of a stop asked on any rank
        by now, agreed by all ("a stop signal", "training.max_time"), or None."""
        t = self.config.training
        # The one agreement of the step: a stop asked on any rank by now stops every rank at
        # the end of this step. Its all-reduce runs while the step computes.
        time_up = t.max_time > 0 and time.monotonic() - self._started >= t.max_time
        stop = collectives.AnyRank(self.accelerator, [time_up, self.signals.received is not None], "per-step agreement")
        # The first step may build caches, kernels and communicators: it gets a longer bound.
        with HEARTBEAT.long_work("first step") if self._steps_run == 0 else contextlib.nullcontext():
            if t.updates == "simultaneous":
                # Both gradients at the step's starting weights, then both steps: D's gradients
                # wait in D (frozen, untouched, through the G phase).
                self.compute_gradients(self.d, 0)
                self.compute_gradients(self.g, 1)
                self.finish_step(self.d)
                self.finish_step(self.g)
            else:
                if t.objective != "mle":
                    for slot in range(t.d_steps_per_g_step):
                        self.run_phase(self.d, slot)
                if t.objective != "discriminator":
                    self.run_phase(self.g, t.d_steps_per_g_step)
            for phase in (self.d, self.g):
                collectives.share_running_statistics(
                    self.accelerator, phase.unwrapped, f"{phase.role} running statistics"
                )
        self.state.step += 1
        self._steps_run += 1
        HEARTBEAT.beat("end of step (agreement, log, eval, save)", self.state.step)
        time_up, signalled = stop.result()
        return "a stop signal" if signalled else "training.max_time" if time_up else None
