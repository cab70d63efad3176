"""The task interface: everything the loop knows about a recipe.

A task builds the two models and the two datasets, says how the generator makes samples and
how the discriminator scores them, and scores an eval. The loop owns devices, wrapping,
accumulation, optimizers, checkpoints and every collective; a task never calls one.
"""

from __future__ import annotations

import array
import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

import torch
from torch import nn

from trainer.contract import losses
from trainer.contract.config import RunConfig, TrainingSection
from trainer.contract.config.schema import from_mapping
from trainer.contract.errors import ConfigError

if TYPE_CHECKING:
    from accelerate import Accelerator


@dataclass
class NoOptions:
    """Options of a task that takes none."""


@dataclass
class Penalties:
    """Discriminator penalty weights for one D step (zero means off)."""

    gradient_penalty: float = 0.0
    r1: float = 0.0
    #: the GradScaler's scale under fp16 (1 otherwise; a 0-dim tensor on the device): the
    #: penalties' input gradients are taken from scaled scores and unscaled (see
    #: ``losses.input_gradients``)
    grad_scale: float | torch.Tensor = 1.0

    @classmethod
    def of_step(cls, training: TrainingSection, d_steps: int, accelerator: Accelerator) -> Penalties:
        """The penalties of the D step after ``d_steps`` steps (lazy R1: every
        ``r1_interval``-th, weighted by the interval)."""
        t = training
        lazy_r1 = t.r1_weight > 0 and d_steps % t.r1_interval == 0
        penalties = cls(
            gradient_penalty=t.gp_weight if t.loss == "wasserstein" else 0.0,
            r1=t.r1_weight * t.r1_interval if lazy_r1 else 0.0,
        )
        scaler = accelerator.scaler
        if scaler is not None and (penalties.gradient_penalty > 0 or penalties.r1 > 0):
            # The scale as a tensor on the device: get_scale() would sync the GPU every D step.
            penalties.grad_scale = scaler.scale(torch.ones((), device=accelerator.device))
        return penalties


