"""Stage 1 (pre-training each model alone) and the stage 1 -> stage 2 pipeline.

Stage 1 is two ordinary runs of the trainer with ``training.objective`` set:

- ``OUT/generator_mle/``: the generator by maximum likelihood (best/ by the config's
  ``stage1.generator`` overrides, e.g. ``training.best_metric: nll_test``);
- ``OUT/``: the discriminator, trained against that generator (frozen, loaded from
  ``generator_mle/best/generator``), so that ``OUT/best/generator`` and
  ``OUT/best/discriminator`` are the stage-1 pair that stage 2 takes in ``init.*``.

Every rank runs the same sequence of runs; each run ends with a barrier after its final/
export, so the next run's ``init.*`` paths exist on every rank when it starts, and the next
run's config (which weights it takes, its file checks) is agreed before it starts.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from trainer.contract.config import RunConfig, load_config, overridden_by_command_line, stage1_part_overrides
from trainer.contract.config.loading import read_training_config
from trainer.contract.config.overrides import override_mapping
from trainer.distributed import collectives
from trainer.training.loop import Trainer

logger = logging.getLogger("trainer")

#: fit_pipeline's maximum-likelihood baseline: its run directory and its metrics' name
MLE_BASELINE = "stage2-mle"


@dataclass
class StageResult:
    """What a run of several trainer runs produced."""

    #: final eval metrics of each run, by name
    metrics: dict[str, dict[str, Any]] = field(default_factory=dict)
    #: the cause of an agreed stop (then later runs did not start), else None
    stopped: str | None = None
    #: fit_pipeline: the seeds of its stage-2 runs ("stage 2" is the first's metrics, then
    #: "stage 2, seed N")
    stage2_seeds: list[int] = field(default_factory=list)


def prepare_run(what: str, build: Callable[[], RunConfig]) -> RunConfig:
    """The config of a later run of a pipeline, built on every rank and agreed: which weights
    of the earlier run it starts from and the file checks of its config are rank 0's, and a
    rank that fails them stops every rank before the run."""
    return collectives.agreed_between_runs(f"preparing the {what} run", build)


def fit_run(
    run: RunConfig, device: str, resume: str | None, overwrite: bool = False
) -> tuple[dict[str, Any], str | None]:
    """One run of the trainer: its last eval metrics, and the cause of an agreed stop or None."""
    trainer = Trainer(run, device=device, resume=resume, overwrite=overwrite)
    return trainer.fit(), trainer.stopped


def _weights(run_dir: Path, role: str) -> Path:
    """``best/<role>`` of a finished run, or ``final/<role>`` when it tracked no best."""
    best = run_dir / "best" / role
    return best if best.is_dir() else run_dir / "final" / role


def fit_stage1(
    config: str | Path | dict[str, Any],
    overrides: list[str] | dict[str, Any] | None = None,
    generator_config: str | None = None,
    discriminator_config: str | None = None,
    output_dir: str | Path | None = None,
    device: str = "auto",
    resume: str | None = None,
    overwrite: bool = False,
    output_suffix: str = "",
) -> StageResult:
    """Pre-train the generator (maximum likelihood), then the discriminator against it.

    Each run's settings, later ones winning: the config file, its ``stage1.<part>`` section,
    ``overrides`` (the command line; there too ``stage1.<part>.KEY`` beats ``KEY``), then what
    the part must be (its objective, the weights it starts from)."""
    result = StageResult()
    common = override_mapping(overrides)
    # Each file is read once: the runs of both parts are built from what the first read.
    source = None if isinstance(config, dict) else str(config)
    data = config if isinstance(config, dict) else read_training_config(config)
    models = (generator_config, discriminator_config)
    base = load_config(data, common, *models, output_dir, source=source, output_suffix=output_suffix)
    read = {base.generator_source: base.generator, base.discriminator_source: base.discriminator}
    out = Path(base.config.output_dir)
    generator = out / "generator_mle"

    # The discriminator's run starts from the generator's best weights, known once it has run.
    def discriminator_run() -> tuple[dict[str, Any], dict[str, Any]]:
        weights = str(_weights(generator, "generator"))
        body = {"init.discriminator": weights} if base.config.stage1.discriminator_from_generator else {}
        return body, {"training.objective": "discriminator", "init.generator": weights}

    parts: dict[str, tuple[str, Callable[[], tuple[dict[str, Any], dict[str, Any]]], Path]] = {
        "generator": ("stage 1 generator", lambda: ({}, {"training.objective": "mle"}), generator),
        "discriminator": ("stage 1 discriminator", discriminator_run, out),
    }
    for part, (name, defaults_and_fixed, run_dir) in parts.items():
        section = getattr(base.config.stage1, part)
        _report_overridden(f"stage1.{part}", overridden_by_command_line(part, section, common))

        def build(part=part, defaults_and_fixed=defaults_and_fixed, section=section, run_dir=run_dir):
            overrides = stage1_part_overrides(part, section, common, *defaults_and_fixed())
            return load_config(data, overrides, *models, run_dir, source=source, read_models=read)

        run = prepare_run(name, build)
        result.metrics[name], result.stopped = fit_run(run, device, resume, overwrite)
        if result.stopped:
            break
    return result


def _report_overridden(section_name: str, replaced: dict[str, tuple[Any, Any]]) -> None:
    """Log (on rank 0, before any Accelerator exists) each key of a stage section that the
    command line sets to another value."""
    if os.environ.get("RANK", "0") != "0":
        return
    for key, (configured, value) in replaced.items():
        logger.info(f"{section_name}: the command line's {key}={value} replaces the config's {configured}")


def fit_pipeline(
    stage1_config: str | Path,
    stage2_config: str | Path,
    output_dir: str | Path,
    overrides: list[str] | None = None,
    device: str = "auto",
    resume: str | None = None,
    overwrite: bool = False,
    stage2_seeds: int = 1,
    mle_baseline: bool = False,
) -> StageResult:
    """Stage 1 into ``OUTPUT/stage1``, then stage 2 from its best pair into ``OUTPUT/stage2``;
    with ``stage2_seeds`` above 1, stage 2 again from the same pair with the next seeds
    (``training.seed`` + 1, + 2, ...) into ``OUTPUT/stage2-seed-N``: how much one seed's
    stage 2 says. With ``mle_baseline``, then the stage-1 generator trained on by maximum
    likelihood alone with stage 2's config (its steps, batch and optimizer: as many real
    sequences as stage 2 sees) into ``OUTPUT/stage2-mle``: what extra steps earn by themselves.

    ``overrides`` (``--set`` strings) apply to every run of both stages.
    """
    out = Path(output_dir)
    result = fit_stage1(
        stage1_config, overrides, output_dir=out / "stage1", device=device, resume=resume, overwrite=overwrite
    )
    if result.stopped:
        return result

    def stage2_overrides() -> dict[str, Any]:
        init = {f"init.{role}": str(_weights(out / "stage1", role)) for role in ("generator", "discriminator")}
        return {**override_mapping(overrides), **init}

    run = prepare_run("stage 2", lambda: load_config(stage2_config, stage2_overrides(), output_dir=out / "stage2"))
    metrics, result.stopped = fit_run(run, device, resume, overwrite)
    result.metrics["stage 2"] = metrics
    first_seed = run.config.training.seed
    result.stage2_seeds.append(first_seed)
    for seed in range(first_seed + 1, first_seed + stage2_seeds):
        if result.stopped:
            break

        def build(seed: int = seed) -> RunConfig:
            seeded = {**stage2_overrides(), "training.seed": seed}
            return load_config(stage2_config, seeded, output_dir=out / f"stage2-seed-{seed}")

        run = prepare_run(f"stage 2, seed {seed}", build)
        result.metrics[f"stage 2, seed {seed}"], result.stopped = fit_run(run, device, resume, overwrite)
        result.stage2_seeds.append(seed)
    if mle_baseline and not result.stopped:

        def build_mle() -> RunConfig:
            mle = {**stage2_overrides(), "training.objective": "mle", "training.seed": first_seed}
            return load_config(stage2_config, mle, output_dir=out / MLE_BASELINE)

        run = prepare_run("maximum-likelihood baseline", build_mle)
        result.metrics[MLE_BASELINE], result.stopped = fit_run(run, device, resume, overwrite)
    return result
