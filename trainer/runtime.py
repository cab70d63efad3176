"""The Accelerator, the world it runs in, and the collectives that make rank-local facts agreed.

Every collective of the start-up and of the per-step agreement lives in this module or in the
loop, at fixed points that every rank reaches.
"""

from __future__ import annotations

import os
import resource
import socket
import zlib
from collections.abc import Callable, Sequence
from datetime import timedelta
from pathlib import Path
from typing import TypeVar

import torch
from accelerate import Accelerator, DataLoaderConfiguration, InitProcessGroupKwargs
from accelerate.logging import get_logger
from accelerate.state import AcceleratorState, GradientState
from accelerate.utils import DistributedType, GradientAccumulationPlugin, broadcast_object_list, gather_object

from trainer.config import Config
from trainer.errors import UserError
from trainer.peers import close_watch
from trainer.process_group import form_process_group, startup_bound
from trainer.watchdog import HEARTBEAT

logger = get_logger("trainer")
T = TypeVar("T")


def build_accelerator(
    cfg: Config,
    device: str,
    project_dir: str | None,
    log_with: Sequence[str] | None = None,
    scaler: torch.amp.GradScaler | None = None,
) -> Accelerator:
    """Create the one Accelerator of a run and check the world it sees.

    ``scaler`` replaces accelerate's GradScaler (tests use a CPU GradScaler to exercise the
    shared-scaler path, which accelerate does not create on the CPU).
    """
    if cfg.distributed.debug:
        # Read by torch when the process group starts: checks that every rank runs the same
        # collective and reports the mismatch instead of hanging.
        os.environ["TORCH_DISTRIBUTED_DEBUG"] = "DETAIL"
    # A previous run in this process (a notebook, a test) leaves accelerate's singletons set.
    AcceleratorState._reset_state()
    GradientState._reset_state()
    with startup_bound(cfg.distributed.timeout_s):
        # Without cpu=True on a machine without GPUs, a launcher starts N one-process worlds.
        cpu = form_process_group(device, cfg.distributed.timeout_s)
        accelerator = make_accelerator(cfg, cpu, project_dir, log_with)
    if scaler is not None:
        accelerator.scaler = scaler
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
        project_dir=project_dir,
    )


def release_accelerator() -> None:
    """Forget accelerate's per-run singletons so that a later run in this process starts clean.

    Without a process group, the per-process state (device, world of one) goes too: the next
    run may ask for another device, or be launched into processes forked from this one.
    """
    AcceleratorState._reset_state(reset_partial_state=not torch.distributed.is_initialized())
    GradientState._reset_state()


def check_world(accelerator: Accelerator) -> None:
    """Fail on every rank when the launcher's world size is not the one Accelerate built."""
    launched = int(os.environ.get("WORLD_SIZE", "1"))
    if launched != accelerator.num_processes:
        raise UserError(
            f"rank {os.environ.get('RANK', '?')}: the launcher started {launched} processes but "
            f"this one sees a world of {accelerator.num_processes} "
            f"({accelerator.distributed_type.value}); use --device cpu on a machine without GPUs"
        )


#: what the loop supports: it reads each rank's whole gradients and calls the bare modules,
#: which sharded parameters (FSDP, DeepSpeed, Megatron) would make wrong
SUPPORTED_TYPES = (DistributedType.NO, DistributedType.MULTI_CPU, DistributedType.MULTI_GPU)


def check_supported(accelerator: Accelerator) -> None:
    """Fail on every rank, before training, under a distributed type the loop does not support."""
    if accelerator.distributed_type not in SUPPORTED_TYPES:
        error = UserError(
            f"rank {accelerator.process_index}: accelerate's distributed type {accelerator.distributed_type.value} "
            "is not supported: the loop reads whole gradients and calls the bare models, which sharded "
            "parameters break; use a plain multi-GPU or multi-CPU accelerate config (accelerate_configs/8gpu.yaml)"
        )
        error.agreed = True  # the config is the same on every rank
        raise error


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
    if accelerator.num_processes == 1:
        return mine
    HEARTBEAT.collective_entered("gather_object (device map)")
    return gather_object(mine)


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


class AnyRank:
    """For each flag, whether it is set on any rank, from one all-reduce of the whole vector
    that runs while the caller computes: started here, waited for by :meth:`result`.

    Every rank starts and waits at the same points of the loop. The all-reduce goes through
    torch.distributed with ``async_op`` (accelerate's reduce has no asynchronous form): on two
    CPU processes a blocking one costs ~0.7 ms, 3% of a small model's step.
    """

    def __init__(self, accelerator: Accelerator, flags: Sequence[bool], purpose: str) -> None:
        self.purpose = purpose
        self.flags = [bool(f) for f in flags]
        self.work = None
        if accelerator.num_processes > 1:
            self.tensor = torch.tensor([float(f) for f in flags], device=accelerator.device)
            HEARTBEAT.collective_entered(f"all_reduce ({purpose}), started")
            self.work = torch.distributed.all_reduce(self.tensor, async_op=True)

    def result(self) -> list[bool]:
        if self.work is None:
            return self.flags
        HEARTBEAT.collective_entered(f"all_reduce ({self.purpose}), waiting for its result")
        self.work.wait()
        return [bool(v > 0) for v in self.tensor.tolist()]


def ranks_with(accelerator: Accelerator, flag: bool, purpose: str) -> list[int]:
    """The ranks on which ``flag`` is set (one all-gather)."""
    flags = torch.tensor([float(flag)], device=accelerator.device)
    if accelerator.num_processes > 1:
        HEARTBEAT.collective_entered(f"all_gather ({purpose})")
        flags = accelerator.gather(flags)
    gathered = flags
    return [rank for rank, value in enumerate(gathered.tolist()) if value > 0]


