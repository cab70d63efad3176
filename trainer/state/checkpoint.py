"""Training checkpoints (written, found, loaded, pruned) and the output directory's claim. A
checkpoint directory appears under its final name only once every rank has written it. Initial
weights are read by :mod:`trainer.state.weights`, the best/ and final/ exports written by
:mod:`trainer.state.exports`."""

from __future__ import annotations

import contextlib
import functools
import json
import os
import re
import shutil
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Protocol

from accelerate import Accelerator
from accelerate.logging import get_logger
from safetensors.torch import load_model, save_model
from torch import nn

from trainer.contract.errors import CheckpointError
from trainer.contract.logs import without_log_records
from trainer.distributed import collectives, sharding
from trainer.state import integrity, storage

CHECKPOINT_PATTERN = re.compile(r"^step-(\d{7,})$")
STATE_NAME = "trainer_state.json"
logger = get_logger("trainer")


@dataclass
class TrainState:
    """The run's own counters; identical on every rank by construction."""

    step: int = 0
    best_value: float | None = None
    best_step: int | None = None
    #: names the run that wrote a checkpoint: pruning removes only this run's checkpoints
    run_id: str = ""

    def state_dict(self) -> dict[str, Any]:
        return asdict(self)

    def load_state_dict(self, record: dict[str, Any]) -> None:
        for name in ("step", "best_value", "best_step", "run_id"):
            setattr(self, name, record[name])


class Stateful(Protocol):
    """A part of a run whose state (JSON values) a checkpoint's record holds under the part's
    own key."""

    def state_dict(self) -> dict[str, Any]: ...

    def load_state_dict(self, record: dict[str, Any]) -> None: ...


#: the layout of ``trainer_state.json``: from 2, each part's state keyed by the part's name
#: (``run`` holds the step and the run id); checkpoints written before 2026-12-05 hold one flat
#: mapping of every part's names, which :func:`parts_of_flat_record` reads; from 3 (2026-12-07)
#: a checkpoint holds the digests of its files
RECORD_FORMAT = 3


def parts_of_flat_record(record: dict[str, Any]) -> dict[str, Any]:
    """A record of the first layout (one flat mapping) as the second's parts."""
    parts: dict[str, Any] = {
        "shape": record.get("shape"),
        "run": {name: record[name] for name in ("step", "best_value", "best_step", "run_id") if name in record},
        "data": {name: record[name] for name in ("epoch", "position", "micro_batches") if name in record},
    }
    for role, name in (("discriminator", "d"), ("generator", "g")):
        flat = {
            "steps": f"{name}_steps",
            "skipped": f"skipped_{name}",
            "consecutive_skips": f"consecutive_skips_{name}",
        }
        parts[role] = {key: record[old] for key, old in flat.items() if old in record}
    if "ema_updates" in record:
        parts["ema"] = {"updates": record["ema_updates"]}
    return parts


def read_record(path: Path) -> dict[str, Any]:
    """The record of the checkpoint at ``path``, in the current layout."""
    record = json.loads((path / STATE_NAME).read_text())
    return record if record.get("format", 1) >= 2 else parts_of_flat_record(record)


class Checkpoints:
    """Saves and loads a run's whole state: accelerate's (models, optimizers, schedulers,
    GradScaler, RNGs), each of ``parts`` under its name in ``trainer_state.json`` and ``modules``
    that are the same on every rank (``NAME.safetensors``, by the main process); keeps the
    newest ``keep`` of this run's checkpoints. ``parts`` has a ``run``: the :class:`TrainState`,
    whose step names the checkpoint. The noise needs no state: each micro-batch's is drawn from
    a seed of its own (:func:`trainer.training.sample_order.noise_seed`)."""

    def __init__(
        self,
        accelerator: Accelerator,
        output_dir: Path,
        parts: dict[str, Stateful],
        keep: int,
        shape: dict[str, Any],
        modules: dict[str, nn.Module],
    ) -> None:
        self.accelerator, self.output_dir, self.parts, self.modules = accelerator, output_dir, parts, modules
        self.keep, self.shape = keep, shape

    def save(self) -> Path:
        """Write ``checkpoints/step-NNNNNNN`` (every rank takes part); its path."""
        record = {name: part.state_dict() for name, part in self.parts.items()}
        return save_checkpoint(self.accelerator, self.output_dir, record, self.keep, self.shape, self.modules)

    def load(self, path: Path) -> None:
        """Restore every part from the checkpoint at ``path`` (every rank takes part)."""
        record = load_checkpoint(self.accelerator, path, self.modules)
        for name, part in self.parts.items():
            try:
                part.load_state_dict(record[name])
            except KeyError as exc:
                missing = name if exc.args[0] == name else f"{name}.{exc.args[0]}"
                raise CheckpointError(
                    f"{path}: cannot resume from this checkpoint: {STATE_NAME} has no {missing}"
                ) from None


