"""The stop signals of a run: SIGTERM and SIGINT ask every rank for an agreed stop at the end
of the step (a checkpoint, then exit), as a preemption or a Ctrl-C needs."""

from __future__ import annotations

import contextlib
import signal
from typing import Any

from trainer.distributed import peer_watch


class StopSignals:
    """While inside: SIGTERM and SIGINT ask for an agreed stop (:attr:`received` names the
    signal); a second SIGINT interrupts at once. In a launched job the watch thread sees the
    signals too, so a rank that cannot reach the agreed stop (blocked on a peer) exits after
    ``distributed.stop_grace_s``. Off the main thread signals are left to the host."""

    def __init__(self) -> None:
        self.received: str | None = None
        self._previous: dict[int, Any] = {}
        self._seen = contextlib.ExitStack()

    def _request_stop(self, signum: int, frame: Any) -> None:
        if signum == signal.SIGINT and self.received:
            raise KeyboardInterrupt
        self.received = signal.Signals(signum).name

    def __enter__(self) -> StopSignals:
        self.received = None
        for signum in peer_watch.STOP_SIGNALS:
            try:
                self._previous[signum] = signal.signal(signum, self._request_stop)
            except ValueError:  # not the main thread
                pass
        if self._previous and peer_watch.WATCH is not None:
            self._seen.enter_context(peer_watch.WATCH.stop_signals_seen())
        return self

    def __exit__(self, *exc: object) -> None:
        self._seen.close()
        for signum, handler in self._previous.items():
            signal.signal(signum, handler)
        self._previous = {}
