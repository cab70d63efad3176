"""Each checkpoint's files against the digests written with it: what a damaged file reads as,
which checkpoint ``--resume`` takes, and the checkpoints written before digests. The runs that
resume past a damaged checkpoint in 1 and 2 processes are rows of the fault matrix
(harness/faultmatrix/input_faults.py, ``checkpoint_*``)."""

from __future__ import annotations

import json

import pytest

from harness.faultmatrix.input_faults import DAMAGE, damage_file
from trainer.contract.errors import CheckpointError
from trainer.state.checkpoint import RECORD_FORMAT, STATE_NAME
from trainer.state.integrity import DIGESTS_NAME, write_digests
from trainer.state.resuming import checkpoint_damage, resolve_resume

pytestmark = pytest.mark.usefixtures("process_state")  # the checks log


def fake_checkpoint(path, step_format=RECORD_FORMAT, digests=True):
    """A checkpoint directory with the files DAMAGE harms, a nested one and its record."""
    path.mkdir(parents=True)
    for name, _ in DAMAGE.values():
        (path / name).write_bytes(bytes(range(256)) * 4)
    (path / "sub").mkdir()
    (path / "sub" / "nested.bin").write_bytes(b"nested")
    (path / STATE_NAME).write_text(json.dumps({"format": step_format, "run": {"step": 1}}))
    if digests:
        assert write_digests(path) == 3 * 1024 + 6 + len((path / STATE_NAME).read_bytes())
    return path


@pytest.mark.parametrize("kind", list(DAMAGE))
def test_a_damaged_file_is_named(tmp_path, kind):
    checkpoint = fake_checkpoint(tmp_path / "step-0000001")
    assert checkpoint_damage(checkpoint) is None
    name, _ = DAMAGE[kind]
    damage_file(checkpoint / name, kind)
    expected = {
        "truncated": f"{name} holds 924 bytes, 1024 when written (truncated)",
        "flipped_byte": f"{name} does not match its sha256 digest: changed since it was written",
        "missing": f"{name} is missing",
    }[kind]
    assert checkpoint_damage(checkpoint) == expected


def test_a_nested_file_and_the_record_are_covered(tmp_path):
    checkpoint = fake_checkpoint(tmp_path / "step-0000001")
    (checkpoint / "sub" / "nested.bin").write_bytes(b"nestee")
    assert (
        checkpoint_damage(checkpoint) == "sub/nested.bin does not match its sha256 digest: changed since it was written"
    )
    checkpoint = fake_checkpoint(tmp_path / "step-0000002")
    (checkpoint / STATE_NAME).write_text(json.dumps({"format": RECORD_FORMAT, "run": {"step": 9}}))
    assert checkpoint_damage(checkpoint).startswith(f"{STATE_NAME} does not match")


def test_checkpoints_before_digests_are_taken_and_digests_lost_since_are_not(tmp_path, caplog):
    older = fake_checkpoint(tmp_path / "checkpoints" / "step-0000001", step_format=2, digests=False)
    with caplog.at_level("INFO", logger="trainer"):
        assert resolve_resume("latest", tmp_path, verify=True) == older
    said = [r.getMessage().removeprefix("[RANK 0] ") for r in caplog.records]
    assert said == ["step-0000001: written before checkpoints held digests; not verified"]  # not "verified"
    newer = fake_checkpoint(tmp_path / "step-0000002")  # beside checkpoints/: not latest
    (newer / DIGESTS_NAME).unlink()
    assert checkpoint_damage(newer) == f"{DIGESTS_NAME} is missing"
    (newer / DIGESTS_NAME).write_text("{not json")
    assert checkpoint_damage(newer).startswith(f"{DIGESTS_NAME} cannot be read (JSONDecodeError")


def test_latest_is_the_newest_that_verifies(tmp_path, caplog):
    root = tmp_path / "checkpoints"
    for step in (3, 6, 9):
        fake_checkpoint(root / f"step-{step:07d}")
    damage_file(root / "step-0000009" / "optimizer.bin", "flipped_byte")
    damage_file(root / "step-0000006" / "scheduler.bin", "missing")
    with caplog.at_level("INFO", logger="trainer"):
        assert resolve_resume("latest", tmp_path, verify=True) == root / "step-0000003"
    messages = [r.getMessage().removeprefix("[RANK 0] ") for r in caplog.records]
    skipped = [m for m in messages if "skipped" in m]
    assert skipped == [
        "--resume latest: skipped step-0000009: optimizer.bin does not match its sha256 digest: changed since it "
        "was written",
        "--resume latest: skipped step-0000006: scheduler.bin is missing",
    ]
    assert any(m.startswith("step-0000003 verified: 0.0 MB in ") for m in messages)
    # the ranks that do not verify take the newest; the main process's choice is broadcast
    assert resolve_resume("latest", tmp_path, verify=False) == root / "step-0000009"


def test_no_checkpoint_that_verifies_is_one_error_naming_each(tmp_path):
    root = tmp_path / "checkpoints"
    for step in (3, 6):
        fake_checkpoint(root / f"step-{step:07d}")
        damage_file(root / f"step-{step:07d}" / "model.safetensors", "truncated")
    with pytest.raises(CheckpointError) as error:
        resolve_resume("latest", tmp_path, verify=True)
    assert str(error.value) == (
        f"{root}: no checkpoint verifies (step-0000006: model.safetensors holds 924 bytes, 1024 when written "
        "(truncated); step-0000003: model.safetensors holds 924 bytes, 1024 when written (truncated))"
    )
    with pytest.raises(CheckpointError, match=r"step-0000003: cannot resume from this checkpoint: model.safetensors"):
        resolve_resume(str(root / "step-0000003"), tmp_path, verify=True)