class Task:
    """Base class of recipes. Subclass it and name it in the config as ``package.module:Class``.

    Required: :meth:`build_generator`, :meth:`build_discriminator`, :meth:`train_dataset`,
    :meth:`eval_dataset`, :meth:`generate`, :meth:`eval_outputs`, :meth:`eval_metrics`.
    The losses default to the configured adversarial loss on :meth:`score`; override
    :meth:`discriminator_loss` or :meth:`generator_loss` for anything else.
    """

    #: dataclass of the ``task_options`` section (its ``check(source)``, if it has one, checks its
    #: bounds; so do the model configs' dataclasses below)
    Options: ClassVar[type] = NoOptions
    #: dataclasses of the two model configs (None: the task reads the raw mappings itself)
    GeneratorConfig: ClassVar[type | None] = None
    DiscriminatorConfig: ClassVar[type | None] = None
    #: whether the generator phase draws micro-batches of real data (e.g. for an MLE term)
    generator_needs_data: ClassVar[bool] = False
    #: whether :meth:`generator_loss` takes ``samples`` drawn beforehand (without gradients), so
    #: that ``training.share_samples`` can give it the discriminator phase's
    takes_shared_samples: ClassVar[bool] = False

    def __init__(self, run: RunConfig) -> None:
        self.run = run
        self.config = run.config
        #: places a frozen model the task builds itself (a reference generator) as the trained
        #: ones are placed: on their device, under the run's mixed precision. The trainer sets
        #: it (run_parts.place_frozen); a task used alone keeps models as built.
        self.prepare_frozen: Callable[[nn.Module], nn.Module] = lambda model: model
        #: the generator when it carries an adapter (``model.peft``; set with the models): with
        #: the adapter off it is the starting generator
        self.adapted_generator: nn.Module | None = None
        self.options: Any = from_mapping(self.Options, run.config.task_options, run.source, prefix="task_options.")
        self.generator_config: Any = (
            from_mapping(self.GeneratorConfig, run.generator, run.generator_source)
            if self.GeneratorConfig
            else run.generator
        )
        self.discriminator_config: Any = (
            from_mapping(self.DiscriminatorConfig, run.discriminator, run.discriminator_source)
            if self.DiscriminatorConfig
            else run.discriminator
        )
        # Options and model configs that know their own bounds check them (``check(source)``).
        for value, source in (
            (self.options, run.source),
            (self.generator_config, run.generator_source),
            (self.discriminator_config, run.discriminator_source),
        ):
            if callable(getattr(value, "check", None)):
                value.check(source)

    # -- models ------------------------------------------------------------------------
    def build_generator(self) -> nn.Module:
        """A freshly initialised generator (on the CPU)."""
        raise NotImplementedError

    def build_discriminator(self) -> nn.Module:
        """A freshly initialised discriminator (on the CPU)."""
        raise NotImplementedError

    # -- data ----------------------------------------------------------------------------
    def train_dataset(self) -> torch.utils.data.Dataset:
        """Real training samples; each item (or ``__getitems__`` batch) goes to :meth:`real`."""
        raise NotImplementedError

    def eval_dataset(self) -> torch.utils.data.Dataset:
        """The eval set; it is sharded across ranks and every item is scored exactly once."""
        raise NotImplementedError

    def collate(self, items: Any) -> Any:
        """Turn what the dataset returns for a batch of indices into a batch."""
        return torch.utils.data.default_collate(items)

    def real(self, batch: Any) -> torch.Tensor:
        """The real samples of a training batch, as the discriminator takes them."""
        return batch

    # -- training --------------------------------------------------------------------------
    def generate(self, generator: nn.Module, num: int, rng: torch.Generator, batch: Any = None) -> torch.Tensor:
        """``num`` generated samples, differentiable w.r.t. the generator's parameters.

        ``rng`` is the run's noise generator on this rank's device: draw all randomness from
        it, so that runs are reproducible and resume exactly.
        """
        raise NotImplementedError

    def score(self, discriminator: nn.Module, samples: torch.Tensor) -> torch.Tensor:
        """The discriminator's scores (logits), one per discriminator input."""
        return discriminator(samples).reshape(-1)

    def discriminator_loss(
        self,
        discriminator: nn.Module,
        real: torch.Tensor,
        fake: torch.Tensor,
        rng: torch.Generator,
        penalties: Penalties,
    ) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        """The D loss on one micro-batch, and its parts for logging (detached by the loop).

        Real, generated and (for the gradient penalty) interpolated samples go through the
        discriminator in one forward call.
        """
        kind = self.config.training.loss
        if penalties.r1 > 0:
            real = real.detach().requires_grad_(True)
        inputs = [real, fake.detach()]
        if penalties.gradient_penalty > 0:
            mix = torch.rand(real.shape[0], generator=rng, device=real.device)
            mix = mix.view(-1, *([1] * (real.dim() - 1)))
            points = (mix * real.detach() + (1 - mix) * fake.detach()).requires_grad_(True)
            inputs.append(points)
        scores = self.score(discriminator, torch.cat(inputs)).float().chunk(len(inputs))
        loss = losses.discriminator_loss(kind, scores[0], scores[1])
        parts = {"d_real": scores[0].detach().mean(), "d_fake": scores[1].detach().mean()}
        if penalties.gradient_penalty > 0:
            parts["gradient_penalty"] = losses.gradient_penalty(scores[2], inputs[2], penalties.grad_scale)
            loss = loss + penalties.gradient_penalty * parts["gradient_penalty"]
        if penalties.r1 > 0:
            parts["r1"] = losses.r1_penalty(scores[0], real, penalties.grad_scale)
            loss = loss + penalties.r1 * parts["r1"]
        return loss, parts

    def generator_loss(
        self,
        generator: nn.Module,
        discriminator: nn.Module,
        num: int,
        rng: torch.Generator,
        batch: Any = None,
    ) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        """The G loss on one micro-batch of ``num`` samples, and its parts for logging.

        ``discriminator`` is the unwrapped module with its parameters frozen: gradients flow
        through it to the generator and never into it.
        """
        fake = self.generate(generator, num, rng, batch)
        scores = self.score(discriminator, fake).float()
        return losses.generator_loss(self.config.training.loss, scores), {}

    def mle_loss(self, generator: nn.Module, batch: Any) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        """Stage 1 (``training.objective: mle``): the generator's loss on a batch of real data."""
        raise ConfigError(
            f"{self.run.source}: key 'training.objective' is 'mle', but task {self.config.task!r} "
            "defines no maximum-likelihood loss (Task.mle_loss)"
        )

    # -- eval ------------------------------------------------------------------------------
    def eval_outputs(self, generator: nn.Module, discriminator: nn.Module, batch: Any) -> dict[str, torch.Tensor]:
        """Per-sample eval outputs of one batch (first dimension = samples), to be gathered.

        Tensors with more than one dimension may differ in length along dimension 1 from
        rank to rank; the loop pads them with :attr:`eval_pad_value` before gathering.
        """
        raise NotImplementedError

    #: fill value when variable-length eval outputs are padded across ranks
    eval_pad_value: ClassVar[int | float] = 0

    def eval_metrics(self, outputs: dict[str, torch.Tensor]) -> dict[str, float]:
        """Metrics over the whole gathered eval set."""
        raise NotImplementedError

    def on_eval(self, step: int, outputs: dict[str, torch.Tensor], output_dir: Path, trackers: list[Any]) -> None:
        """Optional hook on the main process after each eval (plots); must not communicate."""

    # -- state the task changes while training ----------------------------------------------
    def after_generator_step(self, generator: nn.Module, step: int) -> None:
        """Optional: called after generator optimizer step ``step`` (from 1) with the unwrapped
        generator, the same on every rank; must not communicate."""

    def load_frozen(self) -> None:
        """Optional: read the frozen models the task builds itself (a reference generator).
        Called with the models, where a failure on any rank stops every rank before training."""

    def checkpoint_modules(self) -> dict[str, nn.Module]:
        """Modules the task changes while training (by name), which checkpoints must hold."""
        return {}

    # -- weights ---------------------------------------------------------------------------
    def load_pretrained(self, role: str, path: Path) -> nn.Module | None:
        """A model built from a ``save_pretrained`` directory, or None to load a state dict."""
        return None

    def save_with(self, role: str, directory: Path) -> None:
        """Optional: files to export beside a model's weights in ``best/`` and ``final/`` (a
        tokenizer); runs on the main process and must not communicate."""


