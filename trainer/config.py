"""The training config: typed dataclasses read from YAML, ``--set`` overrides, validation.

Everything here runs before any process group or device is touched, so a bad config ends
the run with one line naming the file and the key.
"""

from __future__ import annotations

import copy
import dataclasses
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, get_origin

from trainer.errors import ConfigError
from trainer.model_configs import GENERATOR_BODY, read_model_config
from trainer.overrides import dotted, override_mapping
from trainer.schema import field_type, from_mapping, read_yaml, suggestion

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


@dataclass
class OptimSection:
    generator: OptimizerSection = field(default_factory=OptimizerSection)
    discriminator: OptimizerSection = field(default_factory=OptimizerSection)


@dataclass
class TrainingSection:
    max_steps: int = 1000
    batch_size: int = 64
    gradient_accumulation_steps: int = 1
    #: discriminator optimizer steps per generator step; 0: the discriminator is frozen, a
    #: fixed reward model (no optimizer, no gradients, not wrapped by DDP)
    d_steps_per_g_step: int = 1
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


@dataclass
class EvalSection:
    batch_size: int = 256
    #: text recipes: generate from each eval sequence's first tokens (0: unconditional)
    prefix_len: int = 0


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


@dataclass
class InitSection:
    """Stage-1 weights: a safetensors file, a directory with model.safetensors, or a
    save_pretrained directory."""

    generator: str = ""
    discriminator: str = ""


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


@dataclass
class RunConfig:
    """The training config plus the two model configs it runs with."""

    config: Config
    source: str
    generator: dict[str, Any]
    discriminator: dict[str, Any]
    generator_source: str
    discriminator_source: str


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


def apply_overrides(data: dict[str, Any], overrides: dict[str, Any]) -> None:
    """Set each dotted key of ``overrides`` in the raw mapping ``data`` (checked against Config)."""
    for key, value in overrides.items():
        check_override_key(key)
        parts = key.split(".")
        node = data
        for part in parts[:-1]:
            child = node.get(part)
            if not isinstance(child, dict):
                child = node[part] = {}
            node = child
        node[parts[-1]] = value


def _require(condition: bool, source: str, key: str, message: str) -> None:
    if not condition:
        raise ConfigError(f"{source}: key '{key}' {message}")


def validate(cfg: Config, source: str) -> None:
    """Reject impossible values, naming the key."""
    t = cfg.training
    for name in (
        "max_steps",
        "batch_size",
        "gradient_accumulation_steps",
        "eval_every",
        "save_every",
        "log_every",
        "keep_checkpoints",
        "max_consecutive_skips",
        "r1_interval",
    ):
        _require(getattr(t, name) >= 1, source, f"training.{name}", "must be at least 1")
    _require(t.d_steps_per_g_step >= 0, source, "training.d_steps_per_g_step", "must be 0 (frozen) or more")
    _require(
        t.d_steps_per_g_step > 0 or t.objective != "discriminator",
        source,
        "training.d_steps_per_g_step",
        "is 0 (a frozen discriminator) with training.objective discriminator, which trains nothing",
    )
    _require(t.num_workers >= 0, source, "training.num_workers", "must be 0 or more")
    _require(t.max_time >= 0, source, "training.max_time", "must be 0 (no limit) or more")
    _require(t.gp_weight >= 0, source, "training.gp_weight", "must be 0 or more")
    _require(0 <= t.ema_decay < 1, source, "training.ema_decay", "must be in [0, 1) (0: no average)")
    _require(t.ema_start >= 0, source, "training.ema_start", "must be 0 or more")
    _require(t.r1_weight >= 0, source, "training.r1_weight", "must be 0 or more")
    _require(cfg.eval.batch_size >= 1, source, "eval.batch_size", "must be at least 1")
    _require(cfg.data.train_size >= 1, source, "data.train_size", "must be at least 1")
    _require(cfg.data.eval_size >= 1, source, "data.eval_size", "must be at least 1")
    _require(cfg.eval.prefix_len >= 0, source, "eval.prefix_len", "must be 0 or more")
    for part, overrides in (("generator", cfg.stage1.generator), ("discriminator", cfg.stage1.discriminator)):
        for key in dotted(overrides):
            try:
                check_override_key(key)
            except ConfigError as exc:
                raise ConfigError(f"{source}: key 'stage1.{part}.{key}': {str(exc).split(': ', 1)[1]}") from None
    for role in ("generator", "discriminator"):
        opt: OptimizerSection = getattr(cfg.optim, role)
        key = f"optim.{role}"
        _require(opt.lr > 0, source, f"{key}.lr", "must be positive")
        _require(
            len(opt.betas) == 2 and all(0 <= b < 1 for b in opt.betas),
            source,
            f"{key}.betas",
            "must be two numbers in [0, 1)",
        )
        _require(opt.weight_decay >= 0, source, f"{key}.weight_decay", "must be 0 or more")
        _require(opt.warmup_steps >= 0, source, f"{key}.warmup_steps", "must be 0 or more")
        _require(opt.max_grad_norm >= 0, source, f"{key}.max_grad_norm", "must be 0 (off) or more")
        _check_scheduler(opt.scheduler, source, f"{key}.scheduler")
        path = getattr(cfg.init, role)
        _require(
            not path or Path(path).exists(),
            source,
            f"init.{role}",
            f"names {path!r}, which does not exist (stage-1 weights: run scripts/train_stage1.py first)",
        )
    _require(
        not cfg.data.oracle_path or Path(cfg.data.oracle_path).is_file(),
        source,
        "data.oracle_path",
        f"names {cfg.data.oracle_path!r}, which is not a file",
    )
    _require(
        not cfg.data.path or Path(cfg.data.path).is_file(),
        source,
        "data.path",
        f"names {cfg.data.path!r}, which is not a file",
    )
    for key in ("train_files", "eval_files"):
        for name in as_list(getattr(cfg.data, key)):
            _require(Path(name).is_file(), source, f"data.{key}", f"names {name!r}, which is not a file")
    _require(0 <= cfg.data.eval_fraction < 1, source, "data.eval_fraction", "must be in [0, 1)")
    _require(
        cfg.model.peft == "" or not t.ema_decay,
        source,
        "training.ema_decay",
        "with model.peft: the average would copy the base weights the adapter leaves frozen; set it to 0",
    )
    _require(
        not (cfg.data.dataset and as_list(cfg.data.train_files)),
        source,
        "data.dataset",
        "and data.train_files both name the training texts: keep one",
    )
    d = cfg.distributed
    _require(d.timeout_s > 0, source, "distributed.timeout_s", "must be positive")
    _require(d.watchdog_s >= 0, source, "distributed.watchdog_s", "must be 0 (off) or more")
    _require(d.stop_grace_s >= 0, source, "distributed.stop_grace_s", "must be 0 (off) or more")
    _require(bool(cfg.output_dir), source, "output_dir", "must not be empty")


