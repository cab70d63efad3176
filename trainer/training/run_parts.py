"""The pieces :meth:`trainer.training.loop.Trainer.start` builds a run from, each on this rank: the
output directory claimed, the models (fresh or from ``init.*``), the data loaders, the
optimizers and schedulers. None of them runs a collective except where it says so."""

from __future__ import annotations

import dataclasses
import functools
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import yaml
from accelerate import Accelerator
from accelerate.logging import get_logger
from torch import nn

from trainer.contract.config import Config, InitSection, OptimizerSection, RunConfig, TrainingSection
from trainer.contract.config.model_configs import is_model_source
from trainer.contract.config.schema import to_mapping
from trainer.contract.errors import CheckpointError, DataError
from trainer.contract.logs import quiet_transformers
from trainer.contract.schedules import build_scheduler
from trainer.contract.task import EndlessRows, Task
from trainer.distributed import collectives, sharding
from trainer.state import adapters, checkpoint, resuming, storage, weights
from trainer.training.phases import Trainable, build_optimizer

logger = get_logger("trainer")


def claim_run(accelerator: Accelerator, run: RunConfig, fresh: bool, overwrite: bool) -> str:
    """A training run's output directory made this run's (collectives on every rank): claimed
    when ``fresh`` (the main process's view of it decides, for every rank), checked to be the
    same directory on every rank, the resolved config written. Returns the run id, rank 0's:
    a fresh run's is new, a resume takes the checkpoint's."""
    output_dir = Path(run.config.output_dir)
    if fresh:
        collectives.on_main_process(
            accelerator, "claiming the output directory", lambda: checkpoint.claim_output_dir(output_dir, overwrite)
        )

    def write_config() -> None:  # the run's first write: a directory that cannot take it is one line
        with checkpoint.writing(output_dir, output_dir):
            write_resolved(run, output_dir)

    # a write that can fail (a full disk) on the main process alone: agreed, so no rank waits
    collectives.on_main_process(accelerator, "writing the resolved config", write_config)
    run_id = collectives.from_main_process(accelerator, uuid.uuid4().hex, "the run id")
    collectives.check_shared_output_dir(accelerator, output_dir, run_id)
    return run_id


def write_resolved(run: RunConfig, output_dir: Path) -> None:
    """Write ``config.yaml`` and copies of both model configs, so the directory can be rerun."""
    output_dir.mkdir(parents=True, exist_ok=True)
    dump = {"sort_keys": False, "default_flow_style": False}
    sources = {}
    for role, fields, source in (
        ("generator", run.generator, run.generator_source),
        ("discriminator", run.discriminator, run.discriminator_source),
    ):
        # A model to load (a directory or an id) stays named as it was: its weights come with it.
        if is_model_source(source):
            sources[role] = source
            continue
        sources[role] = str(output_dir / f"{role}.yaml")
        storage.write_whole(output_dir / f"{role}.yaml", yaml.safe_dump(fields, **dump))
    model = dataclasses.replace(
        run.config.model, generator_config=sources["generator"], discriminator_config=sources["discriminator"]
    )
    cfg = dataclasses.replace(run.config, model=model)
    storage.write_whole(output_dir / "config.yaml", yaml.safe_dump(to_mapping(cfg), **dump))


def load_model(task: Task, init: str, role: str, build: Callable[[], nn.Module]) -> nn.Module:
    """``role``'s model: loaded from ``init`` (a pretrained directory the task reads, or a
    weights file into the model the task builds), or freshly built when ``init`` is empty."""
    if init:
        pretrained = task.load_pretrained(role, Path(init))
        if pretrained is not None:
            return pretrained
    model = build()
    if init:
        weights.load_weights(model, init, role)
    return model


def read_inputs(task: Task, cfg: Config) -> tuple[nn.Module, nn.Module, Any, Any]:
    """The generator, the discriminator (each with its adapter, if any), the train set and
    the eval set; the task's frozen models are read too."""
    init, model, source = cfg.init, cfg.model, task.run.source
    quiet_transformers()  # the task's module may have imported transformers
    generator = load_model(task, init.generator, "generator", task.build_generator)
    discriminator = load_model(task, init.discriminator, "discriminator", task.build_discriminator)
    # an adapter on a model the run trains (a frozen one would gain nothing from it)
    if trains("generator", cfg.training):
        generator = adapters.with_adapter(generator, model.peft, "generator", "model.peft", source)
    if trains("discriminator", cfg.training):
        key = "model.discriminator_peft"
        discriminator = adapters.with_adapter(discriminator, model.discriminator_peft, "discriminator", key, source)
    task.adapted_generator = generator if adapters.is_adapted(generator) else None
    task.load_frozen()
    return generator, discriminator, task.train_dataset(), task.eval_dataset()