class TensorRows(torch.utils.data.Dataset):
    """Rows of one or more tensors; a batch of indices is one indexing operation.

    ``__getitems__`` lets the DataLoader fetch a whole batch at once instead of collating
    rows one by one, which matters for a model this small.
    """

    def __init__(self, **columns: torch.Tensor) -> None:
        self.columns = columns
        self.length = len(next(iter(columns.values())))

    def __len__(self) -> int:
        return self.length

    def __getitem__(self, index: int) -> dict[str, torch.Tensor]:
        return {name: col[index] for name, col in self.columns.items()}

    def __getitems__(self, indices: list[int]) -> dict[str, torch.Tensor]:
        # Through an int64 buffer: torch.as_tensor walks a Python list 5x slower.
        index = torch.frombuffer(array.array("q", indices), dtype=torch.int64)
        return {name: col.index_select(0, index) for name, col in self.columns.items()}


class EndlessRows(torch.utils.data.Dataset):
    """A training set without end, for a source that samples afresh (the synthetic oracle). The
    run fetches global micro-batch ``j`` as rows ``[j*b, (j+1)*b)`` together (``b`` the
    per-process batch), at any number of processes and after a resume: no row comes twice,
    every rank takes other rows, and a source whose rows are a function of the rows fetched
    (drawn together, by batched arithmetic) gives the uninterrupted run's batches."""

    def __getitems__(self, indices: list[int]) -> Any:
        """The batch of rows ``indices`` (the run fetches every row in such a batch)."""
        raise NotImplementedError

    def __len__(self) -> int:
        raise TypeError("an endless training set has no length")


def cache_root(configured: str) -> Path:
    """Where generated and tokenized datasets are cached (``data.cache_dir``, else the user's cache)."""
    if configured:
        return Path(configured)
    return Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "trainer"