def as_list(value: str | list[str]) -> list[str]:
    """A config value that is one path or a list of them, as a list (empty for '')."""
    if isinstance(value, str):
        return [value] if value else []
    return list(value)


def _check_scheduler(name: str, source: str, key: str) -> None:
    from transformers import SchedulerType

    valid = [s.value for s in SchedulerType]
    if name not in valid:
        raise ConfigError(
            f"{source}: key '{key}' must be one of {', '.join(valid)}, got {name!r}" + suggestion(name, valid)
        )


def load_config(
    config: str | Path | dict[str, Any],
    overrides: dict[str, Any] | list[str] | None = None,
    generator_config: str | Path | None = None,
    discriminator_config: str | Path | None = None,
    output_dir: str | Path | None = None,
    *,
    source: str | None = None,
    output_suffix: str = "",
    read_models: dict[str, dict[str, Any]] | None = None,
) -> RunConfig:
    """The resolved run: the training config and both model configs, read, overridden and
    validated. Later settings win: the built-in defaults, ``config`` (a YAML file, or its
    contents as a dict), ``overrides`` (dotted keys to values, or ``--set`` strings), then
    ``generator_config``, ``discriminator_config`` and ``output_dir`` (the command line's flags).

    ``source``: the name errors give a dict ``config`` (its file, when it was read from one).
    ``output_suffix``: appended to the output directory, unless ``output_dir`` is given.
    ``read_models``: model configs already read, by the name they were read from, so that a
    pipeline of runs reads each file once.
    """
    if isinstance(config, dict):
        source, data = source or "the config dict", copy.deepcopy(config)
    else:
        source, data = str(config), read_yaml(config, "training config")
    apply_overrides(data, override_mapping(overrides))
    if output_dir is not None:
        data["output_dir"] = str(output_dir)
    elif output_suffix:
        data["output_dir"] = f"{data.get('output_dir', Config.output_dir)}{output_suffix}"
    cfg = from_mapping(Config, data, source)
    if generator_config is not None:
        cfg.model.generator_config = str(generator_config)
    if discriminator_config is not None:
        cfg.model.discriminator_config = str(discriminator_config)
    validate(cfg, source)
    models = {}
    for role in ("generator", "discriminator"):
        model_path = getattr(cfg.model, f"{role}_config")
        if not model_path:
            raise ConfigError(f"{source}: key 'model.{role}_config' is empty and --{role}-config was not given")
        if role == "discriminator" and model_path == GENERATOR_BODY:
            cfg.model.discriminator_config = cfg.model.generator_config
            models[role] = models["generator"]
            continue
        known = (read_models or {}).get(model_path)
        models[role] = copy.deepcopy(known) if known is not None else read_model_config(model_path, role)
    return RunConfig(
        config=cfg,
        source=source,
        generator=models["generator"],
        discriminator=models["discriminator"],
        generator_source=cfg.model.generator_config,
        discriminator_source=cfg.model.discriminator_config,
    )
