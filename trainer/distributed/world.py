"""The Accelerator of a run and the world it runs in: built (start-up bounded), checked (the
launcher's world size, a supported distributed type, a device per rank), described, and
released so that a later run in this process starts clean."""

from __future__ import annotations

import atexit
import contextlib
import os
import resource
import socket
import sys
import threading
from collections.abc import Sequence
from datetime import timedelta
from pathlib import Path
from typing import NoReturn

import torch
from accelerate import Accelerator, DataLoaderConfiguration, InitProcessGroupKwargs
from accelerate.state import AcceleratorState, GradientState, PartialState
from accelerate.utils import (
    DistributedType,
    FullyShardedDataParallelPlugin,
    GradientAccumulationPlugin,
    ProjectConfiguration,
    parse_flag_from_env,
)

from trainer.contract.config import Config, RunConfig
from trainer.contract.errors import UserError
from trainer.distributed import collectives
from trainer.distributed.peer_watch import close_watch
from trainer.distributed.process_group import form_process_group, startup_bound


def build_accelerator(
    cfg: Config,
    device: str,
    project_dir: str | None,
    log_with: Sequence[str] | None = None,
) -> Accelerator:
    """Create the one Accelerator of a run and check the world it sees."""
    if cfg.distributed.debug:
        # Read by torch when the process group starts: checks that every rank runs the same
        # collective and reports the mismatch instead of hanging.
        os.environ["TORCH_DISTRIBUTED_DEBUG"] = "DETAIL"
    # A previous run in this process (a notebook, a test) leaves accelerate's singletons set.
    reset_accelerate_state(partial=False)
    check_launcher()
    check_requested_type()
    with startup_bound(cfg.distributed.timeout_s):
        # Without cpu=True on a machine without GPUs, a launcher starts N one-process worlds.
        cpu = form_process_group(device, cfg.distributed.timeout_s)
        accelerator = make_accelerator(cfg, cpu, project_dir, log_with)
    shard_on_cpu(accelerator)
    check_world(accelerator)
    check_supported(accelerator)
    return accelerator


def make_accelerator(cfg: Config, cpu: bool, project_dir: str | None, log_with: Sequence[str] | None) -> Accelerator:
    """The Accelerator of a run (it forms the process group unless one exists)."""
    return Accelerator(
        cpu=cpu,
        mixed_precision=cfg.training.mixed_precision or None,
        gradient_accumulation_plugin=GradientAccumulationPlugin(
            num_steps=cfg.training.gradient_accumulation_steps,
            # Each phase takes exactly `gradient_accumulation_steps` micro-batches from an
            # endless stream, so an epoch boundary must not force an early sync.
            sync_with_dataloader=False,
        ),
        # The learning rate is a function of the optimizer step alone, not of the world size.
        step_scheduler_with_optimizer=False,
        dataloader_config=DataLoaderConfiguration(use_seedable_sampler=True, data_seed=cfg.training.seed),
        kwargs_handlers=[InitProcessGroupKwargs(timeout=timedelta(seconds=cfg.distributed.timeout_s))],
        log_with=list(log_with) if log_with else None,
        # trackers that write files (tensorboard) write under OUTPUT/tensorboard/<project>
        project_config=ProjectConfiguration(
            project_dir=project_dir, logging_dir=str(Path(project_dir) / "tensorboard") if project_dir else None
        ),
    )


#: whether :func:`shard_on_cpu` made this process's MULTI_CPU type FSDP (given back when the
#: run's state is reset)
MADE_CPU_WORLD_FSDP = False


def shard_on_cpu(accelerator: Accelerator) -> None:
    """An FSDP launch (``distributed_type: FSDP``) on a world of CPU processes made FSDP, as
    accelerate makes it on GPUs.

    accelerate turns FSDP on only for the device types in its list of accelerators, and leaves a
    CPU world plain MULTI_CPU with the config's sharding unused. torch's ``fully_shard`` runs
    on the CPU over gloo, so an FSDP config can be rehearsed on a machine without GPUs (and the
    tests run it). AcceleratorState takes PartialState's type each time it is built (prepare
    builds it), so both are set, as accelerate sets both itself.
    """
    global MADE_CPU_WORLD_FSDP
    if not launcher_asks("FSDP") or accelerator.distributed_type != DistributedType.MULTI_CPU:
        return
    plugin = FullyShardedDataParallelPlugin()  # from the launcher's FSDP_* variables
    if accelerator.mixed_precision != "no":
        plugin.set_mixed_precision(accelerator.mixed_precision)
    MADE_CPU_WORLD_FSDP = True
    accelerator.state.fsdp_plugin = plugin
    accelerator.state.distributed_type = DistributedType.FSDP
    PartialState._shared_state["distributed_type"] = DistributedType.FSDP


