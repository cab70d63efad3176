"""The models a run publishes (``best/``, ``final/``): each written whole under a temporary name,
then renamed, so a directory with its final name is always complete."""

from __future__ import annotations

import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

from accelerate import Accelerator
from safetensors.torch import save_file
from torch import nn

from trainer.state import adapters, checkpoint
from trainer.state.weights import WEIGHTS_NAME


def export_model(
    accelerator: Accelerator,
    model: nn.Module,
    state: dict[str, Any],
    directory: Path,
    extras: Callable[[Path], None] | None = None,
    merge_adapter: bool = True,
) -> None:
    """Write ``model``'s weights (safetensors), ``state`` (``accelerator.get_state_dict``, which
    every rank calls: gathering a sharded state dict is a collective), to ``directory``, replacing
    it as a whole; ``extras`` writes more files into it first. On the main process.

    A transformers model is written with ``save_pretrained`` so ``from_pretrained`` loads it;
    one with an adapter as :func:`trainer.state.adapters.adapted_exports` says (``merge_adapter``).
    """
    unwrapped = accelerator.unwrap_model(model)

    def weights(path: Path) -> None:
        if hasattr(unwrapped, "save_pretrained"):
            unwrapped.save_pretrained(path, state_dict=state)
        else:
            path.mkdir(parents=True)
            save_file({k: v.contiguous() for k, v in state.items()}, str(path / WEIGHTS_NAME))

    writers = adapters.adapted_exports(unwrapped, directory, merge_adapter) if adapters.is_adapted(unwrapped) else {}
    for target, write in (writers or {directory: weights}).items():
        publish(target, write, extras)


def publish(directory: Path, write: Callable[[Path], None], extras: Callable[[Path], None] | None) -> None:
    """``write`` (then ``extras``) into a partial directory, then renamed to ``directory`` whole."""
    partial = directory.with_name(f".partial-{directory.name}")
    shutil.rmtree(partial, ignore_errors=True)
    try:
        write(partial)
        if extras is not None:
            extras(partial)
        checkpoint.fsync_tree(partial)
    except BaseException:  # a full disk: the partial files go, the published directory stays
        shutil.rmtree(partial, ignore_errors=True)
        raise
    if directory.exists():
        shutil.rmtree(directory)
    partial.rename(directory)
    checkpoint.fsync_path(directory.parent)
