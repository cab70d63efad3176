"""What a run prints: the trainer's log lines, with time and source, in a terminal, a log
file or a notebook."""

from __future__ import annotations

import contextlib
import logging
import os
import sys
from collections.abc import Iterator


def configure_logging() -> None:
    """INFO lines with time and source; the trainer's own "saved ..." line stands for the
    per-file lines of Accelerate's checkpointing, and transformers' bars stay off (see
    :func:`quiet_transformers`)."""
    logging.basicConfig(format="%(asctime)s %(levelname)s %(name)s: %(message)s", level=logging.INFO)
    for name in ("accelerate.checkpointing", "accelerate.accelerator"):
        logging.getLogger(name).setLevel(logging.WARNING)
    quiet_transformers()
    # No bar per map and filter of every rank; read when datasets is imported, which costs
    # 2 s that a run without a text recipe need not pay.
    os.environ.setdefault("HF_DATASETS_DISABLE_PROGRESS_BARS", "1")


def quiet_transformers() -> None:
    """transformers' progress bars off (a load and a save bar on every rank) where transformers
    is loaded. Importing it costs 0.8 s of CPU in every process, which a run whose models are
    plain torch need not pay: the loop calls this again once the task's module is imported,
    before the models are read."""
    if "transformers" in sys.modules:
        from transformers.utils import logging as transformers_logging

        transformers_logging.disable_progress_bar()


def ensure_logging() -> None:
    """:func:`configure_logging` when nothing has set logging up yet (a script or a notebook
    that calls the Python API): the trainer's INFO lines show there as on the command line.
    Logging that the caller set up is left as it is."""
    if not logging.getLogger().handlers:
        configure_logging()


@contextlib.contextmanager
def without_log_records(logger_name: str, *texts: str) -> Iterator[list[logging.LogRecord]]:
    """While inside, records of ``logger_name`` whose message contains one of ``texts`` are
    dropped (a library's notice that says nothing a user can act on, or one the trainer says
    in its own words); the list it yields holds them."""
    dropped: list[logging.LogRecord] = []

    def keep(record: logging.LogRecord) -> bool:
        if any(text in record.getMessage() for text in texts):
            dropped.append(record)
            return False
        return True

    source = logging.getLogger(logger_name)
    source.addFilter(keep)
    try:
        yield dropped
    finally:
        source.removeFilter(keep)
