"""Initial weights into a model: a safetensors file or a ``save_pretrained`` directory, or a
legacy ``.pt``/``.pth``/``.bin`` state dict read without executing code; always onto the CPU,
whatever device they were saved from."""

from __future__ import annotations

import pickle
from pathlib import Path

import torch
from accelerate.logging import get_logger
from safetensors import SafetensorError
from safetensors.torch import load_file
from torch import nn

from trainer.contract.errors import CheckpointError

WEIGHTS_NAME = "model.safetensors"
logger = get_logger("trainer")


LEGACY_SUFFIXES = (".pt", ".pth", ".bin")


def weights_file(path: Path) -> Path:
    """The weights file behind an init path: the file itself, or ``DIR/model.safetensors``
    (``DIR/pytorch_model.bin`` for an old save_pretrained directory)."""
    if path.is_dir():
        for name in (WEIGHTS_NAME, "pytorch_model.bin"):
            if (path / name).is_file():
                return path / name
        raise CheckpointError(f"{path}: directory has no {WEIGHTS_NAME}")
    if not path.is_file():
        raise CheckpointError(f"{path}: no such file")
    if path.suffix != ".safetensors" and path.suffix not in LEGACY_SUFFIXES:
        raise CheckpointError(f"{path}: expected a .safetensors file (or a legacy .pt/.pth/.bin state dict)")
    return path


def read_legacy_state_dict(path: Path) -> dict[str, torch.Tensor]:
    """Tensors of a ``.pt``/``.bin`` state dict, read on the CPU without executing code.

    ``torch.load(weights_only=True)`` refuses a pickle that needs code to load; a state dict
    nested under ``state_dict``/``model`` is found, and a DDP ``module.`` prefix dropped.
    """
    try:
        obj = torch.load(path, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as exc:
        lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
        detail = next((line for line in lines if "GLOBAL" in line), lines[-1] if lines else "")[:200]
        raise CheckpointError(
            f"{path}: refused: this pickle needs code execution to load ({detail}); "
            "only plain tensors and containers are read"
        ) from None
    except Exception as exc:  # truncated or not a torch file: zip, EOF and runtime errors
        raise CheckpointError(f"{path}: cannot read: {str(exc).strip().splitlines()[0][:200]}") from None
    for key in ("state_dict", "model", "model_state_dict"):
        if isinstance(obj, dict) and isinstance(obj.get(key), dict):
            obj = obj[key]
    if not isinstance(obj, dict) or not all(isinstance(v, torch.Tensor) for v in obj.values()):
        raise CheckpointError(f"{path}: not a state dict (a mapping of names to tensors)")
    if obj and all(k.startswith("module.") for k in obj):
        obj = {k[len("module.") :]: v for k, v in obj.items()}
    return obj


def read_state_dict(path: str | Path, role: str) -> tuple[Path, dict[str, torch.Tensor]]:
    """The weights file behind ``path`` and its tensors, read on the CPU."""
    file = weights_file(Path(path))
    if file.suffix in LEGACY_SUFFIXES:
        logger.warning(f"{file}: reading a legacy pickle checkpoint; convert it with scripts/convert_checkpoint.py")
        return file, read_legacy_state_dict(file)
    try:
        return file, load_file(file, device="cpu")
    except (SafetensorError, OSError, ValueError) as exc:
        raise CheckpointError(f"{file}: cannot read {role} weights: {exc}") from None


def load_weights(model: nn.Module, path: str | Path, role: str) -> None:
    """Load a state dict into ``model`` from a safetensors (or legacy) file, on the CPU."""
    file, state = read_state_dict(path, role)
    try:
        result = model.load_state_dict(state, strict=False)
    except RuntimeError as exc:  # tensors of another shape: bad input, the same on every rank
        mismatch = next((line.strip() for line in str(exc).splitlines() if "size mismatch" in line), str(exc))
        raise CheckpointError(f"{file}: {role} weights do not fit the model: {mismatch[:300]}") from None
    problems = []
    if result.missing_keys:
        problems.append(f"missing {', '.join(result.missing_keys[:5])}")
    if result.unexpected_keys:
        problems.append(f"unexpected {', '.join(result.unexpected_keys[:5])}")
    if problems:
        raise CheckpointError(f"{file}: {role} weights do not fit the model: {'; '.join(problems)}")
