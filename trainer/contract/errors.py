"""Errors that end a run with one clear line instead of a traceback."""

from __future__ import annotations

import sys

from tqdm import tqdm


def print_error_line(line: str) -> None:
    """Write one line to stderr in a single write, so that lines of several ranks sharing the
    launcher's stderr do not interleave, on a line of its own even under a progress bar."""
    # nolock: the watchdog thread calls this while the main thread may hold tqdm's lock.
    with tqdm.external_write_mode(file=sys.stderr, nolock=True):
        sys.stderr.write(line.replace("\n", " ") + "\n")  # print() writes the newline separately
        sys.stderr.flush()


class UserError(Exception):
    """Bad input from the user (config, data, checkpoint): reported as one line, exit status 2."""

    exit_code = 2
    #: set when every rank is known to fail with this error at the same point of the run
    agreed = False


class ConfigError(UserError):
    """A config file, a model config or a ``--set`` override is wrong."""


class DataError(UserError):
    """A data file cannot be used (missing, unreadable, a bad row)."""


class CheckpointError(UserError):
    """A checkpoint or initial weights file cannot be used."""


class NonFiniteError(UserError):
    """Training produced non-finite gradients and the policy (or the bound on skips) says stop."""

    exit_code = 3


class StartupError(UserError):
    """The process group could not form (a peer or the launcher's store unreachable)."""

    exit_code = 1