def checkpoints(output_dir: Path) -> list[tuple[int, Path]]:
    """Complete checkpoints under ``output_dir/checkpoints``, oldest first."""
    root = output_dir / "checkpoints"
    found = []
    if root.is_dir():
        for entry in root.iterdir():
            match = CHECKPOINT_PATTERN.match(entry.name)
            if match and entry.is_dir() and (entry / STATE_NAME).is_file():
                found.append((int(match.group(1)), entry))
    return sorted(found)


def fsync_tree(root: Path) -> None:
    """Flush every file under ``root`` and every directory of it (``root`` last) to disk, so
    that a rename that follows publishes data that a crash cannot take back."""
    for path in sorted(root.rglob("*"), key=lambda p: len(p.parts), reverse=True) + [root]:
        fsync_path(path)


def fsync_path(path: Path) -> None:
    """Flush one file, or a directory's entries (a rename in it), to disk."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def run_id_of(checkpoint: Path) -> str | None:
    """The run id a checkpoint records (None when it cannot be read)."""
    try:
        return read_record(checkpoint)["run"].get("run_id", "")
    except (OSError, ValueError, AttributeError, KeyError, TypeError):
        return None


def stale_checkpoints(output_dir: Path, run_id: str, keep: int, just_written: Path) -> list[Path]:
    """The checkpoints of run ``run_id`` beyond the newest ``keep``, oldest first; the one just
    written always counts as kept, and other runs' checkpoints are never listed."""
    own = [path for _, path in checkpoints(output_dir) if path != just_written and run_id_of(path) == run_id]
    return own[: max(0, len(own) - (keep - 1))]


def claim_output_dir(output_dir: Path, overwrite: bool) -> None:
    """Make ``output_dir`` this fresh run's: refuse it when it holds checkpoints of an earlier
    run, or with ``overwrite`` delete that run's checkpoints, records and weights first."""
    found = checkpoints(output_dir)
    if found and not overwrite:
        raise CheckpointError(
            f"{output_dir}: holds checkpoints of an earlier run ({found[0][1].name} to {found[-1][1].name}); "
            "continue it with --resume latest, start a new run with another --output-dir, or replace it "
            "with --overwrite"
        )
    if overwrite:
        for name in ("checkpoints", "best", "final"):
            shutil.rmtree(output_dir / name, ignore_errors=True)
        (output_dir / "metrics.jsonl").unlink(missing_ok=True)


@contextlib.contextmanager
def without_shared_tensor_notice() -> Iterator[None]:
    """Drop accelerate's "Removed shared tensor ... while saving" warning while it runs.

    safetensors stores tied weights (a GPT-2's output embedding) once, and accelerate warns
    that a model rebuilt from the file alone might come back untied. A resume loads the file
    into the same models, whose ties remain (tests/test_oracle_text.py checks it), so the
    warning says nothing a user can act on; exports go through save_pretrained, which knows ties.
    """
    with without_log_records("accelerate.utils.other", "Removed shared tensor"):
        yield


def save_checkpoint(
    accelerator: Accelerator,
    output_dir: Path,
    record: dict[str, Any],
    keep: int,
    shape: dict[str, Any],
    modules: dict[str, nn.Module],
) -> Path:
    """Write the full training state to ``checkpoints/step-NNNNNNN`` on every rank: ``record``
    (each part's state; its ``run`` names the step and the run) and ``modules``: from the main
    process (safetensors' ``save_model``: tied weights stored once), or under FSDP2 their shards
    from every rank.

    Everything is written under a temporary name; after every rank has finished, the main
    process renames it, so a checkpoint directory with its final name is always complete.
    """
    root = output_dir / "checkpoints"
    step, run_id = record["run"]["step"], record["run"]["run_id"]
    final, partial = root / f"step-{step:07d}", root / f".partial-step-{step:07d}"

    def make_room() -> None:  # the main process; the others wait for it before writing
        shutil.rmtree(partial, ignore_errors=True)
        check_space(output_dir)

    sharded = sharding.is_sharded(accelerator)

    def write() -> None:  # every rank its part
        with writing(partial, output_dir), without_shared_tensor_notice(), sharding.without_fsdp_notices():
            if sharded:
                # Before accelerate's state, whose sharded writes come first too: the distributed
                # checkpoint's collectives carry a failure on one rank to all of them, and only
                # writes of each rank's own files, which cannot leave a rank waiting, follow them.
                for name, module in modules.items():
                    sharding.save_module(accelerator, module, partial, name)
            accelerator.save_state(str(partial))
            if accelerator.is_main_process:
                if not sharded:
                    for name, module in modules.items():
                        save_model(module, str(partial / f"{name}.safetensors"))
                state = {"format": RECORD_FORMAT, **record, "shape": shape}
                (partial / STATE_NAME).write_text(json.dumps(state, indent=1))

    def publish() -> None:  # the main process, once every rank has written its part
        with writing(partial, output_dir):
            integrity.write_digests(partial)  # read back: what a resume will check them against
            fsync_tree(partial)  # every rank's files, before the rename makes them the checkpoint
            if final.exists():
                shutil.rmtree(final)
            partial.rename(final)
            fsync_path(root)
        for old in stale_checkpoints(output_dir, run_id, keep, final):
            shutil.rmtree(old, ignore_errors=True)

    # Each step agreed: a full disk on one rank fails every rank at the same point, with the
    # partial directory removed; every rank leaves once the checkpoint has its final name
    # (the callers' long-work bound covers the waits for the main process).
    try:
        collectives.on_main_process(accelerator, "making room for the checkpoint", make_room)
        collectives.agreed(accelerator, "writing the checkpoint", write)
        collectives.on_main_process(accelerator, "publishing the checkpoint", publish)
    except BaseException:
        if accelerator.is_main_process:
            shutil.rmtree(partial, ignore_errors=True)
        raise
    return final