def check_same_on_every_rank(accelerator: Accelerator, value: str, what: str, remedy: str) -> None:
    """Fail on every rank when ``value`` (a description of something that the next collectives
    need alike on every rank) differs between ranks: one all-gather of a checksum; the
    descriptions themselves are gathered only when they differ, to name them."""
    if accelerator.num_processes == 1:
        return
    checksum = torch.tensor([zlib.crc32(value.encode())], dtype=torch.int64, device=accelerator.device)
    HEARTBEAT.collective_entered(f"all_gather ({what}, checksum)")
    if len(set(accelerator.gather(checksum).tolist())) == 1:
        return
    HEARTBEAT.collective_entered(f"gather_object ({what})")
    values = gather_object([value])
    seen = "; ".join(f"rank {rank}: {text}" for rank, text in enumerate(values))
    error = UserError(f"{what} on different ranks ({seen}); {remedy}")
    error.agreed = True
    raise error


def from_main_process(accelerator: Accelerator, value: T, purpose: str) -> T:
    """Rank 0's ``value`` on every rank (one broadcast of a small object)."""
    if accelerator.num_processes == 1:
        return value
    HEARTBEAT.collective_entered(f"broadcast ({purpose})")
    shared = [value]
    broadcast_object_list(shared, from_process=0)
    return shared[0]


def agreed(accelerator: Accelerator, what: str, action: Callable[[], T]) -> T:
    """Run ``action`` on every rank; if it fails with a UserError on any rank, fail on all.

    The rank that failed re-raises its own error; the others raise one naming that rank, so no
    rank is left waiting in a later collective.
    """
    result, error = attempt(action)
    fail_together(error, ranks_with(accelerator, error is not None, what), what, "see that rank's error")
    return result


def attempt(action: Callable[[], T]) -> tuple[T | None, UserError | None]:
    """``action``'s result, or the UserError it raised (then None for the result)."""
    try:
        return action(), None
    except UserError as exc:
        return None, exc


def fail_together(error: UserError | None, failed: list[int], what: str, detail: str) -> None:
    """Raise on every rank when ``failed`` (the same list on every rank) is not empty: a failed
    rank its own ``error``, the others one naming the failed ranks and ``detail``."""
    if not failed:
        return
    if error is None:
        error = UserError(f"{what} failed on rank(s) {', '.join(map(str, failed))}; {detail}")
    error.agreed = True
    raise error


def agreed_between_runs(what: str, action: Callable[[], T]) -> T:
    """:func:`agreed` for the work between two runs of a pipeline, where the earlier run's
    process group exists but no Accelerator: ``action`` runs on every rank, a UserError on any
    rank fails every rank (its message travels), and rank 0's result is every rank's. Without
    a process group (the first run, one process) ``action`` runs alone."""
    if not torch.distributed.is_initialized() or torch.distributed.get_world_size() == 1:
        return action()
    result, error = attempt(action)
    outcomes: list[tuple[T | None, str | None]] = [(None, None)] * torch.distributed.get_world_size()
    HEARTBEAT.collective_entered(f"all_gather_object ({what})")
    torch.distributed.all_gather_object(outcomes, (result, None if error is None else str(error)))
    failed = [rank for rank, (_, message) in enumerate(outcomes) if message is not None]
    fail_together(error, failed, what, str(outcomes[failed[0]][1]) if failed else "")
    return outcomes[0][0]


def on_main_process(accelerator: Accelerator, what: str, action: Callable[[], T]) -> T | None:
    """:func:`agreed`, with ``action`` run by the main process only (the others get None)."""
    return agreed(accelerator, what, action if accelerator.is_main_process else lambda: None)


def check_shared_output_dir(accelerator: Accelerator, output_dir: Path, token: str) -> None:
    """Fail on every rank when a rank does not see the files the main process writes in
    ``output_dir``: every rank writes its part of a checkpoint there and the main process
    renames it, so on several nodes it must be one shared directory (a network filesystem).
    ``token`` names the file, the same on every rank."""
    if accelerator.num_processes == 1:
        return
    marker = output_dir / f".shared-check-{token}"

    def write_marker() -> None:
        output_dir.mkdir(parents=True, exist_ok=True)
        marker.write_text(token)

    on_main_process(accelerator, f"writing {output_dir}", write_marker)
    blind = ranks_with(accelerator, not marker.is_file(), "ranks that cannot see the output directory")
    if accelerator.is_main_process:
        marker.unlink(missing_ok=True)
    if blind:
        error = UserError(
            f"{output_dir}: rank(s) {', '.join(map(str, blind))} do not see the files rank 0 writes there; the "
            "output directory must be one directory shared by every node: mount a shared filesystem at the "
            "same path on each node, or give --output-dir a path on one"
        )
        error.agreed = True
        raise error


def main_process_first(accelerator: Accelerator, what: str, action: Callable[[], T]) -> T:
    """:func:`agreed`, run by the main process before the others: what it writes (a cache), the
    others then read. A failure on any rank, in either turn, fails every rank."""
    first = on_main_process(accelerator, f"{what} (main process)", action)
    if accelerator.num_processes == 1:
        return first
    others = agreed(accelerator, what, (lambda: None) if accelerator.is_main_process else action)
    return first if accelerator.is_main_process else others


def end_process_group() -> None:
    """Destroy the default process group, if any, before the process exits: one left to the
    interpreter's exit can abort the process ("terminate called without an active exception")
    after the work is done. The peers' watch (which holds a store client) ends first."""
    close_watch()
    if torch.distributed.is_initialized():
        torch.distributed.destroy_process_group()
