"""What FSDP2 (accelerate's FSDP with ``fsdp_version: 2``: torch's ``fully_shard``) changes
for a run: the models' parameters and gradients are DTensor shards, each forward all-gathers
the parameters it needs (a collective: every rank runs the same forwards in the same order, as
the loop already makes them), and a module the run keeps beside the prepared models (the
generator's average) is sharded as they are and checkpointed as they are (distributed
checkpoint: each rank writes its shards).

Under DDP (or one process) each function here does what the loop did before: nothing, or the
plain tensor's value.
"""

from __future__ import annotations

import contextlib
import sys
from pathlib import Path
from types import ModuleType

import torch
from accelerate import Accelerator
from accelerate.utils import fsdp2_prepare_model, load_fsdp_model, save_fsdp_model
from torch import nn

from trainer.contract.config import Config
from trainer.contract.errors import ConfigError
from trainer.contract.logs import without_log_records

#: torch's modules of FSDP2, DTensor and the distributed checkpoint, which the trainer does not
#: import itself: a process that stops before its first optimizer step (a bad config, a missing
#: file, the doctor) need not pay for them (a config error took 2.38-2.49 s of CPU with them and
#: 1.56-1.64 s without, five runs each on a 2-core machine alone, 2026-12-08). accelerate
#: imports them for a sharded run, torch's compiler (which the optimizers import) for every run
#: that trains.
NOT_IMPORTED = ("torch.distributed.fsdp", "torch.distributed.tensor", "torch.distributed.checkpoint")


def imported(name: str) -> ModuleType | None:
    """torch's module ``name`` (one of :data:`NOT_IMPORTED`) once the process has imported it,
    else None: until then no module is sharded, no tensor is a DTensor and no distributed
    checkpoint has raised (a submodule's import imports its package first)."""
    if name not in NOT_IMPORTED:
        raise ValueError(f"{name} is imported where it is needed")
    return sys.modules.get(name)


def is_sharded(accelerator: Accelerator) -> bool:
    """Whether the run's models are sharded with FSDP2 (FSDP1 is refused at start-up)."""
    return accelerator.is_fsdp2


def reshard(model: nn.Module) -> None:
    """Every group of a sharded model back to its shards (where they are already: nothing).

    torch keeps some groups gathered after a forward until the next backward: the root's, the
    last one's (accelerate's choice), every one's with ``fsdp_reshard_after_forward: false``. A
    forward here is as often without gradients (the generator's samples for the discriminator
    phase, the eval), so whoever reads the parameters directly (the average's update) calls
    this first: it meets the shards, not the gathered tensors. State dicts need no call: torch
    reshards before it writes one."""
    fsdp = imported("torch.distributed.fsdp")
    if fsdp is None:
        return
    for module in model.modules():
        if isinstance(module, fsdp.FSDPModule):
            module.reshard()


def check_config(accelerator: Accelerator, cfg: Config, source: str) -> None:
    """Fail on every rank before the models are read when the config asks for what the loop
    does not run under FSDP2: LoRA adapters (peft's ``generate`` skips the sharded model's top
    forward, and an adapted export copies the model, which a sharded one refuses)."""
    if not is_sharded(accelerator):
        return
    for key in ("peft", "discriminator_peft"):
        if getattr(cfg.model, key):
            error = ConfigError(
                f"{source}: key 'model.{key}': LoRA adapters do not run under FSDP2 yet; train them with "
                "a plain multi-GPU config (accelerate_configs/8gpu.yaml), or shard the whole models without it"
            )
            error.agreed = True  # the config and the launch are the same on every rank
            raise error


def shard_like_prepared(accelerator: Accelerator, module: nn.Module) -> nn.Module:
    """``module`` (a copy of a prepared model) sharded as accelerate shards a prepared model:
    the same groups, so each rank holds the shards of the same elements and an update from the
    model is local. It is not registered with accelerate: a checkpoint holds it by name."""
    return fsdp2_prepare_model(accelerator, module)


def describe(accelerator: Accelerator, models: dict[str, nn.Module]) -> str:
    """One line: how each model is sharded (its groups: one all-gather each per forward)."""
    from torch.distributed.fsdp import FSDPModule

    groups = ", ".join(
        f"the {role} in {sum(isinstance(m, FSDPModule) for m in model.modules())} group(s)"
        for role, model in models.items()
    )
    if accelerator.num_processes == 1:
        return f"FSDP2: {groups}; a world of one process, whose shards are whole"
    return f"FSDP2: {groups}; each of the {accelerator.num_processes} ranks holds a shard of every parameter"


def value(tensor: torch.Tensor) -> float:
    """A scalar's value; a DTensor's (a sum of shards: partial on each rank) reduced over the
    ranks first, which is a collective: every rank calls it at the same point."""
    dtensor = imported("torch.distributed.tensor")
    if dtensor is not None and isinstance(tensor, dtensor.DTensor):
        tensor = tensor.full_tensor()
    return float(tensor)


#: accelerate's notices for each sharded model a checkpoint saves or loads (two per model)
FSDP_NOTICES = (
    *("Saving model to", "Model saved to", "Loading model from", "Model loaded from"),
    *("Saving Optimizer", "Optimizer state saved", "Loading Optimizer", "Optimizer loaded", "Optimizer state loaded"),
)


def without_fsdp_notices() -> contextlib.AbstractContextManager[list]:
    """Drop accelerate's INFO lines for each sharded model and optimizer it saves or loads: the
    trainer says once where a checkpoint went, and how long it took."""
    return without_log_records("accelerate.utils.fsdp_utils", *FSDP_NOTICES)


def holds_module(directory: Path, name: str) -> bool:
    """Whether the checkpoint at ``directory`` holds the sharded module ``name`` (a distributed
    checkpoint, or one whole file with ``fsdp_state_dict_type: FULL_STATE_DICT``)."""
    stem = directory / f"pytorch_model_fsdp_{name}"
    return stem.is_dir() or stem.with_name(f"{stem.name}.bin").is_file()


def save_module(accelerator: Accelerator, module: nn.Module, directory: Path, name: str) -> None:
    """Every rank writes its shards of ``module`` under ``directory`` (see :func:`holds_module`)."""
    save_fsdp_model(accelerator.state.fsdp_plugin, accelerator, module, str(directory), model_index=name)


def load_module(accelerator: Accelerator, module: nn.Module, directory: Path, name: str) -> None:
    """Every rank reads its shards of ``module`` from a checkpoint :func:`save_module` wrote (at
    any number of processes: the distributed checkpoint reshards)."""
    load_fsdp_model(accelerator.state.fsdp_plugin, accelerator, module, str(directory), model_index=name)
