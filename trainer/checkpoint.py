"""Weights in and out: initial weights, full training checkpoints, best/ and final/ exports.

Weights are read with safetensors onto the CPU, whatever device they were saved from; a
checkpoint directory appears under its final name only once every rank has written it.
"""

from __future__ import annotations

import json
import re
import shutil
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
from accelerate import Accelerator
from safetensors import SafetensorError
from safetensors.torch import load_file, save_file
from torch import nn

from trainer.errors import CheckpointError

CHECKPOINT_PATTERN = re.compile(r"^step-(\d{7,})$")
WEIGHTS_NAME = "model.safetensors"
STATE_NAME = "trainer_state.json"


@dataclass
class TrainState:
    """Counters of a run; identical on every rank by construction."""

    step: int = 0
    d_steps: int = 0
    g_steps: int = 0
    epoch: int = 0
    position: int = 0
    skipped_d: int = 0
    skipped_g: int = 0
    consecutive_skips_d: int = 0
    consecutive_skips_g: int = 0
    best_value: float | None = None
    best_step: int | None = None


def weights_file(path: Path) -> Path:
    """The safetensors file behind an init path: the file itself or ``DIR/model.safetensors``."""
    if path.is_dir():
        candidate = path / WEIGHTS_NAME
        if not candidate.is_file():
            raise CheckpointError(f"{path}: directory has no {WEIGHTS_NAME}")
        return candidate
    if path.suffix != ".safetensors":
        raise CheckpointError(
            f"{path}: only safetensors weights are read; convert a pickle checkpoint to safetensors first"
        )
    if not path.is_file():
        raise CheckpointError(f"{path}: no such file")
    return path


def load_weights(model: nn.Module, path: str | Path, role: str) -> None:
    """Load a state dict into ``model`` from a safetensors file, on the CPU."""
    file = weights_file(Path(path))
    try:
        state = load_file(file, device="cpu")
    except (SafetensorError, OSError, ValueError) as exc:
        raise CheckpointError(f"{file}: cannot read {role} weights: {exc}") from None
    result = model.load_state_dict(state, strict=False)
    problems = []
    if result.missing_keys:
        problems.append(f"missing {', '.join(result.missing_keys[:5])}")
    if result.unexpected_keys:
        problems.append(f"unexpected {', '.join(result.unexpected_keys[:5])}")
    if problems:
        raise CheckpointError(f"{file}: {role} weights do not fit the model: {'; '.join(problems)}")


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


def resolve_resume(resume: str, output_dir: Path) -> Path | None:
    """The checkpoint ``--resume`` names: ``latest`` (None when there is none yet) or a path."""
    if resume == "latest":
        found = checkpoints(output_dir)
        return found[-1][1] if found else None
    path = Path(resume)
    if not (path / STATE_NAME).is_file():
        raise CheckpointError(f"{path}: not a complete checkpoint directory (no {STATE_NAME})")
    return path


def save_checkpoint(
    accelerator: Accelerator, output_dir: Path, state: TrainState, rank_state: dict[str, torch.Tensor], keep: int
) -> Path:
    """Write the full training state to ``checkpoints/step-NNNNNNN`` on every rank.

    Everything is written under a temporary name; after every rank has finished, the main
    process renames it, so a checkpoint directory with its final name is always complete.
    """
    root = output_dir / "checkpoints"
    final = root / f"step-{state.step:07d}"
    partial = root / f".partial-step-{state.step:07d}"
    if accelerator.is_main_process:
        shutil.rmtree(partial, ignore_errors=True)
    accelerator.wait_for_everyone()
    accelerator.save_state(str(partial))
    save_file(rank_state, str(partial / f"rank_state_{accelerator.process_index}.safetensors"))
    if accelerator.is_main_process:
        (partial / STATE_NAME).write_text(json.dumps(asdict(state), indent=1))
    accelerator.wait_for_everyone()
    if accelerator.is_main_process:
        if final.exists():
            shutil.rmtree(final)
        partial.rename(final)
        for _, old in checkpoints(output_dir)[:-keep]:
            shutil.rmtree(old, ignore_errors=True)
    return final


def load_checkpoint(accelerator: Accelerator, path: Path) -> tuple[TrainState, dict[str, torch.Tensor]]:
    """Restore the state ``save_checkpoint`` wrote; returns the counters and this rank's state."""
    try:
        state = TrainState(**json.loads((path / STATE_NAME).read_text()))
        accelerator.load_state(str(path))
        rank_file = path / f"rank_state_{accelerator.process_index}.safetensors"
        if not rank_file.is_file():
            raise CheckpointError(
                f"{path}: no state for rank {accelerator.process_index}; it was written by a run with fewer processes"
            )
        return state, load_file(str(rank_file), device="cpu")
    except CheckpointError:
        raise
    except Exception as exc:
        raise CheckpointError(f"{path}: cannot resume from this checkpoint: {exc}") from None


def export_model(accelerator: Accelerator, model: nn.Module, directory: Path) -> None:
    """Write ``model``'s weights (safetensors) to ``directory``, replacing it as a whole.

    A transformers model is written with ``save_pretrained`` so ``from_pretrained`` loads it.
    Called on every rank: gathering a sharded state dict is a collective.
    """
    state = accelerator.get_state_dict(model)
    if not accelerator.is_main_process:
        return
    partial = directory.with_name(f".partial-{directory.name}")
    shutil.rmtree(partial, ignore_errors=True)
    bare = accelerator.unwrap_model(model)
    if hasattr(bare, "save_pretrained"):
        bare.save_pretrained(partial, state_dict=state)
    else:
        partial.mkdir(parents=True)
        save_file({k: v.contiguous() for k, v in state.items()}, str(partial / WEIGHTS_NAME))
    if directory.exists():
        shutil.rmtree(directory)
    partial.rename(directory)
