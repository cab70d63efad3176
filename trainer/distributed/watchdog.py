"""Stall detection: a rank that makes no progress for a bound writes its stacks and exits.

The loop and the collectives feed one process-wide :data:`HEARTBEAT` (the phase, the step,
the last collective entered); a daemon thread checks it. Its clock runs only inside the
trainer's own calls (:meth:`Heartbeat.inside`): a caller that pauses between two ``step()``
calls (a notebook user reading a plot, a benchmark timing something else) is not a stall.
When a rank stalls, its watchdog writes every thread's Python stack to
``OUTPUT/stall-rank{R}.txt``, prints one line and ends the process with exit status 4, so that
the launcher ends the other ranks. A rank frozen from outside (SIGSTOP) cannot report itself;
the ranks waiting for it in a collective do.

The thread needs the GIL: a main thread stuck in C code that keeps it (a C extension's loop)
would stop the watchdog too. Its backstop is faulthandler's timer, which runs on a C thread:
armed from start to close and re-armed by the watchdog at every check, it fires only when the
watchdog itself has not run for :data:`BACKSTOP_FACTOR` times the bound (30 min by default; the
caller's own code between calls meets it only if it keeps the GIL that long); it prints every
thread's stack to stderr and ends the process with exit status 1. faulthandler does not replace
the thread: it cannot stop its clock between the caller's calls without a re-arm (a thread
start, about 0.1 ms) in every call, nor name the phase and the collective, nor end frozen peers.
"""

from __future__ import annotations

import contextlib
import faulthandler
import functools
import os
import signal
import sys
import threading
import time
import traceback
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar

from trainer.contract.errors import print_error_line

STALL_EXIT_CODE = 4
#: faulthandler's backstop fires when the watchdog thread has not run for this many bounds
#: (long_work's own allowance included)
BACKSTOP_FACTOR = 10.0
T = TypeVar("T")


class Heartbeat:
    """What this rank is doing and when it last made progress."""

    def __init__(self) -> None:
        self.last = time.monotonic()
        self.phase = "start-up"
        self.step = 0
        self.collective = "none yet"
        self.allowance = 1.0
        #: how deep the main thread is in the trainer's own calls; 0: the clock is stopped
        self.depth = 0

    def beat(self, phase: str | None = None, step: int | None = None) -> None:
        """Progress was made (optionally in a new phase or step)."""
        self.last = time.monotonic()
        if phase is not None:
            self.phase = phase
        if step is not None:
            self.step = step

    def collective_entered(self, name: str) -> None:
        """Record the collective this rank is about to enter (for the stall report)."""
        self.collective = name
        self.last = time.monotonic()

    @contextlib.contextmanager
    def inside(self, call: str) -> Iterator[None]:
        """One of the trainer's own calls (``start``, ``step``, ``fit``, ...): the clock runs
        from its start to its end; between the outermost calls it is stopped, and the phase
        says so."""
        outermost = self.depth == 0
        if outermost:
            # the clock restarts before the depth says it runs, so the watchdog thread never
            # sees a running clock with the time of the pause on it
            self.beat(call)
        self.depth += 1
        try:
            yield
        finally:
            self.depth -= 1
        if outermost:  # not reached on an error: the phase stays where it failed, for its report
            self.beat(f"the caller's code, after {call}")

    @property
    def running(self) -> bool:
        """Whether the clock runs (the main thread is inside one of the trainer's calls)."""
        return self.depth > 0

    @contextlib.contextmanager
    def long_work(self, phase: str, factor: float = 10.0) -> Iterator[None]:
        """Work that may legitimately run longer than the bound without a beat (a big
        checkpoint write, the first step): the bound is multiplied by ``factor`` meanwhile.
        After a failure the phase stays the one it failed in: the failure's notice names it."""
        previous_phase, previous_allowance = self.phase, self.allowance
        self.beat(phase)
        self.allowance = factor
        try:
            yield
        finally:
            self.allowance = previous_allowance
        self.beat(previous_phase)  # not reached after a failure


HEARTBEAT = Heartbeat()


