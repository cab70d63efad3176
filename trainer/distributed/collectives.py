"""Every collective the trainer runs, each at a point every rank reaches and each recording
itself as the heartbeat's "last collective", so that a stall report names the one a rank
waits in. Through accelerate's API where it has the operation; torch.distributed where it
has none (an asynchronous all-reduce; all-gather of objects between runs, when no
Accelerator exists).

Agreement: a fact that is local to a rank (an error, a flag, a value only the main process
knows) becomes every rank's before the next collective, so no rank is left waiting in one
that the others skip.
"""

from __future__ import annotations

import time
import zlib
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, TypeVar

import torch
from accelerate import Accelerator
from accelerate.utils import broadcast, broadcast_object_list, gather_object

from trainer.contract.errors import UserError
from trainer.distributed.watchdog import HEARTBEAT

T = TypeVar("T")


def barrier(accelerator: Accelerator, what: str) -> None:
    """Every rank waits here for the others (``what``: where, for the stall report)."""
    HEARTBEAT.collective_entered(f"barrier {what}")
    accelerator.wait_for_everyone()


def process_group_barrier(what: str) -> None:
    """A barrier of the default process group, where no Accelerator exists (an error path)."""
    if torch.distributed.is_initialized():
        HEARTBEAT.collective_entered(f"barrier {what}")
        torch.distributed.barrier()


def mean_over_ranks(accelerator: Accelerator, values: torch.Tensor, what: str) -> torch.Tensor:
    """``values`` averaged over the ranks (one all-reduce)."""
    if accelerator.num_processes == 1:
        return values
    HEARTBEAT.collective_entered(f"all_reduce ({what})")
    return accelerator.reduce(values, reduction="mean")


def share_running_statistics(accelerator: Accelerator, model: torch.nn.Module, what: str) -> None:
    """The running statistics of ``model``'s normalisation layers (BatchNorm's mean, variance
    and count) made rank 0's on every rank: one broadcast per tensor, none without such layers
    (the model's structure, the same on every rank, decides).

    Each rank normalises a training batch by that batch's own statistics, as in one process,
    and moves its running statistics by its own batches; DDP copies rank 0's into the others
    only at the start of its next forward. Taken at the end of each step, rank 0's make evals,
    exports and checkpoints see one model on every rank (SyncBatchNorm would instead put an
    all-reduce inside every training forward, the trainer's rank-local generation included).
    """
    statistics = [
        tensor
        for module in model.modules()
        if getattr(module, "track_running_stats", False) and getattr(module, "running_mean", None) is not None
        for tensor in (module.running_mean, module.running_var, module.num_batches_tracked)
    ]
    if accelerator.num_processes == 1 or not statistics:
        return
    HEARTBEAT.collective_entered(f"broadcast ({what})")
    broadcast(statistics, from_process=0)


def backward(accelerator: Accelerator, loss: torch.Tensor, what: str) -> None:
    """accelerate's backward; under DDP at a sync point it all-reduces the gradients."""
    if accelerator.sync_gradients and accelerator.num_processes > 1:
        HEARTBEAT.collective_entered(f"DDP all-reduce of {what} gradients (backward)")
    accelerator.backward(loss)


def start_iterator(loader: Any, what: str) -> Any:
    """``iter(loader)`` of a prepared loader: its seedable sampler broadcasts its seed."""
    HEARTBEAT.collective_entered(f"{what} dataloader start (sampler RNG broadcast)")
    return iter(loader)


def gather_outputs(accelerator: Accelerator, outputs: dict[str, torch.Tensor], pad_value: float) -> dict[str, Any]:
    """Every rank's per-sample outputs, in order, without the samples the sampler repeated to
    even out the shards; tensors of more than one dimension padded along dimension 1 first."""
    HEARTBEAT.collective_entered("pad_across_processes / gather_for_metrics (eval)")
    padded = {
        key: accelerator.pad_across_processes(value, dim=1, pad_index=pad_value) if value.dim() > 1 else value
        for key, value in outputs.items()
    }
    return accelerator.gather_for_metrics(padded)


def timed_round(accelerator: Accelerator, size_mb: float) -> tuple[list[tuple[str, float]], str]:
    """One round of all_reduce (of ``size_mb`` MB), all_gather, broadcast and barrier, each
    timed in ms (the doctor's); and what was wrong with the all_reduce's sum ('' if nothing)."""
    device = accelerator.device
    payload = torch.ones(int(size_mb * 2**20 / 4), device=device)
    rank = torch.tensor([accelerator.process_index], device=device)
    results: dict[str, Any] = {}
    timings = []
    for name, action in (
        (f"all_reduce {size_mb:g} MB", lambda: accelerator.reduce(payload, reduction="sum")),
        ("all_gather", lambda: accelerator.gather(rank)),
        ("broadcast", lambda: broadcast(torch.zeros(1, device=device), from_process=0)),
        ("barrier", accelerator.wait_for_everyone),
    ):
        HEARTBEAT.collective_entered(name)
        start = time.perf_counter()
        results[name] = action()
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        timings.append((name, 1000 * (time.perf_counter() - start)))
    total, expected = float(results[timings[0][0]][0]), float(accelerator.num_processes)
    return timings, "" if total == expected else f"all_reduce gave {total}, not {expected}"


def gather_objects(accelerator: Accelerator, mine: list[Any], what: str) -> list[Any]:
    """Every rank's list of small objects, concatenated in rank order."""
    if accelerator.num_processes == 1:
        return mine
    HEARTBEAT.collective_entered(f"gather_object ({what})")
    return gather_object(mine)


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
    result, error = result_or_user_error(action)
    fail_together(error, ranks_with(accelerator, error is not None, what), what, "see that rank's error")
    return result


def result_or_user_error(action: Callable[[], T]) -> tuple[T | None, UserError | None]:
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
    result, error = result_or_user_error(action)
    outcomes: list[tuple[T | None, str | None]] = [(None, None)] * torch.distributed.get_world_size()
    HEARTBEAT.collective_entered(f"all_gather_object ({what})")
    torch.distributed.all_gather_object(outcomes, (result, None if error is None else str(error)))
    failed = [rank for rank, (_, message) in enumerate(outcomes) if message is not None]
    fail_together(error, failed, what, str(outcomes[failed[0]][1]) if failed else "")
    return outcomes[0][0]


def on_main_process(accelerator: Accelerator, what: str, action: Callable[[], T]) -> T | None:
    """:func:`agreed`, with ``action`` run by the main process only (the others get None)."""
    return agreed(accelerator, what, action if accelerator.is_main_process else lambda: None)


def main_process_first(accelerator: Accelerator, what: str, action: Callable[[], T]) -> T:
    """:func:`agreed`, run by the main process before the others: what it writes (a cache), the
    others then read. A failure on any rank, in either turn, fails every rank."""
    first = on_main_process(accelerator, f"{what} (main process)", action)
    if accelerator.num_processes == 1:
        return first
    others = agreed(accelerator, what, (lambda: None) if accelerator.is_main_process else action)
    return first if accelerator.is_main_process else others


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
