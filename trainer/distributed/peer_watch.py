"""What a rank must learn even while it is blocked in a collective: a peer failed (the failing
rank posts a notice on the launcher's store; a daemon thread on every rank reads it), a peer
ended without a notice (the store's loss), or a stop signal came and the agreed stop cannot be
reached (the signal's wake-up pipe, read by the same thread). Why a collective cannot carry
this news, and how each outcome comes about: docs/RELIABILITY.md."""

from __future__ import annotations

import atexit
import contextlib
import os
import select
import signal
import socket
import threading
import time
from collections.abc import Callable, Iterator
from datetime import timedelta

from trainer.contract.errors import UserError, print_error_line
from trainer.distributed.process_group import round_prefix
from trainer.distributed.watchdog import HEARTBEAT

#: how often the notice board is read (seconds)
POLL_S = 0.5
#: how long a failing rank waits for the others to read its notice before it exits (its
#: process may host the store)
READ_WAIT_S = 5.0
#: exit status of a rank that could not reach the agreed stop in time
STOP_TIMEOUT_EXIT_CODE = 1
#: exit status of a rank whose peer ended without a notice
PEER_LOST_EXIT_CODE = 1
#: seconds a rank that lost the store waits for its own run to end before it reports the loss:
#: at the end of a run the store's host may exit while this rank is still closing
LOST_STORE_GRACE_S = 2.0
#: how long closing waits for the watch thread: it may be inside a store call to a slow server,
#: and a daemon thread that returns from torch while the interpreter finalizes aborts the
#: process ("terminate called without an active exception") in place of its exit status. A
#: call to a server that never answers stays blocked and is harmless at exit.
CLOSE_WAIT_S = 30.0
#: what torch's and gloo's errors say when the other end of a connection is gone
LOST_CONNECTION = ("Connection closed by peer", "Connection reset by peer", "Broken pipe", "Connection refused")
FAILURE_KEY = "failure"
READ_KEY = "failure-read"
STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT)
#: set by accelerate's debug_launcher: the file its process group rendezvoused on
DEBUG_RENDEZVOUS_FILE = "ACCELERATE_DEBUG_RDV_FILE"


def _connect(timeout_s: float):
    """A client of the store the launcher gave (MASTER_ADDR/MASTER_PORT), under this round's
    prefix; None outside a launched job."""
    import torch.distributed as dist

    if os.environ.get(DEBUG_RENDEZVOUS_FILE):
        # accelerate's debug_launcher forms the group on a FileStore and sets MASTER_PORT to a
        # port nobody serves: a TCP client would wait there until its timeout. The group's own
        # store is that file (torch has no public accessor for it; FileStore is thread-safe).
        store = dist.distributed_c10d._get_default_store()
    elif "MASTER_ADDR" in os.environ and "MASTER_PORT" in os.environ:
        store = dist.TCPStore(
            os.environ["MASTER_ADDR"],
            int(os.environ["MASTER_PORT"]),
            is_master=False,
            timeout=timedelta(seconds=timeout_s),
        )
    else:
        return None
    return dist.PrefixStore(f"{round_prefix()}/notices", store)