def trains(role: str, training: TrainingSection) -> bool:
    """Whether the run trains ``role``'s model: not the generator of a stage-1 discriminator
    run, nor the discriminator of an MLE run or of a run without discriminator steps."""
    if role == "generator":
        return training.objective != "discriminator"
    return training.objective != "mle" and training.d_steps_per_g_step > 0


#: dropout modules: their ``p`` is the probability; transformers' attention kernels take theirs
#: from a float attribute instead (``attention_dropout``: Llama, Mistral, Qwen and their kin)
DROPOUT_MODULES = (nn.Dropout, nn.Dropout1d, nn.Dropout2d, nn.Dropout3d, nn.AlphaDropout, nn.FeatureAlphaDropout)


def set_modes(generator: nn.Module, discriminator: nn.Module, training: TrainingSection, disable_dropout: bool) -> None:
    """Each model in the mode of its use in training: train mode for a model the run trains
    (dropout on, BatchNorm on the batch's statistics), eval mode for one it holds fixed (the
    generator of a stage-1 discriminator run, a frozen discriminator, the discriminator of an
    MLE run). ``from_pretrained`` and a user's builders may return either; the eval switches
    to eval mode and back. ``disable_dropout``: every dropout probability of both models 0."""
    generator.train(trains("generator", training))
    discriminator.train(trains("discriminator", training))
    if not disable_dropout:
        return
    for module in (*generator.modules(), *discriminator.modules()):
        if isinstance(module, DROPOUT_MODULES):
            module.p = 0.0
        if isinstance(getattr(module, "attention_dropout", None), float):
            module.attention_dropout = 0.0


def place_frozen(accelerator: Accelerator, to_shard: list[nn.Module], model: nn.Module) -> nn.Module:
    """A frozen model a task builds itself (a reference generator) placed as the trained ones
    are: on the device, its forward (generation included) under the run's autocast. Not
    accelerate's prepare_model: it registers the model, and every checkpoint would then hold
    a copy of weights that do not change. Under FSDP2 it is left whole and added to
    ``to_shard``: the task reads it while the main process reads first, and sharding it may
    communicate, so every rank shards it with the trained models (in place)."""
    if sharding.is_sharded(accelerator):
        to_shard.append(model)
        return model
    model = model.to(accelerator.device)
    forward = model.forward

    @functools.wraps(forward)  # the signature stays: generate reads it to check its arguments
    def autocast_forward(*args: Any, **kwargs: Any) -> Any:
        with accelerator.autocast():
            return forward(*args, **kwargs)

    model.forward = autocast_forward
    return model


def eval_loader(task: Task, cfg: Config, eval_set: Any) -> Any:
    """The eval DataLoader (not yet prepared: accelerate shards it and gathers its outputs).

    It draws its iterators' base seed from a generator of its own, not from torch's global one,
    so that an eval does not shift training's global draws (dropout masks)."""
    return torch.utils.data.DataLoader(
        eval_set,
        batch_size=cfg.eval.batch_size,
        shuffle=False,
        collate_fn=task.collate,
        generator=torch.Generator().manual_seed(cfg.training.seed),
    )


def prepare(
    accelerator: Accelerator, cfg: Config, task: Task, generator: nn.Module, discriminator: nn.Module,
    train_set: Any, eval_set: Any,
) -> tuple[Trainable, Trainable, Any]:  # fmt: skip
    """The models with their optimizers and schedules, and the eval loader, prepared by
    accelerate (the training samples come in the run's own order: :class:`BatchStream`). The
    discriminator's schedule runs over its own optimizer steps; with
    ``training.d_steps_per_g_step`` 0 it is a fixed reward model: on the device (and under
    autocast), without DDP or an optimizer. A DataError when the training set holds fewer
    samples than one batch."""
    acc, t = accelerator, cfg.training
    if not isinstance(train_set, EndlessRows) and len(train_set) < t.batch_size:
        raise DataError(
            f"{cfg.data.path or 'data.train_size'}: {len(train_set)} training samples are fewer than "
            f"one batch (training.batch_size {t.batch_size})"
        )
    opt_g, sched_g = optimization(cfg.optim.generator, generator, t.max_steps)
    prepared = acc.prepare(generator, opt_g, sched_g, eval_loader(task, cfg, eval_set))
    trained_g, evaluation = Trainable(*prepared[:3]), prepared[3]
    if t.d_steps_per_g_step:
        opt_d, sched_d = optimization(cfg.optim.discriminator, discriminator, t.max_steps * t.d_steps_per_g_step)
        trained_d = Trainable(*acc.prepare(discriminator, opt_d, sched_d))
    elif sharding.is_sharded(acc):  # accelerate shards a model only with its optimizer
        trained_d = Trainable(sharding.shard_like_prepared(acc, discriminator.requires_grad_(False)))
    else:
        trained_d = Trainable(acc.prepare_model(discriminator.requires_grad_(False), evaluation_mode=True))
    return trained_g, trained_d, evaluation


