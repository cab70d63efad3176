"""Storage faults told as one line: what counts as one, and that a failed write keeps what was
whole before it. The runs on a full, read-only or removed disk in 1 and 2 processes are rows of
the fault matrix (harness/faultmatrix/storage_faults.py)."""

from __future__ import annotations

import errno
import json
import shutil
from collections import namedtuple
from pathlib import Path
from types import SimpleNamespace

import pytest

from trainer.state import checkpoint, exports, storage
from trainer.state.storage import StorageError
from trainer.training.metrics import MetricsLog

Usage = namedtuple("Usage", "total used free")


def raised(exc: Exception, path: Path, root: Path) -> BaseException:
    """What leaves storage.writing when the block raises ``exc``."""
    with (
        pytest.raises(BaseException) as caught,
        storage.writing(path, root, lambda: "the last complete checkpoint is X"),
    ):
        raise exc
    return caught.value


def test_what_counts_as_a_storage_fault(tmp_path, monkeypatch):
    target = tmp_path / "checkpoints" / ".partial-step-0000002"
    full = raised(OSError(errno.ENOSPC, "No space left on device", str(target / "optimizer.bin")), target, tmp_path)
    assert isinstance(full, StorageError)
    assert str(full).startswith(f"no space left on the device writing {target / 'optimizer.bin'} (")
    assert str(full).endswith(" MB free); the last complete checkpoint is X")
    read_only = raised(OSError(errno.EROFS, "Read-only file system"), target, tmp_path)
    assert str(read_only).startswith(f"the output directory is read-only writing {target} (")
    # torch's zip writer: no errno; the disk it left full says what happened
    cut = RuntimeError("[enforce fail at inline_container.cc:672] . unexpected pos 3221248 vs 3221136")
    assert raised(cut, target, tmp_path) is cut  # plenty of space: not a storage fault, raised as it is
    monkeypatch.setattr(shutil, "disk_usage", lambda path: Usage(10 * 2**20, 10 * 2**20 - 4096, 4096))
    assert str(raised(cut, target, tmp_path)).startswith(f"no space left on the device writing {target} (0.0 MB free)")
    gone = raised(FileNotFoundError(errno.ENOENT, "No such file"), tmp_path / "nowhere" / "x", tmp_path / "nowhere")
    assert str(gone).startswith("the output directory is gone writing")


def test_a_bug_is_not_a_storage_fault(tmp_path):
    bug = ValueError("a bug")
    assert raised(bug, tmp_path / "x", tmp_path) is bug


def fail_writes(monkeypatch, after: int) -> None:
    """Path.write_text writes ``after`` characters, then fails as a full disk does."""

    def write_text(self, text, *args, **kwargs):
        with open(self, "w") as handle:
            handle.write(text[:after])
        raise OSError(errno.ENOSPC, "No space left on device", str(self))

    monkeypatch.setattr(Path, "write_text", write_text)


def test_a_file_rewritten_on_a_full_disk_stays_as_it_was(tmp_path, monkeypatch):
    path = tmp_path / "config.yaml"
    path.write_text("whole: true\n")
    fail_writes(monkeypatch, after=3)
    with pytest.raises(OSError, match="No space left") as caught:
        storage.write_whole(path, "replacement: true\n")
    assert caught.value.filename == str(path)
    assert path.read_text() == "whole: true\n" and sorted(p.name for p in tmp_path.iterdir()) == ["config.yaml"]


def test_a_resume_drops_the_record_a_full_disk_cut(tmp_path):
    records = [{"step": 1, "split": "train"}, {"step": 2, "split": "train"}, {"step": 3, "split": "train"}]
    text = "".join(json.dumps(r) + "\n" for r in records)
    (tmp_path / "metrics.jsonl").write_text(text + '{"step": 4, "spl')
    accelerator = SimpleNamespace(is_main_process=True, num_processes=1)
    MetricsLog(accelerator, tmp_path, resumed_step=2)
    lines = (tmp_path / "metrics.jsonl").read_text().splitlines()
    assert [json.loads(line) for line in lines] == records[:2]


def test_an_export_that_fails_keeps_the_published_directory(tmp_path, monkeypatch):
    best = tmp_path / "best" / "generator"
    best.mkdir(parents=True)
    (best / "model.safetensors").write_bytes(b"the published weights")

    def write(partial: Path) -> None:
        partial.mkdir()
        (partial / "model.safetensors").write_bytes(b"half")
        raise OSError(errno.ENOSPC, "No space left on device")

    with pytest.raises(OSError):
        exports.publish(best, write, None)
    assert sorted(p.name for p in best.parent.iterdir()) == ["generator"]
    assert (best / "model.safetensors").read_bytes() == b"the published weights"


def test_the_space_check_before_a_checkpoint(tmp_path, monkeypatch):
    with pytest.raises(StorageError, match=f"the output directory {tmp_path / 'gone'} is gone"):
        checkpoint.check_space(tmp_path / "gone")
    checkpoint.check_space(tmp_path)  # no checkpoint yet: nothing to measure the next one by
    last = tmp_path / "checkpoints" / "step-0000004"
    last.mkdir(parents=True)
    (last / checkpoint.STATE_NAME).write_text("{}")
    (last / "model.safetensors").write_bytes(bytes(3 * 2**20 - 2))
    monkeypatch.setattr(storage, "free_mb", lambda path: 4.5)
    checkpoint.check_space(tmp_path)
    monkeypatch.setattr(storage, "free_mb", lambda path: 3.5)
    with pytest.raises(StorageError) as error:
        checkpoint.check_space(tmp_path)
    assert str(error.value) == (
        f"no space left on the device for the next checkpoint in {tmp_path / 'checkpoints'} (3.5 MB free, "
        "4.0 MB needed); the last complete checkpoint is step-0000004 (3.0 MB); free space, then continue with "
        "--resume latest"
    )
