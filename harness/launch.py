"""Launching a training script the way the trainer's tests and fault matrix do, and reading
what the run wrote.

One process runs as plain ``python``; N processes run under ``accelerate launch`` with
``accelerate_configs/8gpu.yaml`` (or ``torchrun``), on the CPU over gloo when the script gets
``--device cpu``. Every launched process gets one thread. Paths are those of a source checkout
(``scripts/``, ``accelerate_configs/``).
"""

from __future__ import annotations

import json
import os
import socket
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = ROOT / "scripts" / "train_stage2.py"


def launch_env(paths: Sequence[Path] = ()) -> dict[str, str]:
    """The environment of a launched run: ``paths`` and the checkout importable (a task named
    ``module:Class`` in a config is imported from there), one thread per process, Python's
    fault handler on."""
    out = dict(os.environ)
    out["PYTHONPATH"] = os.pathsep.join([*map(str, paths), str(ROOT), out.get("PYTHONPATH", "")])
    out["OMP_NUM_THREADS"] = "1"
    # a worker that aborts (SIGABRT, as a C++ terminate does) prints every thread's Python stack
    out["PYTHONFAULTHANDLER"] = "1"
    out.pop("WORLD_SIZE", None)
    return out


def worker_env(rank: int, world_size: int, port: int, paths: Sequence[Path] = ()) -> dict[str, str]:
    """The environment a launcher gives worker ``rank`` of a one-node job (for workers started
    by hand, each with its own port or working directory)."""
    return launch_env(paths) | {
        "RANK": str(rank),
        "LOCAL_RANK": str(rank),
        "WORLD_SIZE": str(world_size),
        "LOCAL_WORLD_SIZE": str(world_size),
        "MASTER_ADDR": "127.0.0.1",
        "MASTER_PORT": str(port),
    }


def free_port() -> int:
    """A TCP port free on this machine now (for a launcher's rendezvous)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def launch_command(
    args: list[str],
    processes: int,
    script: Path = SCRIPT,
    launcher: str = "accelerate",
    max_restarts: int = 0,
    precision: str | None = "no",
    accelerate_config: str = "8gpu.yaml",
) -> list[str]:
    """The command that runs the script in 1 process (plain python) or N (accelerate launch
    with ``accelerate_configs/ACCELERATE_CONFIG``, or torchrun). With ``max_restarts`` the
    launcher restarts every worker after a failure, up to that many times (even for 1 process).
    ``precision``: accelerate launch's ``--mixed_precision`` (fp32 by default, so that CPU runs
    compare numbers; None: the config's, bf16 for 8gpu.yaml)."""
    if processes == 1 and not max_restarts:
        cmd = [sys.executable, str(script), *args]
    elif launcher == "torchrun":
        cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", str(processes)]
        cmd += ["--max-restarts", str(max_restarts), str(script), *args]
    else:
        cmd = [
            sys.executable,
            "-m",
            "accelerate.commands.launch",
            "--config_file",
            str(ROOT / "accelerate_configs" / accelerate_config),
            "--num_processes",
            str(processes),
            "--main_process_port",
            str(free_port()),
            "--max_restarts",
            str(max_restarts),
            *(["--mixed_precision", precision] if precision else []),
        ]
        cmd += [str(script), *args]
    return cmd


def records(output_dir: Path, split: str | None = None) -> list[dict[str, Any]]:
    """The records of a run's ``metrics.jsonl`` (of one split: ``train``, ``eval``)."""
    lines = (output_dir / "metrics.jsonl").read_text().splitlines()
    found = [json.loads(line) for line in lines if line.strip()]
    return [r for r in found if split is None or r["split"] == split]
