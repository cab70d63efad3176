"""What a run writes while it trains: the train record of each log step, the eval (and
``best/`` when it improves), checkpoints and the ``best/``/``final/`` exports. Every rank calls
each of them at the same step; the main process writes."""

from __future__ import annotations

import contextlib
import functools
import math
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch
from accelerate import Accelerator
from accelerate.logging import get_logger
from tqdm.auto import tqdm

from trainer.contract.config import Config
from trainer.contract.errors import DataError
from trainer.contract.task import Task
from trainer.distributed import collectives, world
from trainer.distributed.watchdog import HEARTBEAT, watched
from trainer.state import checkpoint, exports
from trainer.state.checkpoint import Checkpoints, TrainState
from trainer.state.ema import GeneratorEma
from trainer.training import batch_norm
from trainer.training.evaluation import evaluate
from trainer.training.metrics import MetricsLog
from trainer.training.phases import Phase

logger = get_logger("trainer")


class RunOutputs:
    """The log, eval, checkpoint and export steps of one run, over the parts the run is made of
    (its phases, counters, records and checkpoints); the steps/s of the train records count
    from :meth:`start_window`."""

    def __init__(
        self,
        accelerator: Accelerator,
        config: Config,
        task: Task,
        output_dir: Path,
        phases: tuple[Phase, Phase],
        state: TrainState,
        checkpoints: Checkpoints,
        ema: GeneratorEma | None,
        eval_loader: Any,
        metrics: MetricsLog | None,
    ) -> None:
        self.accelerator, self.config, self.task = accelerator, config, task
        self.output_dir = output_dir
        self.d, self.g = phases
        self.state, self.checkpoints, self.ema = state, checkpoints, ema
        self.eval_loader = eval_loader
        #: None for an eval-only run, which writes nothing
        self.metrics = metrics
        #: no progress bar: one log line per train record instead
        self.progress_lines = True
        self.start_window()

    def progress_bar(self, name: str) -> tqdm:
        """The run's progress bar (main process) from the current step; on a terminal or in a
        notebook only (disable=None): in a log file or a pipe the train records' lines show
        progress instead of carriage returns."""
        acc, t = self.accelerator, self.config.training
        bar = tqdm(total=t.max_steps, initial=self.state.step, desc=name, dynamic_ncols=True,
                   disable=None if acc.is_main_process else True)  # fmt: skip
        self.progress_lines = bar.disable
        return bar

    def start_window(self) -> None:
        """The next train record's steps/s counts from now and this step."""
        self._window_start, self._window_step = time.monotonic(), self.state.step

    @contextlib.contextmanager
    def _outside_throughput(self) -> Iterator[None]:
        """Time spent inside does not count in the logged steps/s (evals, checkpoints)."""
        paused = time.monotonic()
        try:
            yield
        finally:
            self._window_start += time.monotonic() - paused

    def logs_at(self, step: int) -> bool:
        """Whether step ``step`` (counted from 1) ends with a train log: a function of the step
        alone, the same on every rank (the log all-reduces the losses)."""
        return step % self.config.training.log_every == 0

    @watched
    def log(self) -> None:
        """The train record of the steps since the last one: mean losses, averaged over ranks
        (one reduce), and steps/s over the training time (evals and checkpoints excluded).
        Every rank calls it at the same step. ``grad_norm_*`` are the norms of the last step,
        before clipping (computed at that step only when no clipping needs them at every step).
        """
        acc, t = self.accelerator, self.config.training
        steps, elapsed = self.state.step - self._window_step, time.monotonic() - self._window_start
        self.start_window()
        window = {name: mean for phase in (self.d, self.g) for name, mean in phase.window_means().items()}
        names = list(window)
        collectives.check_same_on_every_rank(
            acc,
            ", ".join(names),
            f"{type(self.task).__name__} returns different loss parts",
            "discriminator_loss and generator_loss must return the same keys on every rank "
            "(they are averaged across ranks)",
        )
        means = collectives.mean_over_ranks(acc, torch.stack(list(window.values())), "train losses for the log")
        values: dict[str, Any] = dict(zip(names, means.tolist(), strict=True))
        # real samples drawn per step: by each D phase, and by the G phase when it takes data
        d_phases = 0 if t.objective == "mle" else t.d_steps_per_g_step
        g_data = t.objective != "discriminator" and self.g.needs_data
        samples = steps * (d_phases + g_data) * t.gradient_accumulation_steps * t.batch_size * acc.num_processes
        values.update(**self.d.log_values(), **self.g.log_values())
        values.update(
            samples_per_s=samples / elapsed if elapsed > 0 else None,
            steps_per_s=steps / elapsed if elapsed > 0 else None,
            peak_memory_mb=world.peak_memory_mb(acc.device),
        )
        with checkpoint.writing(self.metrics.path, self.output_dir):
            self.metrics.write("train", self.state.step, values)
        if self.progress_lines:  # no progress bar: one line per log step instead
            losses = " ".join(f"{name} {values[name]:.4g}" for name in names)
            rate = f", {values['steps_per_s']:.2f} steps/s" if values["steps_per_s"] else ""
            logger.info(f"step {self.state.step}/{t.max_steps}: {losses}{rate}")

    @watched
    def score(self) -> tuple[dict[str, Any], dict[str, torch.Tensor]]:
        """The eval of the generator the run ships (the average, when ``training.ema_decay``
        is on: then the metrics say ``"generator": "ema"``) against the discriminator; with
        ``eval.batch_norm_refresh``, its BatchNorm statistics first refreshed at this step."""
        generator = self.g.model if self.ema is None else self.ema.model
        if self.config.eval.batch_norm_refresh:
            self._refresh_statistics(self.accelerator.unwrap_model(generator))
        metrics, outputs = evaluate(self.accelerator, self.task, generator, self.d.model, self.eval_loader)
        return (metrics if self.ema is None else {**metrics, "generator": "ema"}), outputs

    def _refresh_statistics(self, generator: torch.nn.Module) -> None:
        # Drawn alike on every rank; rank 0's are then shared all the same, as after each step,
        # so that no difference between devices' kernels can leave two models.
        t = self.config.training
        rng = torch.Generator(device=self.accelerator.device)
        rng.manual_seed(batch_norm.refresh_seed(t.seed, self.state.step))
        batch_norm.refresh_statistics(self.task, generator, self.config.eval.batch_norm_refresh, t.batch_size, rng)
        collectives.share_running_statistics(self.accelerator, generator, "refreshed generator statistics")

    @watched
    def run_eval(self) -> dict[str, Any]:
        """Score the eval set on every rank, write the eval record (the main process: samples,
        plots) and, when ``training.best_metric`` improves, export ``best/``; the metrics."""
        acc, t, state = self.accelerator, self.config.training, self.state
        with self._outside_throughput():
            metrics, outputs = self.score()
            with checkpoint.writing(self.metrics.path, self.output_dir):
                self.metrics.write("eval", state.step, metrics)
            # The others wait for the main process's plots and samples here, named and with the
            # long-work bound, rather than in the next step's all-reduce with the short one.
            with HEARTBEAT.long_work("waiting for the main process's on_eval"):
                if acc.is_main_process:
                    with checkpoint.writing(self.output_dir, self.output_dir):
                        self.task.on_eval(state.step, outputs, self.output_dir, acc.trackers)
                collectives.barrier(acc, "after on_eval")
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

    @watched
    def export(self, name: str) -> None:
        """Write both models to ``OUTPUT/<name>/`` (the main process; every rank waits); with
        the average on, ``generator/`` is the average and ``generator_raw/`` the trained weights."""
        models = {"generator": self.g.model, "discriminator": self.d.model}
        if self.ema is not None:
            models.update(generator=self.ema.model, generator_raw=self.g.model)
        # The other ranks wait for the main process's writes, with the long-work bound.
        with HEARTBEAT.long_work(f"writing {name}/ (main process)"):
            for directory, model in models.items():
                state = self.accelerator.get_state_dict(model)  # every rank: a collective under FSDP2
                write = functools.partial(self._write_export, model, state, self.output_dir / name / directory)
                # agreed: a full disk on the main process stops every rank here, before the next
                # model's state is gathered
                collectives.on_main_process(self.accelerator, f"writing {name}/{directory}", write)

    def _write_export(self, model: torch.nn.Module, state: dict[str, Any], target: Path) -> None:
        extras = functools.partial(self.task.save_with, target.name.removesuffix("_raw"))
        with checkpoint.writing(target, self.output_dir):
            exports.export_model(self.accelerator, model, state, target, extras, self.config.model.peft_merge_on_export)

    @watched
    def save(self) -> None:
        """Write a checkpoint of the whole run (every rank takes part)."""
        began = time.monotonic()
        with self._outside_throughput(), HEARTBEAT.long_work("checkpoint write"):
            path = self.checkpoints.save()
        logger.info(f"saved {path} in {time.monotonic() - began:.2f} s")


def improves(value: float, best: float | None, mode: str) -> bool:
    """Whether an eval's ``value`` beats the best so far (``mode``: min or max); a non-finite
    value never does, or every later comparison with it would be false."""
    if not math.isfinite(value):
        return False
    return best is None or (value < best if mode == "min" else value > best)
