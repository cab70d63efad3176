"""The runs of :func:`harness.launch.launch_command` with each worker forked from the calling
process instead of started anew, for the tests whose parametrized rows compare numbers (a
resumed run against an uninterrupted one, one world against another), where the launcher is
not what is tested: each such test keeps one row on the real launcher.

A new worker imports torch, accelerate, torch's compiler (which the optimizers import) and the
trainer: about 3 s of CPU on a 2-core machine, which a fork of a process that has imported
them does not pay (a 2-process tiny run, 2026-12-08, the machine alone: 7.5 s of CPU and 4.7 s
wall under ``accelerate launch``, one run; 1.6 s and 1.0 s forked, three runs). Each worker
gets the environment ``accelerate launch`` gives its workers, made by accelerate's own
functions from the same config file (the mixed precision, FSDP2's settings), with the rank
variables a launcher sets (one process: plain ``python``'s), and runs the command's entry point
(``trainer.commands.cli``) with the same arguments, so its exit status and its lines are the
command's.
"""

from __future__ import annotations

import contextlib
import logging
import os
import select
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from harness.launch import ROOT, SCRIPT, free_port, launch_command, launch_env, worker_env

#: the scripts a forked worker can run: their entry point's stage
STAGES = {"train_stage2.py": 2, "train_stage1.py": 1}


def accelerate_env(processes: int, accelerate_config: str, precision: str | None, port: int) -> dict[str, str]:
    """The variables ``accelerate launch`` with these flags gives every worker (beside the rank
    variables), from accelerate's launch parser and its multi-process environment."""
    from accelerate.commands.launch import _validate_launch_command, launch_command_parser  # no public form
    from accelerate.utils.launch import prepare_multi_gpu_env

    command = launch_command([], processes, accelerate_config=accelerate_config, precision=precision)
    flags = command[command.index("accelerate.commands.launch") + 1 : -1]  # the flags before the script
    flags[flags.index("--main_process_port") + 1] = str(port)
    validated = _validate_launch_command(launch_command_parser().parse_args([*flags, str(SCRIPT)]))
    args = validated[0] if isinstance(validated, tuple) else validated
    names = ("ACCELERATE_", "FSDP_")
    return {k: v for k, v in prepare_multi_gpu_env(args).items() if k.startswith(names)}


def warm_up() -> None:
    """Import here what every worker imports, once, so that each fork has it: the command and
    the loop, and torch's compiler, which the optimizers import (1 s of CPU a worker)."""
    import torch._dynamo  # noqa: F401

    import trainer.commands.cli  # noqa: F401
    import trainer.commands.stages  # noqa: F401


def fork_launch(
    args: list[str],
    processes: int,
    script: Path = SCRIPT,
    precision: str | None = "no",
    accelerate_config: str = "8gpu.yaml",
    timeout: float = 240,
) -> subprocess.CompletedProcess:
    """Run ``script`` with ``args`` as :func:`harness.launch.launch` does, in ``processes``
    forked workers: their exit statuses (the largest), their stdout and stderr (rank by rank).
    A worker still running after ``timeout`` seconds is killed (exit -9)."""
    stage = STAGES[Path(script).name]
    warm_up()
    port = free_port()
    common = accelerate_env(processes, accelerate_config, precision, port) if processes > 1 else {}
    with tempfile.TemporaryDirectory() as tmp:
        logs = [(Path(tmp) / f"{rank}.out", Path(tmp) / f"{rank}.err") for rank in range(processes)]
        pids = []
        for rank, (out, err) in enumerate(logs):
            env = worker_env(rank, processes, port) | common if processes > 1 else launch_env()
            pids.append(fork_worker(stage, args, env, out, err))
        codes = wait_all(pids, timeout)
        stdout = "".join(out.read_text() for out, _ in logs)
        stderr = "".join(err.read_text() for _, err in logs)
    return subprocess.CompletedProcess(["fork", *args], max(codes, key=abs), stdout, stderr)


def fork_worker(stage: int, args: list[str], env: dict[str, str], out: Path, err: Path) -> int:
    """Fork one worker that runs the command's entry point; its pid. The child never returns:
    it ends with ``os._exit``, so none of this process's exit handlers (pytest's) run in it."""
    for stream in (sys.stdout, sys.stderr):
        stream.flush()
    pid = os.fork()
    if pid:
        return pid
    status = 1
    try:
        os.setpgid(0, 0)  # a group of its own: a kill at the timeout reaches what it started
        os.environ.clear()  # the launcher's environment (one process: plain python's)
        os.environ.update(env)
        os.chdir(ROOT)
        for fd, path in ((1, out), (2, err)):
            os.dup2(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC), fd)
        sys.stdout = open(1, "w", buffering=1, closefd=False)  # noqa: SIM115 (the process's own)
        sys.stderr = open(2, "w", buffering=1, closefd=False)  # noqa: SIM115
        for logger in (logging.getLogger(), logging.getLogger("trainer")):  # the caller's handlers
            logger.handlers.clear()
        from trainer.commands.cli import main

        status = main(args, stage=stage)
    except SystemExit as exc:  # argparse
        status = exc.code if isinstance(exc.code, int) else 1
    except BaseException:  # noqa: BLE001 (the child reports and ends; it never returns)
        import traceback

        traceback.print_exc()
    finally:
        with contextlib.suppress(Exception):
            sys.stdout.flush()
            sys.stderr.flush()
        os._exit(status)


def wait_all(pids: list[int], timeout: float) -> list[int]:
    """Each worker's exit status (as ``subprocess`` reports it: -N for a signal), killing those
    left at the deadline."""
    deadline, codes = time.monotonic() + timeout, {}
    while len(codes) < len(pids):
        for pid in pids:
            if pid not in codes:
                done, status = os.waitpid(pid, os.WNOHANG)
                if done:
                    codes[pid] = os.waitstatus_to_exitcode(status)
        if time.monotonic() > deadline:
            for pid in set(pids) - set(codes):
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(pid, signal.SIGKILL)
        select.select([], [], [], 0.02)
    return [codes[pid] for pid in pids]
