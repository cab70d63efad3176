"""Which checkpoint a run resumes from and whether this run can continue it: ``--resume``
resolved (``latest``: the newest checkpoint whose files verify), a checkpoint's files checked
against their digests, and the run's shape (its global batch, task and sharding) against the
one the checkpoint records, with the accumulation that keeps the global batch at another
number of processes."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

from accelerate.logging import get_logger

from trainer.contract.config import Config
from trainer.contract.errors import CheckpointError
from trainer.state import integrity
from trainer.state.checkpoint import STATE_NAME, checkpoint_mb, checkpoints, read_record

logger = get_logger("trainer")


#: what a checkpoint's run must share with the run that resumes it, beside its global batch
SHAPE_KEYS = ("training.batch_size", "training.gradient_accumulation_steps", "training.d_steps_per_g_step")


def run_shape(config: Config, processes: int, sharded: bool) -> dict[str, Any]:
    """The values of ``SHAPE_KEYS``, the number of processes, the task (the recipe) and whether
    the models are sharded (FSDP2), as a checkpoint records them."""
    values = {key: getattr(config.training, key.removeprefix("training.")) for key in SHAPE_KEYS}
    return {"processes": processes, **values, "task": config.task, "sharded": sharded}


def resumed_accumulation(path: Path, current: dict[str, Any]) -> int:
    """The accumulation that continues the run of the checkpoint at ``path`` with this run's
    ``current`` shape: the same global batch (processes x batch_size x accumulation) at this
    run's number of processes; a CheckpointError of one line for a run that cannot continue it.

    The per-process batch stays: the micro-batches, and so each one's samples, noise and batch
    statistics, are the same at any world size, and so is each process's memory; another world
    changes how many of them each process accumulates."""
    record = read_record(path)
    written = record.get("shape")
    accumulation = "training.gradient_accumulation_steps"
    if written is None:  # checkpoints from before the record: not checked
        return current[accumulation]
    if written.get("task", current["task"]) != current["task"]:  # recorded since 2026-12-07
        raise CheckpointError(
            f"{path}: written by a run of task {written['task']!r}, this run's is {current['task']!r}: another "
            "recipe cannot continue it; start a new run in another --output-dir"
        )
    if written.get("sharded", False) != current["sharded"]:  # recorded since 2026-12-07
        kinds = {True: "sharded with FSDP2", False: "whole on each process (DDP or one process)"}
        raise CheckpointError(
            f"{path}: written by a run whose models were {kinds[written.get('sharded', False)]}, this run's are "
            f"{kinds[current['sharded']]}: accelerate's states differ; resume under the distributed type that wrote it"
        )
    for key in ("training.batch_size", "training.d_steps_per_g_step"):
        if written.get(key) != current[key]:
            raise CheckpointError(
                f"{path}: written with {key}={written.get(key)}, this run has {current[key]}; resume with the "
                "same value, or start a new run in another --output-dir"
            )
    processes, here = written["processes"], current["processes"]
    if here == processes:
        if current[accumulation] != written[accumulation]:
            raise CheckpointError(
                f"{path}: written with {accumulation}={written[accumulation]}, this run has "
                f"{current[accumulation]}; resume with the same value, or start a new run in another --output-dir"
            )
        return current[accumulation]
    if "micro_batches" not in record.get("data", {}):
        raise CheckpointError(
            f"{path}: written by {processes} process(es) in the data order of checkpoints before 2026-12-07, "
            f"which only continues on as many; this run has {here}: resume with {processes} processes"
        )
    micro_batches = processes * written[accumulation]  # a phase's micro-batches over all ranks
    batch = written["training.batch_size"]
    global_batch = f"{processes} processes x batch_size {batch} x accumulation {written[accumulation]}"
    if micro_batches % here:
        raise CheckpointError(
            f"{path}: written with a global batch of {global_batch}; {here} processes cannot share its "
            f"{micro_batches} micro-batches of {batch}: resume with a number of processes that divides {micro_batches}"
        )
    if current[accumulation] not in (written[accumulation], micro_batches // here):
        raise CheckpointError(
            f"{path}: written with a global batch of {global_batch}; {here} processes x accumulation "
            f"{current[accumulation]} is another: set {accumulation} to {written[accumulation]} (the run adapts it) "
            "or start a new run in another --output-dir"
        )
    return micro_batches // here


def resolve_resume(resume: str, output_dir: Path, verify: bool) -> Path | None:
    """The checkpoint ``--resume`` names: ``latest`` (None when there is none yet) or a path.
    With ``verify``, its files are checked against their digests first: ``latest`` is then the
    newest checkpoint that verifies (one warning line per one skipped), and a named checkpoint
    that does not verify is a CheckpointError naming the file."""
    if resume == "latest":
        found = [path for _, path in reversed(checkpoints(output_dir))]
        if not verify or not found:
            return found[0] if found else None
        problems = []
        for path in found:
            problem = checkpoint_damage(path)
            if problem is None:
                return path
            logger.warning(f"--resume latest: skipped {path.name}: {problem}")
            problems.append(f"{path.name}: {problem}")
        raise CheckpointError(f"{output_dir / 'checkpoints'}: no checkpoint verifies ({'; '.join(problems)})")
    path = Path(resume)
    if not (path / STATE_NAME).is_file():
        raise CheckpointError(f"{path}: not a complete checkpoint directory (no {STATE_NAME})")
    if verify and (problem := checkpoint_damage(path)) is not None:
        raise CheckpointError(f"{path}: cannot resume from this checkpoint: {problem}")
    return path


#: the first layout whose checkpoints hold digests (:mod:`trainer.state.integrity`)
DIGESTS_FORMAT = 3


def checkpoint_damage(path: Path) -> str | None:
    """What is wrong with the files of the checkpoint at ``path`` (None when each matches its
    digest, with one line saying what the check read and how long it took); a checkpoint of a
    layout before digests is not checked (one line says so)."""
    if not (path / integrity.DIGESTS_NAME).is_file():
        try:
            written_format = json.loads((path / STATE_NAME).read_text()).get("format", 1)
        except (OSError, ValueError, AttributeError) as exc:
            return f"{STATE_NAME} cannot be read ({type(exc).__name__}: {exc})"
        if written_format < DIGESTS_FORMAT:
            logger.info(f"{path.name}: written before checkpoints held digests; not verified")
            return None
    began = time.perf_counter()
    problem = integrity.damage(path)
    if problem is None:
        logger.info(f"{path.name} verified: {checkpoint_mb(path):.1f} MB in {time.perf_counter() - began:.2f} s")
    return problem