def writing(path: Path, output_dir: Path) -> contextlib.AbstractContextManager[None]:
    """:func:`trainer.state.storage.writing` for ``path`` of the run in ``output_dir``: a storage
    fault while the block writes is one line that names what a resume has."""
    return storage.writing(path, output_dir, functools.partial(last_complete, output_dir))


def last_complete(output_dir: Path) -> str:
    """What a resume of the run in ``output_dir`` has: its newest complete checkpoint and size."""
    if not output_dir.is_dir():
        return "nothing of the run is left there"
    found = checkpoints(output_dir)
    if not found:
        return "no complete checkpoint yet"
    path = found[-1][1]
    return f"the last complete checkpoint is {path.name} ({checkpoint_mb(path):.1f} MB)"


def checkpoint_mb(path: Path) -> float:
    """The size of the checkpoint at ``path``, in MB."""
    return sum(p.stat().st_size for p in integrity.files_of(path)) / 2**20


#: room kept beyond the size of the last checkpoint before a write starts (records, metadata)
SPACE_MARGIN_MB = 1.0


def check_space(output_dir: Path) -> None:
    """A StorageError when the output directory is gone or its disk cannot hold another
    checkpoint of the size of the newest: stopping before the write leaves no partial files,
    and keeps the space that the metrics and other writers of the disk still need."""
    if not output_dir.is_dir():
        raise storage.StorageError(
            f"the output directory {output_dir} is gone (deleted or unmounted since the run started); "
            "nothing of this run can be written"
        )
    found = checkpoints(output_dir)
    if not found:
        return
    needed, free = checkpoint_mb(found[-1][1]) + SPACE_MARGIN_MB, storage.free_mb(output_dir)
    if free < needed:
        raise storage.StorageError(
            f"no space left on the device for the next checkpoint in {output_dir / 'checkpoints'} "
            f"({free:.1f} MB free, {needed:.1f} MB needed); {last_complete(output_dir)}; "
            "free space, then continue with --resume latest"
        )


def load_checkpoint(accelerator: Accelerator, path: Path, modules: dict[str, nn.Module]) -> dict[str, Any]:
    """Restore accelerate's state and ``modules`` as ``save_checkpoint`` wrote them (the run's
    shape was checked by :func:`trainer.state.resuming.resumed_accumulation`); returns the record. A rank beyond the
    writing run's world finds no RNG state of its own: accelerate then keeps the one the run's
    seed gave it."""
    sharded = sharding.is_sharded(accelerator)
    for name in modules:
        if not (sharding.holds_module(path, name) if sharded else (path / f"{name}.safetensors").is_file()):
            raise CheckpointError(f"{path}: no {name} in it: written by a run without it (training.{name}_*)")
    try:
        record = read_record(path)
        record.pop("shape", None)
        with sharding.without_fsdp_notices():
            if sharded:  # the collectives first, as in save_checkpoint
                for name, module in modules.items():
                    sharding.load_module(accelerator, module, path, name)
            accelerator.load_state(str(path))
        if not sharded:
            for name, module in modules.items():
                load_model(module, str(path / f"{name}.safetensors"))  # onto the CPU, copied into the module
        return record
    except CheckpointError:
        raise
    except Exception as exc:
        raise CheckpointError(f"{path}: cannot resume from this checkpoint: {exc}") from None
