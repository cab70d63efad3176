"""Forming the process group: a key space of its own for each launcher round (the ranks agree
on its name first, :func:`agree_on_round`), one device for every rank, and a bound on how long
start-up may take. Why each (the elastic agent's one store for every round, the per-agent
restart counts): docs/RELIABILITY.md, "Restarts"."""

from __future__ import annotations

import contextlib
import os
import socket
import threading
import time
import uuid
from collections.abc import Iterator
from datetime import timedelta

import torch

from trainer.contract.devices import DEVICES
from trainer.contract.errors import ConfigError, StartupError, print_error_line
from trainer.distributed.watchdog import HEARTBEAT, STALL_EXIT_CODE

#: seconds past ``distributed.timeout_s`` before the start-up bound ends a worker that torch
#: did not end itself (torch's own timeouts give the more precise message when they fire)
STARTUP_SLACK_S = 5.0


def launcher_rank() -> str:
    """This worker's rank as the launcher gave it ('?' before any launcher)."""
    return os.environ.get("RANK", "?")


def launched_job() -> bool:
    """Whether a launcher started this process as one of several (``WORLD_SIZE`` > 1)."""
    return int(os.environ.get("WORLD_SIZE", "1")) > 1


def store_address() -> str:
    return f"{os.environ.get('MASTER_ADDR', '?')}:{os.environ.get('MASTER_PORT', '?')}"


#: the round's name every rank of this process's group agreed on (see :func:`agree_on_round`)
ROUND_NAME: str | None = None
#: keys of the round agreement on the launcher's store
ROUND_KEYS = "trainer/rounds"
#: seconds between two reads of the store while the ranks agree on the round
ROUND_POLL_S = 0.01


def round_prefix() -> str:
    """The store prefix of this launch round: the name its ranks agreed on."""
    return f"trainer/round-{ROUND_NAME}"


def agree_on_round(store: torch.distributed.Store, rank: int, world_size: int, timeout_s: float) -> str:
    """A name for this round of workers: the same on every rank, new in every round.

    Rank 0 draws it and hands it to each rank in answer to a question that only this round's
    process of that rank can ask (a random token): the store may still hold an earlier round's
    questions and answers (the workers of a round are all gone before the next round starts,
    but their keys stay), and an answer to another token is never taken. Rank 0 answers each
    new question it reads until every rank has confirmed, under the new name, that it has it.
    """
    deadline = time.monotonic() + timeout_s

    def wait_a_little(what: str) -> None:
        if time.monotonic() > deadline:
            raise StartupError(f"rank {rank}: no agreement on the launch round within {timeout_s:g} s ({what})")
        time.sleep(ROUND_POLL_S)

    if rank == 0:
        name = uuid.uuid4().hex
        answered: dict[int, bytes] = {}
        unconfirmed = set(range(1, world_size))
        while unconfirmed:
            for peer in sorted(unconfirmed):
                if store.check([f"{ROUND_KEYS}/{name}/has/{peer}"]):
                    unconfirmed.discard(peer)
                elif store.check([f"{ROUND_KEYS}/question/{peer}"]):
                    question = store.get(f"{ROUND_KEYS}/question/{peer}")
                    if answered.get(peer) != question:
                        store.set(f"{ROUND_KEYS}/answer/{peer}", question + b" " + name.encode())
                        answered[peer] = question
            if unconfirmed:
                wait_a_little(f"waiting for rank(s) {', '.join(map(str, sorted(unconfirmed)))}")
        return name
    question = uuid.uuid4().hex
    store.set(f"{ROUND_KEYS}/question/{rank}", question)
    while True:
        if store.check([f"{ROUND_KEYS}/answer/{rank}"]):
            asked, _, name = store.get(f"{ROUND_KEYS}/answer/{rank}").decode().partition(" ")
            if asked == question:
                store.set(f"{ROUND_KEYS}/{name}/has/{rank}", "1")
                return name
        wait_a_little("waiting for rank 0")


