"""The training config's sections: typed dataclasses, each checking its own values
(``check(source)``, a ConfigError naming the key); :class:`Config` checks what spans sections."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, get_origin

from trainer.contract.config.overrides import dotted
from trainer.contract.config.schema import field_type, require, suggestion
from trainer.contract.errors import ConfigError
from trainer.contract.schedules import CONSTANT, scheduler_names

LOSSES = ("non_saturating", "hinge", "least_squares", "wasserstein")


@dataclass
class ModelSection:
    """The two models (the command-line flags override the configs): a YAML of config fields,
    a ``save_pretrained`` directory or a model id; the discriminator's may also be the word
    ``generator`` (the generator's body with a new head)."""

    generator_config: str = ""
    discriminator_config: str = ""
    #: transformers recipes: the tokenizer (a directory or an id; empty: the generator's)
    tokenizer: str = ""
    #: transformers recipes: the weights' dtype
    dtype: Literal["float32", "bfloat16"] = "float32"
    #: transformers recipes: recompute activations in backward (less memory, more time)
    gradient_checkpointing: bool = False
    #: every dropout probability of both models set to 0 (TRL's name), so that a policy
    #: gradient samples and scores under one distribution
    disable_dropout: bool = False
    #: a LoRA adapter on the generator (only the adapter trains): peft.LoraConfig fields, or
    #: a saved adapter's directory whose config is reused; empty: none
    peft: dict[str, Any] | str = ""
    #: the same for the discriminator (its classifier head trains whole)
    discriminator_peft: dict[str, Any] | str = ""
    #: best/ and final/: the model with its adapter merged in (beside the adapter), else the
    #: adapter alone
    peft_merge_on_export: bool = True


@dataclass
class OptimizerSection:
    """Optimizer, learning-rate schedule and gradient clipping of one model."""

    name: Literal["adam", "adamw", "sgd", "rmsprop"] = "adam"
    lr: float = 1e-4
    betas: list[float] = field(default_factory=lambda: [0.5, 0.999])
    weight_decay: float = 0.0
    eps: float = 1e-8
    #: any name transformers' ``get_scheduler`` knows: constant, linear, cosine, ...
    scheduler: str = "constant"
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
class TrainingSection:
    max_steps: int = 1000
    batch_size: int = 64
    gradient_accumulation_steps: int = 1
    #: discriminator optimizer steps per generator step; 0: the discriminator is frozen, a
    #: fixed reward model (no optimizer, no gradients, not wrapped by DDP)
    d_steps_per_g_step: int = 1
    #: "alternating": the discriminator steps, then the generator against the stepped one;
    #: "simultaneous": both gradients at the step's starting weights, then both steps (the
    #: order of PacGAN's and ALI's code; one D step per G step, no fp16 GradScaler)
    updates: Literal["alternating", "simultaneous"] = "alternating"
    #: one generation per optimizer step: the generator phase takes the samples its step's (last)
    #: discriminator phase drew, from the generator as it stood at the step's start, instead of
    #: drawing its own (for tasks whose generator loss takes samples without gradients: the text
    #: recipes' REINFORCE); no effect without a discriminator phase
    share_samples: bool = False
    eval_every: int = 500
    save_every: int = 1000
    log_every: int = 50
    keep_checkpoints: int = 2
    best_metric: str = ""
    best_mode: Literal["min", "max"] = "min"
    seed: int = 0
    #: empty: whatever the accelerate config (or launcher) says
    mixed_precision: Literal["", "no", "bf16", "fp16"] = ""
    #: seconds of training after which the run saves and stops; 0 means no limit
    max_time: float = 0.0
    nonfinite: Literal["skip", "error"] = "skip"
    max_consecutive_skips: int = 10
    loss: Literal["non_saturating", "hinge", "least_squares", "wasserstein"] = "non_saturating"
    #: gradient-penalty weight, used by the wasserstein loss
    gp_weight: float = 10.0
    #: R1 penalty on real data (0 turns it off), applied every ``r1_interval`` D steps
    r1_weight: float = 0.0
    r1_interval: int = 1
    #: accelerate trackers; "auto" means tensorboard when it is installed
    log_with: list[str] = field(default_factory=lambda: ["auto"])
    #: the trackers' project ("": the output directory's name); tensorboard writes under
    #: OUTPUT/tensorboard/<project_name>
    project_name: str = ""
    #: the run's name in trackers that take one (wandb, mlflow; "": theirs)
    run_name: str = ""
    #: keyword arguments of each tracker's start, by tracker name (accelerate's init_kwargs),
    #: e.g. {wandb: {entity: my-team, tags: [ring]}}
    tracker_init_kwargs: dict[str, dict[str, Any]] = field(default_factory=dict)
    #: decay of an exponential moving average of the generator's weights (0: none); when on,
    #: the eval scores the average and best/ and final/ export it (the raw one as generator_raw)
    ema_decay: float = 0.0
    #: generator steps before the average starts (until then it copies the weights)
    ema_start: int = 0
    #: a lower decay for the average's first updates: min(ema_decay, (1 + n) / (10 + n))
    ema_warmup: bool = False
    num_workers: int = 0
    #: what a step trains: both models against each other (stage 2), or one model alone in
    #: stage 1: the generator by maximum likelihood ("mle"), the discriminator ("discriminator")
    objective: Literal["adversarial", "mle", "discriminator"] = "adversarial"

    def check(self, source: str) -> None:
        at_least_one = ("max_steps", "batch_size", "gradient_accumulation_steps", "eval_every", "save_every",
                        "log_every", "keep_checkpoints", "max_consecutive_skips", "r1_interval")  # fmt: skip
        for name in at_least_one:
            require(getattr(self, name) >= 1, source, f"training.{name}", "must be at least 1")
        require(self.d_steps_per_g_step >= 0, source, "training.d_steps_per_g_step", "must be 0 (frozen) or more")
        require(
            self.d_steps_per_g_step > 0 or self.objective != "discriminator",
            source,
            "training.d_steps_per_g_step",
            "is 0 (a frozen discriminator) with training.objective discriminator, which trains nothing",
        )
        require(
            self.updates == "alternating" or (self.d_steps_per_g_step == 1 and self.objective == "adversarial"),
            source,
            "training.updates",
            "is simultaneous, which takes one discriminator step per generator step "
            "(training.d_steps_per_g_step: 1, training.objective: adversarial)",
        )
        for name in ("num_workers", "gp_weight", "ema_start", "r1_weight"):
            require(getattr(self, name) >= 0, source, f"training.{name}", "must be 0 or more")
        require(self.max_time >= 0, source, "training.max_time", "must be 0 (no limit) or more")
        require(0 <= self.ema_decay < 1, source, "training.ema_decay", "must be in [0, 1) (0: no average)")


@dataclass
class EvalSection:
    batch_size: int = 256
    #: text recipes: generate from each eval sequence's first tokens (0: unconditional)
    prefix_len: int = 0
    #: before each eval, the generator's BatchNorm statistics recomputed as their average over
    #: this many batches of training.batch_size generated at the current weights (PacGAN's code
    #: refreshes them after every epoch); 0: those training left
    batch_norm_refresh: int = 0

    def check(self, source: str) -> None:
        require(self.batch_size >= 1, source, "eval.batch_size", "must be at least 1")
        require(self.prefix_len >= 0, source, "eval.prefix_len", "must be 0 or more")
        require(self.batch_norm_refresh >= 0, source, "eval.batch_norm_refresh", "must be 0 or more")


@dataclass
class DataSection:
    train_size: int = 10000
    eval_size: int = 2000
    #: a local data file; empty means generated data
    path: str = ""
    #: oracle_text: the oracle LSTM (safetensors); empty means a seeded random oracle
    oracle_path: str = ""
    #: where generated datasets are cached; empty means $XDG_CACHE_HOME/trainer or ~/.cache/trainer
    cache_dir: str = ""
    #: text: local files (text, json/jsonl, csv, parquet) of training and eval texts
    train_files: str | list[str] = ""
    eval_files: str | list[str] = ""
    #: text without eval_files: this share of the training texts held out for eval (by the
    #: seed), where the dataset has no data.eval_split
    eval_fraction: float = 0.0
    #: text: a dataset by name (datasets.load_dataset) or a local dataset directory (save_to_disk,
    #: or a folder of data files), in place of train_files
    dataset: str = ""
    #: the dataset's configuration (load_dataset's name), if it has several
    dataset_config: str = ""
    train_split: str = "train"
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

    generator: str = ""
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
    #: a rank without progress for this long writes its stacks and exits; 0 turns it off
    watchdog_s: float = 180.0
    #: after SIGTERM or SIGINT, a rank that has not reached the agreed stop this long after
    #: (blocked on a peer) exits with one line; below torchelastic's 30 s before its SIGKILL
    stop_grace_s: float = 20.0
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

    generator: dict[str, Any] = field(default_factory=dict)
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

    task: str = "gaussian_mixture"
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
