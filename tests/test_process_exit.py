"""A command's exit after a process group skips the interpreter's finalization (see
trainer.distributed.world.exit_process): gloo's worker threads outlive destroy_process_group and, taking
the GIL to drop a finished collective's tensors while the interpreter finalizes, abort the
process (SIGABRT, "terminate called without an active exception") after its work is done.
The exit handlers and the streams are still served, and the status kept."""

from __future__ import annotations

import subprocess
import sys

import pytest
from helpers import ROOT, free_port, worker_env

WORKER = """
import atexit, sys
import torch.distributed as dist
from trainer.distributed.world import end_process_group, exit_process

if sys.argv[1] == "group":
    dist.init_process_group("gloo", init_method="env://")


class Finalized:
    def __del__(self, say=print):
        say("finalized", flush=True)


keeper = Finalized()
atexit.register(print, "exit handler ran")
sys.stdout.write("last words without a newline")
end_process_group()
exit_process(3)
"""


def exit_of(tmp_path, group: str) -> subprocess.CompletedProcess:
    script = tmp_path / "worker.py"
    script.write_text(WORKER)
    cmd = [sys.executable, str(script), group]
    return subprocess.run(cmd, env=worker_env(0, 1, free_port()), capture_output=True, text=True, timeout=60)


@pytest.mark.timeout(90)
def test_after_a_process_group_the_exit_skips_only_the_finalization(tmp_path):
    result = exit_of(tmp_path, "group")
    assert result.returncode == 3, result.stderr[-3000:]
    assert "last words without a newline" in result.stdout and "exit handler ran" in result.stdout
    assert "finalized" not in result.stdout


@pytest.mark.timeout(90)
def test_without_a_process_group_the_exit_is_python_s_own(tmp_path):
    result = exit_of(tmp_path, "none")
    assert result.returncode == 3, result.stderr[-3000:]
    assert "exit handler ran" in result.stdout and "finalized" in result.stdout


def test_the_commands_end_through_it():
    for script in ("train_stage1.py", "train_stage2.py", "run_oracle.py", "run_text.py", "doctor.py"):
        assert "_command(" in (ROOT / "scripts" / script).read_text(), script
    entry_points = (ROOT / "setup.cfg").read_text()
    assert "trainer-stage2 = trainer.commands.cli:stage2_command" in entry_points
    assert "trainer-stage1 = trainer.commands.cli:stage1_command" in entry_points
