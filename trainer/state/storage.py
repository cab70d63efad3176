"""Faults of the disk a run writes to (full, read-only, gone) told as one line that names the
path, the space left and what is kept, instead of the traceback of whichever library was
writing: torch's zip writer reports a full disk as ``unexpected pos N vs M``, safetensors as an
``IoError`` in its message, neither with an errno."""

from __future__ import annotations

import contextlib
import errno
import os
import shutil
from collections.abc import Callable, Iterator
from pathlib import Path

from trainer.contract.errors import UserError
from trainer.distributed import sharding

#: below this many bytes free after a failed write, the write is taken to have filled the disk
#: (a write that fails for another reason leaves the disk as it found it, rarely this full)
FULL_BELOW_BYTES = 2**20
NO_SPACE = {errno.ENOSPC, errno.EDQUOT}


class StorageError(UserError):
    """The output directory cannot be written: its disk is full, read-only or gone (exit
    status 2, as for bad input: the directory is the user's to mend)."""


def existing_ancestor(path: Path) -> Path:
    """``path`` or its nearest ancestor that exists (what the disk's figures are read from)."""
    path = path.absolute()
    while not path.exists() and path != path.parent:
        path = path.parent
    return path


def free_mb(path: Path) -> float:
    """The space left to this user on the disk that holds ``path``, in MB."""
    return shutil.disk_usage(existing_ancestor(path)).free / 2**20


def distributed_checkpoint_errors() -> tuple[type[BaseException], ...]:
    """The error of torch's distributed checkpoint (a BaseException that gathers each rank's)
    once a sharded run has imported it; before, none can be raised."""
    module = sharding.imported("torch.distributed.checkpoint")
    return (module.CheckpointException,) if module else ()


def os_errors(exc: BaseException) -> Iterator[OSError]:
    """The OSErrors with an errno among ``exc``, the exceptions it was raised from, and each
    rank's error a distributed checkpoint (FSDP2's) gathered into its CheckpointException."""
    seen: set[int] = set()
    pending = [exc]
    while pending:
        exc = pending.pop(0)
        if exc is None or id(exc) in seen:
            continue
        seen.add(id(exc))
        if isinstance(exc, OSError) and exc.errno is not None:
            yield exc
        if isinstance(exc, distributed_checkpoint_errors()):
            pending.extend(failure for failure, _ in exc.failures.values())
        pending.append(exc.__cause__ or exc.__context__)


def fault(exc: BaseException, path: Path, root: Path) -> str | None:
    """What storage fault ``exc``, raised while writing ``path`` of the run in ``root``, is, in
    words; None when it is none (a bug, bad input), to be raised as it is."""
    codes = {error.errno for error in os_errors(exc)}
    if codes & NO_SPACE:
        return "no space left on the device"
    if errno.EROFS in codes:
        return "the output directory is read-only"
    if codes & {errno.EACCES, errno.EPERM}:
        return "permission denied"
    if not root.is_dir():
        return "the output directory is gone"
    if not os.access(existing_ancestor(path), os.W_OK):
        return "the output directory is read-only or not writable"
    if shutil.disk_usage(existing_ancestor(path)).free < FULL_BELOW_BYTES:
        return "no space left on the device"
    return None


def write_whole(path: Path, text: str) -> None:
    """Replace the file at ``path`` with ``text`` whole: written beside it, then renamed, so a
    disk that fills meanwhile leaves the old file as it was."""
    partial = path.with_name(f".partial-{path.name}")
    try:
        partial.write_text(text)
    except OSError as exc:
        with contextlib.suppress(OSError):  # a read-only disk refuses this too
            partial.unlink(missing_ok=True)
        raise OSError(exc.errno, exc.strerror, str(path)) from exc  # the file the caller knows
    partial.replace(path)


@contextlib.contextmanager
def writing(path: Path, root: Path, kept: Callable[[], str]) -> Iterator[None]:
    """Turn a storage fault while the block writes ``path`` (of the run in ``root``) into a
    StorageError of one line: the fault, the path, the space left and ``kept()`` (what a
    resume has: the last complete checkpoint). Other errors pass unchanged."""
    try:
        yield
    except UserError:
        raise
    except BaseException as exc:
        if not isinstance(exc, (Exception, *distributed_checkpoint_errors())):
            raise  # KeyboardInterrupt, SystemExit
        what = fault(exc, path, root)
        if what is None:
            raise
        # the file itself where the error names it (an OSError's filename), else the block's path
        named = next((Path(e.filename) for e in os_errors(exc) if e.filename), path)
        raise StorageError(f"{what} writing {named} ({free_mb(named):.1f} MB free); {kept()}") from exc