def watched(method: Callable[..., T]) -> Callable[..., T]:
    """A method that is one of the trainer's own calls: the stall clock runs inside it (see
    :meth:`Heartbeat.inside`)."""

    @functools.wraps(method)
    def call(*args: Any, **kwargs: Any) -> T:
        if HEARTBEAT.running:  # a part of a step, called by the step: the clock runs already
            return method(*args, **kwargs)
        with HEARTBEAT.inside(method.__qualname__):
            return method(*args, **kwargs)

    return call


def stack_report(heartbeat: Heartbeat, rank: int, idle_s: float) -> str:
    """The stall report: what the rank was doing, then every thread's Python stack."""
    names = {thread.ident: thread.name for thread in threading.enumerate()}
    lines = [
        f"rank {rank} pid {os.getpid()} made no progress for {idle_s:.1f} s",
        f"phase: {heartbeat.phase}",
        f"step: {heartbeat.step}",
        f"last collective entered: {heartbeat.collective}",
        "",
    ]
    for ident, frame in sys._current_frames().items():
        lines.append(f"--- thread {names.get(ident, '?')} ({ident}) ---")
        lines.extend(line.rstrip("\n") for line in traceback.format_stack(frame))
        lines.append("")
    return "\n".join(lines)


class Watchdog:
    """A daemon thread that ends this process when :data:`HEARTBEAT` stops for ``limit_s``."""

    def __init__(self, limit_s: float, output_dir: Path, rank: int, heartbeat: Heartbeat = HEARTBEAT) -> None:
        self.limit_s = limit_s
        self.output_dir = output_dir
        self.rank = rank
        self.heartbeat = heartbeat
        #: pids of the other ranks on this host, set once the ranks have met
        self.peers: list[int] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._watch, name="trainer-watchdog", daemon=True)

    def __enter__(self) -> Watchdog:
        if self.limit_s > 0:
            self.heartbeat.beat()
            self._arm_backstop()
            self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join()
        if self.limit_s > 0:
            faulthandler.cancel_dump_traceback_later()

    def _watch(self) -> None:
        period = min(1.0, self.limit_s / 10)
        while not self._stop.wait(period):
            self._arm_backstop()
            # running is read before the time: a call that says it runs has restarted the clock
            if not self.heartbeat.running:
                continue
            idle = time.monotonic() - self.heartbeat.last
            if idle > self.limit_s * self.heartbeat.allowance:
                self._report_and_exit(idle)

    def _arm_backstop(self) -> None:
        if sys.__stderr__ is not None:  # None in a process started without a stderr (pythonw)
            bound = self.limit_s * max(BACKSTOP_FACTOR, 2 * self.heartbeat.allowance)
            faulthandler.dump_traceback_later(bound, exit=True, file=sys.__stderr__)

    def _report_and_exit(self, idle: float) -> None:
        path = self.output_dir / f"stall-rank{self.rank}.txt"
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(stack_report(self.heartbeat, self.rank, idle))
            where = f"stacks in {path}"
        except OSError as exc:
            where = f"could not write {path}: {exc}"
        print_error_line(
            f"error (rank {self.rank}): stalled for {idle:.0f} s (distributed.watchdog_s) in "
            f"{self.heartbeat.phase} at step {self.heartbeat.step}, last collective "
            f"{self.heartbeat.collective}; {where}"
        )
        self._kill_frozen_peers()
        os._exit(STALL_EXIT_CODE)

    def _kill_frozen_peers(self) -> None:
        """SIGKILL the ranks of this host that are frozen (stopped): they cannot obey the
        launcher's SIGTERM, and torch's launcher waits 30 s before its SIGKILL. Running peers
        are left to report their own stall and to the launcher."""
        time.sleep(min(2.0, self.limit_s / 2))  # let running peers write their reports first
        for pid in self.peers:
            if _is_frozen_sibling(pid):
                with contextlib.suppress(OSError):
                    os.kill(pid, signal.SIGKILL)


def _is_frozen_sibling(pid: int) -> bool:
    """Whether ``pid`` is a stopped process with the same parent (launcher) as this one."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return False
    state, parent = fields[0], int(fields[1])
    return state in ("T", "t") and parent == os.getppid()