def release_accelerator() -> None:
    """Forget accelerate's per-run singletons so that a later run in this process starts clean.

    Without a process group, the per-process state (device, world of one) goes too: the next
    run may ask for another device, or be launched into processes forked from this one.
    """
    reset_accelerate_state(partial=not torch.distributed.is_initialized())


def reset_accelerate_state(partial: bool) -> None:
    """accelerate's singletons (the state of its Accelerator and of gradient accumulation)
    forgotten; with ``partial`` the per-process state too. accelerate has no public way to do
    this; its private ``_reset_state`` is called here alone, and tests/test_api.py fails loudly
    if an upgrade changes it. A type :func:`shard_on_cpu` set is given back first: the process
    state outlives the run when its process group does."""
    global MADE_CPU_WORLD_FSDP
    if MADE_CPU_WORLD_FSDP and "distributed_type" in PartialState._shared_state:
        PartialState._shared_state["distributed_type"] = DistributedType.MULTI_CPU
    MADE_CPU_WORLD_FSDP = False
    AcceleratorState._reset_state(reset_partial_state=partial)
    GradientState._reset_state()


def check_launcher() -> None:
    """Fail before any process group when ``accelerate launch`` started this process alone of a
    config that asks for several on one machine: its one-process launcher, which it takes whenever
    the config says ``use_cpu``, then sets the rendezvous address (for more than one process) but
    starts one process and no ``WORLD_SIZE``, and the run would train alone, silently."""
    started_alone = "WORLD_SIZE" not in os.environ and "MASTER_PORT" in os.environ
    if os.environ.get("ACCELERATE_USE_CPU") == "True" and started_alone:
        error = UserError(
            "accelerate launch started 1 process of a config that asks for more: a config with use_cpu: true "
            "takes accelerate's one-process launcher; use accelerate_configs/cpu.yaml as shipped (or any config "
            "with use_cpu: false) and --device cpu"
        )
        error.agreed = True  # the one process is the whole world
        raise error


def describe_precision(accelerator: Accelerator, run: RunConfig) -> str:
    """One line: the precision in effect and where it came from (the command line, the training
    config, the launcher, or accelerate's default)."""
    asked = run.config.training.mixed_precision
    if "training.mixed_precision" in run.overridden:
        origin = "--set training.mixed_precision"
    elif asked:
        origin = f"training.mixed_precision of {run.source}"
    elif "ACCELERATE_MIXED_PRECISION" in os.environ:
        origin = "the launcher (its accelerate config or --mixed_precision; training.mixed_precision is empty)"
    else:
        origin = "accelerate's default (no launcher, training.mixed_precision empty)"
    mode = accelerator.mixed_precision
    in_effect = {"no": "fp32", "bf16": "bf16 autocast", "fp16": "fp16 autocast with a GradScaler"}.get(mode, mode)
    if mode == "fp16" and accelerator.scaler is None and accelerator.device.type == "cpu":
        in_effect = "fp32 (accelerate makes no fp16 autocast and no GradScaler on the CPU)"
    return f"precision: {in_effect}, mixed_precision {mode} from {origin}"


def check_world(accelerator: Accelerator) -> None:
    """Fail on every rank when the launcher's world size is not the one Accelerate built."""
    launched = int(os.environ.get("WORLD_SIZE", "1"))
    if launched != accelerator.num_processes:
        raise UserError(
            f"rank {os.environ.get('RANK', '?')}: the launcher started {launched} processes but "
            f"this one sees a world of {accelerator.num_processes} "
            f"({accelerator.distributed_type.value}); use --device cpu on a machine without GPUs"
        )


#: the distributed types the loop runs under: one process, DDP on CPUs or GPUs, and FSDP2
#: (accelerate's FSDP with ``fsdp_version: 2``: torch's ``fully_shard``)
SUPPORTED_TYPES = (DistributedType.NO, DistributedType.MULTI_CPU, DistributedType.MULTI_GPU, DistributedType.FSDP)


def check_supported(accelerator: Accelerator) -> None:
    """Fail on every rank, before training, under a distributed type the loop does not support
    (FSDP1, DeepSpeed, Megatron-LM): each is one line pointing to FSDP2."""
    kind = accelerator.distributed_type
    if kind in SUPPORTED_TYPES and (kind != DistributedType.FSDP or accelerator.is_fsdp2):
        return
    name = "FSDP with fsdp_version 1" if kind == DistributedType.FSDP else f"accelerate's distributed type {kind.value}"
    raise unsupported_type(name, str(accelerator.process_index))


def check_requested_type() -> None:
    """:func:`check_supported` before any process group, from what the launcher asked
    (``accelerate launch`` sets ``ACCELERATE_USE_*``): accelerate cannot even build some of them
    (FSDP1 on the CPU), and then fails with a traceback."""
    rank = os.environ.get("RANK", "0")
    if launcher_asks("FSDP") and os.environ.get("FSDP_VERSION", "1") != "2":
        raise unsupported_type("FSDP with fsdp_version 1", rank)
    for kind in ("DEEPSPEED", "MEGATRON_LM"):
        if launcher_asks(kind):
            raise unsupported_type(f"accelerate's distributed type {kind}", rank)


