"""Digests of a checkpoint's files: written once every rank has written its part, checked
before a resume reads any of them, so that a file truncated or changed after it was written
(a disk fault, a partial copy between clusters) is named instead of failing in whichever
library reads it first."""

from __future__ import annotations

import hashlib
import json
import os
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

#: the file beside a checkpoint's others that holds their sizes and digests
DIGESTS_NAME = "digests.json"
#: sha256: the CPUs of this machine's kind hash it in hardware (SHA-NI: 1.5 GB/s on one busy
#: core here, 3x blake2b's and md5's); reads of 16 MB keep the memory of a check flat
ALGORITHM, CHUNK_BYTES = "sha256", 16 * 2**20


def file_digest(path: Path) -> str:
    """The hex digest of one file's bytes."""
    digest = hashlib.new(ALGORITHM)
    with path.open("rb") as f:
        while chunk := f.read(CHUNK_BYTES):
            digest.update(chunk)
    return digest.hexdigest()


def files_of(directory: Path) -> list[Path]:
    """Every file under ``directory`` but the digests themselves, in a fixed order."""
    return sorted(p for p in directory.rglob("*") if p.is_file() and p.name != DIGESTS_NAME)


def digests(paths: list[Path]) -> list[str]:
    """The digests of ``paths``, several files at a time: hashlib lets go of the GIL while it
    hashes, so a checkpoint's model and optimizer files hash on as many cores."""
    with ThreadPoolExecutor(max_workers=max(1, min(len(paths), os.cpu_count() or 1, 8))) as pool:
        return list(pool.map(file_digest, paths))


def write_digests(directory: Path) -> int:
    """Record the size and digest of every file under ``directory``; their bytes in all."""
    paths = files_of(directory)
    record = {
        str(path.relative_to(directory)): {"bytes": path.stat().st_size, ALGORITHM: digest}
        for path, digest in zip(paths, digests(paths), strict=True)
    }
    (directory / DIGESTS_NAME).write_text(json.dumps({"algorithm": ALGORITHM, "files": record}, indent=1))
    return sum(entry["bytes"] for entry in record.values())


def damage(directory: Path) -> str | None:
    """What is wrong with the files of the checkpoint at ``directory``: the first file that
    is missing, of another size or of another digest than when it was written; None when all
    match."""
    digests_file = directory / DIGESTS_NAME
    if not digests_file.is_file():
        return f"{DIGESTS_NAME} is missing"
    try:
        record = json.loads(digests_file.read_text())["files"]
    except (OSError, ValueError, KeyError, TypeError) as exc:
        return f"{DIGESTS_NAME} cannot be read ({type(exc).__name__}: {exc})"
    for name, expected in record.items():  # the cheap checks first: a missing or cut file
        path = directory / name
        if not path.is_file():
            return f"{name} is missing"
        size = path.stat().st_size
        if size != expected["bytes"]:
            cut = " (truncated)" if size < expected["bytes"] else ""
            return f"{name} holds {size} bytes, {expected['bytes']} when written{cut}"
    names = list(record)
    for name, digest in zip(names, digests([directory / name for name in names]), strict=True):
        if digest != record[name][ALGORITHM]:
            return f"{name} does not match its {ALGORITHM} digest: changed since it was written"
    return None