def optimization(section: OptimizerSection, model: nn.Module, steps: int) -> tuple[torch.optim.Optimizer, Any]:
    """The optimizer of one model and its learning-rate schedule over ``steps`` optimizer steps."""
    optimizer = build_optimizer(section, model)
    return optimizer, build_scheduler(section.scheduler, optimizer, section.warmup_steps, steps)


def find_checkpoint(accelerator: Accelerator, which: str, output_dir: Path) -> Path | None:
    """The checkpoint ``which`` (``--resume``) names, or None when there is none yet. Which
    checkpoint (or none) changes what every rank does next: rank 0's choice is taken by all, and
    a rank that cannot find it fails them all. The main process alone checks the files against
    their digests (one read of the checkpoint, not one per rank)."""
    acc = accelerator

    def find() -> Path | None:
        return resuming.resolve_resume(which, output_dir, verify=acc.is_main_process)

    path = collectives.agreed(acc, "finding the checkpoint", find)
    path = collectives.from_main_process(acc, path, "the checkpoint to resume from")
    if path is None:
        logger.info(f"--resume {which}: no checkpoint in {output_dir}; starting fresh")
    return path


def resumed_config(accelerator: Accelerator, config: Config, path: Path) -> Config:
    """``config`` with the accumulation that continues the checkpoint at ``path`` on this number
    of processes (one line when it changes); a run that cannot continue it fails every rank."""
    t, acc = config.training, accelerator
    shape = resuming.run_shape(config, acc.num_processes, sharding.is_sharded(acc))
    accumulation = collectives.agreed(
        acc, "checking the checkpoint's run", lambda: resuming.resumed_accumulation(path, shape)
    )
    if accumulation == t.gradient_accumulation_steps:
        return config
    samples = acc.num_processes * accumulation * t.batch_size  # the checkpoint's global batch
    logger.info(
        f"{path.name} was written by another number of processes, this run has {acc.num_processes}: "
        f"training.gradient_accumulation_steps {t.gradient_accumulation_steps} -> {accumulation}, "
        f"the global batch of {samples} samples kept"
    )
    acc.gradient_accumulation_steps = accumulation
    return dataclasses.replace(config, training=dataclasses.replace(t, gradient_accumulation_steps=accumulation))


def resume(accelerator: Accelerator, checkpoints: checkpoint.Checkpoints, path: Path) -> int:
    """Load the checkpoint at ``path`` on every rank; the step it was taken at."""
    collectives.agreed(accelerator, "loading the checkpoint", lambda: checkpoints.load(path))
    # accelerate's accumulation counter, restored with its state: every phase starts at a
    # multiple of the accumulation, which 0 is of any (the run's may have changed)
    accelerator.step = 0
    step = checkpoints.parts["run"].step
    logger.info(f"resumed from {path} at step {step}")
    return step


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


def evaluation_source(accelerator: Accelerator, config: Config, source: Path) -> tuple[Config, str | None]:
    """What :meth:`Trainer.evaluate` scores: the config whose ``init.*`` name a weights
    directory's models, or the checkpoint to load. Rank 0 decides what ``source`` is (it
    decides which collectives the set-up runs), for every rank."""
    kind = collectives.agreed(accelerator, "finding the weights", lambda: weights_kind(source))
    kind = collectives.from_main_process(accelerator, kind, "the kind of weights to evaluate")
    if kind == "checkpoint":
        return config, str(source)
    # a copy: the caller's config keeps its own init paths
    init = InitSection(str(source / "generator"), str(source / "discriminator"))
    return dataclasses.replace(config, init=init), None