def _sentinel(timeout_s: float) -> socket.socket | None:
    """A plain connection to the store's server that carries nothing: it reads as closed once
    the server's process is gone (a rank's, or a node's agent), which tells this rank without a
    store call. A store call on a dead connection prints torch's C++ warning with twenty stack
    frames before it raises. None where the store is not a TCP server."""
    if os.environ.get(DEBUG_RENDEZVOUS_FILE) or "MASTER_ADDR" not in os.environ or "MASTER_PORT" not in os.environ:
        return None
    try:
        sock = socket.create_connection((os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"])), timeout_s)
    except (OSError, ValueError):
        return None
    sock.setblocking(False)
    return sock


class PeerWatch:
    """The notice board of a launched job and the thread that watches it and the stop signals.

    Started on every rank once the process group exists; ended by :func:`close_watch` (from
    ``world.end_process_group``) or the process's exit.
    """

    def __init__(self, rank: int, world_size: int, stop_grace_s: float, timeout_s: float) -> None:
        self.rank, self.world_size = rank, world_size
        self.stop_grace_s = stop_grace_s
        self.store = _connect(timeout_s) if world_size > 1 else None
        self.sentinel = _sentinel(timeout_s) if self.store is not None else None
        self.failing = False  # this rank is reporting its own failure: other notices are moot
        #: a run is in progress on this rank (between Trainer.start and close): a store that
        #: goes away then means a peer was lost
        self.armed = False
        self._said = threading.Lock()  # one line of a lost peer, from either thread
        self.stop_since: float | None = None
        self.stop_signal = ""
        self._read_fd, self._write_fd = os.pipe()
        os.set_blocking(self._write_fd, False)
        self._closing = threading.Event()
        self._thread = threading.Thread(target=self._watch, name="trainer-peer-watch", daemon=True)
        self._thread.start()

    # -- a rank whose main thread fails ---------------------------------------------------------
    def report_failure(self, exc: BaseException, announce: Callable[[], None]) -> int | None:
        """Called where an error ends this rank's run. If another rank failed first (this
        error is then the consequence, e.g. gloo's closed socket), print one line naming it and
        return its exit status. Else ``announce`` this rank's error (its line or traceback)
        first, since the others exit once they read the notice and the launcher then ends this
        rank, then post the notice and return None."""
        self.failing = True
        if lost_peer(exc):
            # A peer's connection closed. Had it posted a notice, it would have waited for every
            # rank to read it before exiting, and this rank's watch thread, reading it, would
            # have ended this process: so it died without a word (SIGKILL, the OOM killer, a
            # lost node). No store call: a lost node may take the store's host with it, and a
            # call to a dying server prints torch's C++ warning. Not posted either: every other
            # survivor sees the loss and says it itself.
            self.say_peer_lost()
            return PEER_LOST_EXIT_CODE
        notice = None if self._store_gone() else self._notice()
        if notice is not None and int(notice[0]) != self.rank:
            self._obey(notice)
            return int(notice[1])
        announce()
        self._post(exc)
        return None

    def _post(self, exc: BaseException) -> None:
        """Tell every other rank that this one failed, and why; wait (a few seconds at most)
        until they have read it."""
        if self._store_gone():
            return
        code = exc.exit_code if isinstance(exc, UserError) else 1
        text = " ".join(str(exc).split())[:300] or "(no message)"
        notice = f"{self.rank}\t{code}\t{HEARTBEAT.phase}\t{type(exc).__name__}: {text}"
        with contextlib.suppress(Exception):  # the store may be gone with its host
            self.store.compare_set(FAILURE_KEY, "", notice)
            deadline = time.monotonic() + READ_WAIT_S
            while self.store.add(READ_KEY, 0) < self.world_size - 1 and time.monotonic() < deadline:
                time.sleep(0.05)

    # -- every rank ---------------------------------------------------------------------------
    @contextlib.contextmanager
    def stop_signals_seen(self) -> Iterator[None]:
        """While inside, stop signals also reach this thread through the wake-up pipe (the
        main thread's handlers stay as they are). Main thread only."""
        previous = signal.set_wakeup_fd(self._write_fd, warn_on_full_buffer=False)
        try:
            yield
        finally:
            signal.set_wakeup_fd(previous)
            self.stop_since = None

    def close(self) -> None:
        """Stop the thread and let go of the store before the process group ends, so that no
        thread is inside a store call while the interpreter tears the process down (see
        :data:`CLOSE_WAIT_S`)."""
        self._closing.set()
        with contextlib.suppress(OSError):
            os.write(self._write_fd, b"\0")  # wakes the select at once
        self._thread.join(timeout=CLOSE_WAIT_S)
        self.store = None
        if self.sentinel is not None:
            self.sentinel.close()
            self.sentinel = None
        if not self._thread.is_alive():
            os.close(self._read_fd)
            os.close(self._write_fd)

    def _watch(self) -> None:
        while not self._closing.is_set():
            sentinel = [self.sentinel] if self.store is not None and self.sentinel is not None else []
            ready, _, _ = select.select([self._read_fd, *sentinel], [], [], POLL_S)
            if self._closing.is_set():
                return
            if self._read_fd in ready:
                self._read_signals()
            if sentinel and sentinel[0] in ready and not self.failing:
                self._store_lost()
            if self.stop_since is not None and time.monotonic() - self.stop_since > self.stop_grace_s:
                print_error_line(
                    f"error (rank {self.rank}): {self.stop_signal} received {self.stop_grace_s:g} s ago "
                    f"(distributed.stop_grace_s) and the agreed stop not reached: blocked in {HEARTBEAT.phase}, "
                    f"last collective {HEARTBEAT.collective}; exiting"
                )
                os._exit(STOP_TIMEOUT_EXIT_CODE)
            if self.store is not None and not self.failing:
                self._read_notice()

    def _read_signals(self) -> None:
        for number in os.read(self._read_fd, 64):
            if number in STOP_SIGNALS and self.stop_since is None and self.stop_grace_s > 0:
                self.stop_since, self.stop_signal = time.monotonic(), signal.Signals(number).name

    def say_peer_lost(self) -> None:
        """Print, once per process, the line of a peer that ended without a notice."""
        if self._said.acquire(blocking=False):
            print_error_line(
                f"error (rank {self.rank}): a peer ended without a notice (killed or lost) while this rank "
                f"was in {HEARTBEAT.collective} ({HEARTBEAT.phase}) at step {HEARTBEAT.step}"
            )

    def _store_gone(self) -> bool:
        """Whether the store is known to be unreachable (none, or its server gone: the sentinel
        reads as closed; the server never writes to it otherwise)."""
        if self.store is None:
            return True
        if self.sentinel is None:
            return False
        readable, _, _ = select.select([self.sentinel], [], [], 0)
        return bool(readable)

    def _notice(self) -> list[str] | None:
        """The posted failure: rank, exit status, phase, error (None when there is none, or
        when the store is gone)."""
        try:
            return self._read_board()
        except Exception:
            return None

    def _read_board(self) -> list[str] | None:
        """:meth:`_notice`, raising when the store cannot be reached."""
        if self.store is None or not self.store.check([FAILURE_KEY]):
            return None
        return self.store.get(FAILURE_KEY).decode().split("\t", 3)

    def _store_lost(self) -> None:
        """The store's host (a rank's process, or the agent of a node) is gone without a notice.
        During a run that is a lost peer: this rank says so and exits, unless its run ends
        within LOST_STORE_GRACE_S (then the host simply finished first). The store is not read
        again either way."""
        self.store = None
        deadline = time.monotonic() + LOST_STORE_GRACE_S
        while self.armed and time.monotonic() < deadline and not self._closing.is_set():
            time.sleep(0.05)
        if self.armed and not self.failing and not self._closing.is_set():
            self.say_peer_lost()
            os._exit(PEER_LOST_EXIT_CODE)

    def _obey(self, notice: list[str]) -> None:
        rank, _, phase, error = notice
        print_error_line(f"error (rank {self.rank}): rank {rank} failed in {phase}: {error}")
        if not self._store_gone():
            with contextlib.suppress(Exception):
                self.store.add(READ_KEY, 1)

    def _read_notice(self) -> None:
        try:
            notice = self._read_board()
        except Exception:
            self._store_lost()
            return
        if notice is None or int(notice[0]) == self.rank or self.failing:
            return
        self._obey(notice)
        os._exit(int(notice[1]))


#: this process's watch, once a launched job's process group exists
WATCH: PeerWatch | None = None


def start_watch(rank: int, world_size: int, stop_grace_s: float, timeout_s: float) -> PeerWatch:
    """The process's :class:`PeerWatch`, started on first use (a process may run several fits)."""
    global WATCH
    if WATCH is None:
        WATCH = PeerWatch(rank, world_size, stop_grace_s, timeout_s)
        # a process that exits without end_process_group (a launcher's child, a script of the
        # user's) still ends the thread before the interpreter finalizes
        atexit.register(close_watch)
    WATCH.stop_grace_s = stop_grace_s
    return WATCH


@contextlib.contextmanager
def run_in_progress() -> Iterator[None]:
    """While inside (a run on this rank), a notice board that goes away means a lost peer."""
    if WATCH is None:
        yield
        return
    WATCH.armed = True
    try:
        yield
    finally:
        WATCH.armed = False


def lost_peer(exc: BaseException) -> bool:
    """Whether ``exc`` is a collective's or a store's error because the other end is gone."""
    # torch.distributed's DistError is a RuntimeError, as gloo's errors are
    return isinstance(exc, RuntimeError) and any(words in str(exc) for words in LOST_CONNECTION)


def close_watch() -> None:
    """End this process's watch, if any (see :meth:`PeerWatch.close`)."""
    global WATCH
    if WATCH is not None:
        WATCH.close()
        WATCH = None
        atexit.unregister(close_watch)


def report_failure(exc: BaseException, announce: Callable[[], None]) -> int | None:
    """See :meth:`PeerWatch.report_failure` (in a process without a watch: ``announce``, None)."""
    if WATCH is None:
        announce()
        return None
    return WATCH.report_failure(exc, announce)
