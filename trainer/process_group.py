"""Forming the process group: a key space of its own for each launcher round, and a bound on
how long start-up may take.

Why a key space of its own. Under ``torchrun --max-restarts N`` and ``accelerate launch
--max_restarts N`` torch's elastic agent hosts one TCPStore for the whole job and hands it to
every round of workers (``TORCHELASTIC_USE_AGENT_STORE=True``); torch's env:// rendezvous then
connects the restarted workers to that same store without a per-round prefix (its comment in
``torch/distributed/rendezvous.py`` assumes "a new TCPStore for every retry"). The default
group's keys (gloo's listening addresses, NCCL's unique id) are named the same in every round,
so a restarted worker can read the previous round's address before its peer has written the
new one: measured here, gloo's ``connectFullMesh`` then fails with "Connection refused" or
waits past every timeout. The trainer forms the group itself on a ``PrefixStore`` named after
``TORCHELASTIC_RESTART_COUNT``, and the Accelerator takes that group as it is.
"""

from __future__ import annotations

import contextlib
import os
import threading
from collections.abc import Iterator
from datetime import timedelta

import torch

from trainer.errors import StartupError, print_error_line
from trainer.watchdog import HEARTBEAT, STALL_EXIT_CODE

#: seconds past ``distributed.timeout_s`` before the start-up bound ends a worker that torch
#: did not end itself (torch's own timeouts give the more precise message when they fire)
STARTUP_SLACK_S = 5.0


def launcher_rank() -> str:
    """This worker's rank as the launcher gave it ('?' before any launcher)."""
    return os.environ.get("RANK", "?")


def store_address() -> str:
    return f"{os.environ.get('MASTER_ADDR', '?')}:{os.environ.get('MASTER_PORT', '?')}"


def round_prefix() -> str:
    """The store prefix of this launch round: the restart count names it."""
    return f"trainer/restart-{os.environ.get('TORCHELASTIC_RESTART_COUNT', '0')}"


def in_elastic_round() -> bool:
    """Whether this worker was started by torch's elastic agent, on the agent's shared store."""
    return os.environ.get("TORCHELASTIC_USE_AGENT_STORE") == "True"


def join_elastic_round(cpu: bool, timeout_s: float) -> None:
    """Form the default process group on the agent's store under this round's own prefix.

    Does nothing outside an elastic launch (accelerate then forms the group from env://) or
    when a group exists. The restart count is the same for every worker of a single-node job
    (one agent restarts them all); on several nodes each agent counts its own restarts, see
    the README ("Automatic restarts").
    """
    if not in_elastic_round() or torch.distributed.is_initialized():
        return
    timeout = timedelta(seconds=timeout_s)
    HEARTBEAT.beat(f"connecting to the launcher's store at {store_address()}")
    agent_store = torch.distributed.TCPStore(
        os.environ["MASTER_ADDR"],
        int(os.environ["MASTER_PORT"]),
        int(os.environ["WORLD_SIZE"]),
        is_master=False,
        timeout=timeout,
    )
    store = torch.distributed.PrefixStore(round_prefix(), agent_store)
    backend = "gloo" if cpu else "nccl"
    HEARTBEAT.beat(f"forming the {backend} process group under {round_prefix()} through {store_address()}")
    torch.distributed.init_process_group(
        backend,
        store=store,
        rank=int(os.environ["RANK"]),
        world_size=int(os.environ["WORLD_SIZE"]),
        timeout=timeout,
    )


@contextlib.contextmanager
def startup_bound(timeout_s: float) -> Iterator[None]:
    """Bound the forming of the process group: a failure there, or no group after
    ``timeout_s`` (plus a few seconds for torch's own timeouts to speak first), ends this
    worker with one line naming its rank, the step of start-up and the store's address.

    The stall watchdog cannot cover this: it needs the rank and the output directory that
    the Accelerator and the config give, and it starts after them.
    """

    def expire() -> None:
        print_error_line(
            f"error (rank {launcher_rank()}): start-up did not finish within distributed.timeout_s "
            f"({timeout_s:g} s) while {HEARTBEAT.phase}"
        )
        os._exit(STALL_EXIT_CODE)

    timer = threading.Timer(timeout_s + STARTUP_SLACK_S, expire)
    timer.daemon = True
    HEARTBEAT.beat(f"forming the process group through the store at {store_address()}")
    timer.start()
    try:
        yield
    except RuntimeError as exc:  # torch's DistError and gloo's errors are RuntimeErrors
        if torch.distributed.is_initialized() or int(os.environ.get("WORLD_SIZE", "1")) <= 1:
            raise
        first = next((line.strip() for line in str(exc).splitlines() if line.strip()), type(exc).__name__)
        raise StartupError(
            f"rank {launcher_rank()}: could not form the process group while {HEARTBEAT.phase} "
            f"(store {store_address()}): {first[:300]}"
        ) from None
    finally:
        timer.cancel()