def launcher_asks(kind: str) -> bool:
    """Whether ``accelerate launch`` asked for ``kind`` (FSDP, DEEPSPEED, MEGATRON_LM)."""
    return parse_flag_from_env(f"ACCELERATE_USE_{kind}")


def unsupported_type(name: str, rank: str) -> UserError:
    """The one line of a distributed type the loop does not run."""
    error = UserError(
        f"rank {rank}: {name} is not supported: the loop shards both models with FSDP2 "
        "(torch's fully_shard); use fsdp_version: 2 (accelerate_configs/8gpu_fsdp.yaml), or a plain multi-GPU "
        "or multi-CPU config (accelerate_configs/8gpu.yaml)"
    )
    error.agreed = True  # the config is the same on every rank
    return error


def describe_rank(accelerator: Accelerator) -> str:
    """One line naming host, rank, local rank and device."""
    device = accelerator.device
    detail = ""
    if device.type == "cuda":
        detail = f" ({torch.cuda.get_device_name(device)}, {device_identity(device)})"
    return (
        f"host {socket.gethostname()} rank {accelerator.process_index}/{accelerator.num_processes} "
        f"local rank {accelerator.local_process_index} device {device}{detail}"
    )


def device_identity(device: torch.device) -> str:
    """A name for the physical device (its UUID on CUDA), to find ranks that share one."""
    if device.type == "cuda":
        props = torch.cuda.get_device_properties(device)
        return f"cuda uuid {getattr(props, 'uuid', device.index)}"
    return device.type


def device_map(accelerator: Accelerator) -> list[tuple[str, int, str, int]]:
    """(host, rank, device identity, pid) of every rank (one all-gather of small objects)."""
    mine = [(socket.gethostname(), accelerator.process_index, device_identity(accelerator.device), os.getpid())]
    return collectives.gather_objects(accelerator, mine, "device map")


def shared_devices(world: list[tuple[str, int, str, int]]) -> str:
    """A description of two ranks on one accelerator of one host, or '' when there is none."""
    owner: dict[tuple[str, str], int] = {}
    for host, rank, identity, _ in world:
        if identity != "cpu" and (host, identity) in owner:
            return f"ranks {owner[(host, identity)]} and {rank} share {identity} on {host}"
        owner.setdefault((host, identity), rank)
    return ""


def check_devices(accelerator: Accelerator) -> list[int]:
    """Fail on every rank, before training, when two ranks share a device; returns the pids of
    the other ranks on this host (for the watchdog)."""
    world = device_map(accelerator)
    clash = shared_devices(world)
    if clash:
        error = UserError(f"{clash}; each rank needs its own device (check CUDA_VISIBLE_DEVICES and the launcher)")
        error.agreed = True
        raise error
    host = socket.gethostname()
    return [pid for peer_host, rank, _, pid in world if peer_host == host and rank != accelerator.process_index]


def peak_memory_mb(device: torch.device) -> float:
    """Peak memory of this process: allocated GPU memory on CUDA, resident set size on the CPU."""
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device) / 2**20
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # kilobytes on Linux


#: whether this process has formed a process group (its backend's threads may outlive it)
HAD_PROCESS_GROUP = False


def end_process_group() -> None:
    """Destroy the default process group, if any, before the process exits (then see
    :func:`exit_process`). The peers' watch (which holds a store client) ends first."""
    global HAD_PROCESS_GROUP
    close_watch()
    if torch.distributed.is_initialized():
        HAD_PROCESS_GROUP = True
        torch.distributed.destroy_process_group()


def exit_process(status: int) -> NoReturn:
    """End a command's process with ``status`` as a normal exit does (threads joined, exit
    handlers run: log files, trackers, data workers; streams flushed), but after a process
    group without the interpreter's finalization.

    gloo's worker threads outlive ``destroy_process_group`` (the wrapped models still hold
    the group), and a thread that drops a finished collective's tensors takes the GIL to do
    so. If that happens while the interpreter finalizes, Python ends the thread inside a C++
    destructor and the process aborts (SIGABRT, "terminate called without an active
    exception") after its work is done, more often on a loaded machine. Nothing is left to
    finalize that the exit handlers have not closed.
    """
    if not HAD_PROCESS_GROUP and not torch.distributed.is_initialized():
        sys.exit(status)
    # What the interpreter's exit does before it finalizes, which os._exit would skip: wait
    # for the threads that are not daemons, run the exit handlers (private, no public form).
    threading._shutdown()  # noqa: SLF001
    atexit._run_exitfuncs()  # noqa: SLF001
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):  # a closed or broken stream: nothing left to say
            stream.flush()
    os._exit(status)
