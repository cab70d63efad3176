"""The training config's sections: typed dataclasses, each checking its own values
(``check(source)``, a ConfigError naming the key); :class:`Config` checks what spans sections."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, get_origin

from trainer.contract.config.overrides import dotted
from trainer.contract.config.schema import field_type, require, suggestion
from trainer.contract.config.training import TrainingSection
from trainer.contract.errors import ConfigError
from trainer.contract.schedules import CONSTANT, scheduler_names


@dataclass
class ModelSection:
    """The two models (the command-line flags override the configs): a YAML of config fields,
    a ``save_pretrained`` directory or a model id; the discriminator's may also be the word
    ``generator`` (the generator's body with a new head)."""

    #: the generator's model config: a YAML of config fields; for the transformers recipes
    #: also a save_pretrained directory or a model id (--generator-config overrides it)
    generator_config: str = ""
    #: the discriminator's, the same way; also the word "generator": the generator's body with
    #: a new head (--discriminator-config overrides it)
    discriminator_config: str = ""
    #: transformers recipes: the tokenizer (a directory or an id; empty: the generator's)
    tokenizer: str = ""
    #: transformers recipes: the weights' dtype (bfloat16 halves their memory)
    dtype: Literal["float32", "bfloat16"] = "float32"
    #: transformers recipes: recompute activations in backward (less memory, more time)
    gradient_checkpointing: bool = False
    #: every dropout probability of both models set to 0 (TRL's name: dropout modules and the
    #: attention_dropout of transformers' attention layers), so that a policy gradient samples
    #: and scores under one distribution; the text configs set it
    disable_dropout: bool = False
    #: a LoRA adapter on the generator (only the adapter trains): peft.LoraConfig fields, or
    #: a saved adapter's directory whose config is reused; empty: none (docs/own-models.md,
    #: "LoRA adapters")
    peft: dict[str, Any] | str = ""
    #: the same for the discriminator (its classifier head trains whole)
    discriminator_peft: dict[str, Any] | str = ""
    #: best/ and final/: the model with its adapter merged in (beside the adapter), else the
    #: adapter alone
    peft_merge_on_export: bool = True


@dataclass
class OptimizerSection:
    """Optimizer, learning-rate schedule and gradient clipping of one model."""

    #: the torch optimizer
    name: Literal["adam", "adamw", "sgd", "rmsprop"] = "adam"
    #: the learning rate (the schedule's peak)
    lr: float = 1e-4
    #: adam, adamw: the moment decays
    betas: list[float] = field(default_factory=lambda: [0.5, 0.999])
    #: decoupled (adamw) or L2 (the others) weight decay
    weight_decay: float = 0.0
    #: adam, adamw, rmsprop: the denominator's epsilon
    eps: float = 1e-8
    #: any name transformers' ``get_scheduler`` knows: constant, linear, cosine, ...
    scheduler: str = "constant"
    #: the schedule's warm-up, in this model's optimizer steps
    warmup_steps: int = 0
    #: clip this model's gradient norm to this value; 0 turns clipping off
    max_grad_norm: float = 0.0

    def check(self, source: str, key: str) -> None:
        require(self.lr > 0, source, f"{key}.lr", "must be positive")
        betas_ok = len(self.betas) == 2 and all(0 <= b < 1 for b in self.betas)
        require(betas_ok, source, f"{key}.betas", "must be two numbers in [0, 1)")
        require(self.weight_decay >= 0, source, f"{key}.weight_decay", "must be 0 or more")
        require(self.warmup_steps >= 0, source, f"{key}.warmup_steps", "must be 0 or more")
        require(self.max_grad_norm >= 0, source, f"{key}.max_grad_norm", "must be 0 (off) or more")
        # the default needs no look at transformers' list (trainer/contract/schedules.py says why)
        if self.scheduler != CONSTANT and self.scheduler not in (valid := scheduler_names()):
            raise ConfigError(
                f"{source}: key '{key}.scheduler' must be one of {', '.join(valid)}, got {self.scheduler!r}"
                + suggestion(self.scheduler, valid)
            )


@dataclass
class OptimSection:
    generator: OptimizerSection = field(default_factory=OptimizerSection)
    discriminator: OptimizerSection = field(default_factory=OptimizerSection)

    def check(self, source: str) -> None:
        self.generator.check(source, "optim.generator")
        self.discriminator.check(source, "optim.discriminator")


@dataclass
class EvalSection:
    #: eval micro-batch size per process
    batch_size: int = 256
    #: text recipes: generate from each eval sequence's first tokens (0: unconditional)
    prefix_len: int = 0
    #: before each eval, the generator's BatchNorm statistics recomputed at its current weights:
    #: their plain average over this many batches of training.batch_size generated in training
    #: mode (PacGAN's code refreshes them after every epoch), from a seed of training.seed and
    #: the step, so every rank and a resumed run compute the same; 0: those training left,
    #: which trail the weights (a generator without BatchNorm is one error line)
    batch_norm_refresh: int = 0

    def check(self, source: str) -> None:
        require(self.batch_size >= 1, source, "eval.batch_size", "must be at least 1")
        require(self.prefix_len >= 0, source, "eval.prefix_len", "must be 0 or more")
        require(self.batch_norm_refresh >= 0, source, "eval.batch_norm_refresh", "must be 0 or more")


@dataclass
class DataSection:
    #: generated data (gaussian_mixture, oracle_text): training samples
    train_size: int = 10000
    #: generated data: eval samples
    eval_size: int = 2000
    #: a local data file; empty means generated data
    path: str = ""
    #: oracle_text: the oracle LSTM (safetensors), e.g. ../shared/data/seqgan_oracle.safetensors;
    #: empty means a seeded random oracle
    oracle_path: str = ""
    #: where generated datasets are cached; empty means $XDG_CACHE_HOME/trainer or ~/.cache/trainer
    cache_dir: str = ""
    #: text: local files (text, json/jsonl, csv, parquet) of the training texts (a path or a list)
    train_files: str | list[str] = ""
    #: text: the eval texts' files, the same way (they replace data.eval_split)
    eval_files: str | list[str] = ""
    #: text without eval_files: this share of the training texts held out for eval (by the
    #: seed), where the dataset has no data.eval_split
    eval_fraction: float = 0.0
    #: text: a dataset by name (datasets.load_dataset) or a local dataset directory (save_to_disk,
    #: where a single Dataset is the train split, or a folder of data files), in place of
    #: train_files; offline, a name that is not cached is one line naming it (exit 2)
    dataset: str = ""
    #: the dataset's configuration (load_dataset's name), if it has several
    dataset_config: str = ""
    #: text with data.dataset: the split trained on
    train_split: str = "train"
    #: text with data.dataset: the split evaluated on; without it, data.eval_fraction of the
    #: train split is held out (else one line naming the splits the dataset has)
    eval_split: str = "validation"

    def check(self, source: str) -> None:
        require(self.train_size >= 1, source, "data.train_size", "must be at least 1")
        require(self.eval_size >= 1, source, "data.eval_size", "must be at least 1")
        for key in ("oracle_path", "path"):
            name = getattr(self, key)
            require(not name or Path(name).is_file(), source, f"data.{key}", f"names {name!r}, which is not a file")
        for key in ("train_files", "eval_files"):
            for name in as_list(getattr(self, key)):
                require(Path(name).is_file(), source, f"data.{key}", f"names {name!r}, which is not a file")
        require(0 <= self.eval_fraction < 1, source, "data.eval_fraction", "must be in [0, 1)")
        require(
            not (self.dataset and as_list(self.train_files)),
            source,
            "data.dataset",
            "and data.train_files both name the training texts: keep one",
        )


@dataclass
class InitSection:
    """Stage-1 weights: a safetensors file, a directory with model.safetensors, or a
    save_pretrained directory."""

    #: the generator's stage-1 weights
    generator: str = ""
    #: the discriminator's
    discriminator: str = ""

    def check(self, source: str) -> None:
        for role in ("generator", "discriminator"):
            path = getattr(self, role)
            require(
                not path or Path(path).exists(),
                source,
                f"init.{role}",
                f"names {path!r}, which does not exist (stage-1 weights: run scripts/train_stage1.py first)",
            )


@dataclass
class DistributedSection:
    #: process-group timeout: a collective waiting longer raises on that rank
    timeout_s: float = 300.0
    #: a rank without progress this long inside the trainer's own calls (start, step and its
    #: parts, fit, evaluate, close) writes stall-rank{R}.txt and exits; the caller's code
    #: between two calls (a notebook cell, a pause) stops the clock; 0 turns it off
    watchdog_s: float = 180.0
    #: after SIGTERM or SIGINT, a rank that has not reached the agreed stop this long after
    #: (blocked on a peer) exits with one line; below torchelastic's 30 s before its SIGKILL
    stop_grace_s: float = 20.0
    #: set TORCH_DISTRIBUTED_DEBUG=DETAIL before the process group starts; torch reads it
    #: earlier, at import, so set it in the launcher's environment instead (docs/launching.md,
    #: "When a run hangs")
    debug: bool = False

    def check(self, source: str) -> None:
        require(self.timeout_s > 0, source, "distributed.timeout_s", "must be positive")
        require(self.watchdog_s >= 0, source, "distributed.watchdog_s", "must be 0 (off) or more")
        require(self.stop_grace_s >= 0, source, "distributed.stop_grace_s", "must be 0 (off) or more")


@dataclass
class Stage1Section:
    """scripts/train_stage1.py: overrides (dotted keys, as with --set, which beats them) for its
    two parts, the generator by maximum likelihood, then the discriminator against the stage-1
    generator."""

    #: overrides of the generator's part (maximum likelihood)
    generator: dict[str, Any] = field(default_factory=dict)
    #: overrides of the discriminator's part
    discriminator: dict[str, Any] = field(default_factory=dict)
    #: start the discriminator from the pre-trained generator's weights (init.discriminator):
    #: a classifier on a language model's body learns real-vs-generated faster than from scratch
    discriminator_from_generator: bool = False

    def check(self, source: str) -> None:
        for part in ("generator", "discriminator"):
            for key in dotted(getattr(self, part)):
                try:
                    check_override_key(key)
                except ConfigError as exc:
                    raise ConfigError(f"{source}: key 'stage1.{part}.{key}': {str(exc).split(': ', 1)[1]}") from None


@dataclass
class Config:
    """The whole training config (one YAML file)."""

    #: a built-in recipe (gaussian_mixture, oracle_text, text) or package.module:Class
    #: (docs/own-task.md)
    task: str = "gaussian_mixture"
    #: where the run writes (--output-dir overrides it); relative: to the working directory
    output_dir: str = "outputs/run"
    model: ModelSection = field(default_factory=ModelSection)
    training: TrainingSection = field(default_factory=TrainingSection)
    optim: OptimSection = field(default_factory=OptimSection)
    eval: EvalSection = field(default_factory=EvalSection)
    data: DataSection = field(default_factory=DataSection)
    init: InitSection = field(default_factory=InitSection)
    distributed: DistributedSection = field(default_factory=DistributedSection)
    stage1: Stage1Section = field(default_factory=Stage1Section)
    #: options of the task (recipe); the task checks them against its own schema
    task_options: dict[str, Any] = field(default_factory=dict)

    def check(self, source: str) -> None:
        """Reject impossible values, naming the key: each section's, then those across sections."""
        require(bool(self.output_dir), source, "output_dir", "must not be empty")
        for section in (self.training, self.optim, self.eval, self.data, self.init, self.distributed, self.stage1):
            section.check(source)
        require(
            self.model.peft == "" or not self.training.ema_decay,
            source,
            "training.ema_decay",
            "with model.peft: the average would copy the base weights the adapter leaves frozen; set it to 0",
        )


@dataclass
class RunConfig:
    """The training config plus the two model configs it runs with."""

    config: Config
    source: str
    generator: dict[str, Any]
    discriminator: dict[str, Any]
    generator_source: str
    discriminator_source: str
    #: the dotted keys that overrides (the command line's ``--set``) gave a value
    overridden: frozenset[str] = frozenset()


def check_override_key(key: str) -> None:
    """Raise a ConfigError unless ``key`` names a field of Config (or lies in a free mapping)."""
    tp: Any = Config
    walked: list[str] = []
    for part in key.split("."):
        if tp is dict or get_origin(tp) is dict:
            return  # below task_options: checked by the task against its own schema
        if not dataclasses.is_dataclass(tp):
            raise ConfigError(f"--set {key}: '{'.'.join(walked)}' has no sub-keys")
        try:
            tp = field_type(tp, part, "".join(f"{w}." for w in walked))
        except KeyError as exc:
            raise ConfigError(f"--set {key}: {exc.args[0]}") from None
        walked.append(part)


def as_list(value: str | list[str]) -> list[str]:
    """A config value that is one path or a list of them, as a list (empty for '')."""
    if isinstance(value, str):
        return [value] if value else []
    return list(value)