def local_device(device: str) -> bool:
    """Whether ``--device`` means the CPU in this process, from this process's view alone (a
    run of one process; a launched job agrees on it, see :func:`agree_on_device`)."""
    if device == "cpu":
        return True
    if device == "cuda":
        if not torch.cuda.is_available():
            raise ConfigError("--device cuda: no CUDA device is available on this machine")
        return False
    if device == "auto":
        return not torch.cuda.is_available()
    raise ConfigError(f"--device {device}: expected auto, cpu or cuda")


def agree_on_device(device: str, store: torch.distributed.Store, rank: int, world_size: int) -> bool:
    """Whether every rank runs on the CPU (gloo) rather than CUDA (NCCL): one answer for all.

    Each rank posts whether it sees a CUDA device and reads every other rank's, before the
    group forms, since the backend is chosen from it. Under ``auto`` a job whose nodes differ
    (a node with broken CUDA) would otherwise form half a gloo group and half an NCCL one,
    which never meet; it is refused on every rank instead, as ``cuda`` is on a rank without it.
    """
    if device not in DEVICES:
        raise ConfigError(f"--device {device}: expected auto, cpu or cuda")
    store.set(f"device/{rank}", f"{int(torch.cuda.is_available())} {socket.gethostname()}")
    keys = [f"device/{peer}" for peer in range(world_size)]
    store.wait(keys)
    seen = [store.get(key).decode().split(" ", 1) for key in keys]
    without = [(peer, host) for peer, (cuda, host) in enumerate(seen) if cuda == "0"]
    if device == "cpu" or (device == "auto" and len(without) == world_size):
        return True
    if not without:
        return False
    ranks = ", ".join(str(peer) for peer, _ in without)
    hosts = ", ".join(sorted({host for _, host in without}))
    others = "" if len(without) == world_size else " while the others do, and the ranks must share one backend"
    error = ConfigError(
        f"--device {device}: rank(s) {ranks} (host {hosts}) have no usable CUDA device{others}; "
        "fix CUDA there, or pass --device cpu to train every rank on the CPU"
    )
    error.agreed = True  # every rank read the same keys
    raise error


def form_process_group(device: str, timeout_s: float) -> bool:
    """Form the default process group of a launched job (WORLD_SIZE > 1) on the launcher's store,
    under this round's own prefix, on the backend every rank agreed on; returns whether that is
    the CPU's. The Accelerator then takes the group as it is.

    The store is torch's env:// one: the elastic agent's store under ``torchrun`` and
    ``accelerate launch``, else one hosted by rank 0. When a group exists (a later run of a
    pipeline) its backend decides; outside a launched job, this process's view of ``--device``.
    """
    if torch.distributed.is_initialized():  # agreed when it formed: its backend says
        return torch.distributed.get_backend() == "gloo"
    if not launched_job():
        return local_device(device)
    timeout = timedelta(seconds=timeout_s)
    HEARTBEAT.beat(f"connecting to the launcher's store at {store_address()}")
    launcher_store, rank, world_size = next(torch.distributed.rendezvous("env://", timeout=timeout))
    HEARTBEAT.beat(f"agreeing on the launch round through {store_address()}")
    global ROUND_NAME
    ROUND_NAME = agree_on_round(launcher_store, rank, world_size, timeout_s)
    store = torch.distributed.PrefixStore(round_prefix(), launcher_store)
    HEARTBEAT.beat(f"agreeing on the device through {store_address()}")
    cpu = agree_on_device(device, store, rank, world_size)
    backend = "gloo" if cpu else "nccl"
    HEARTBEAT.beat(f"forming the {backend} process group under {round_prefix()} through {store_address()}")
    torch.distributed.init_process_group(backend, store=store, rank=rank, world_size=world_size, timeout=timeout)
    return cpu


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
    HEARTBEAT.beat(f"forming the process group at {store_address()}" if launched_job() else "start-up")
    timer.start()
    try:
        yield
    except RuntimeError as exc:  # torch's DistError and gloo's errors are RuntimeErrors
        if torch.distributed.is_initialized() or not launched_job():
            raise
        first = next((line.strip() for line in str(exc).splitlines() if line.strip()), type(exc).__name__)
        raise StartupError(
            f"rank {launcher_rank()}: could not form the process group while {HEARTBEAT.phase} "
            f"(store {store_address()}): {first[:300]}"
        ) from None
    finally:
        timer.cancel()
