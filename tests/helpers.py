"""Shared helpers of the tests: tiny configs, launching 1..N processes with a hard timeout."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parent.parent
TESTS = Path(__file__).resolve().parent
SCRIPT = ROOT / "scripts" / "train_stage2.py"
LAUNCH_TIMEOUT = 240

TINY_GENERATOR = {"latent_dim": 2, "hidden_dim": 16, "num_layers": 2}
TINY_DISCRIMINATOR = {"hidden_dim": 16, "num_layers": 2}


def write_run(tmp: Path, config: dict[str, Any]) -> Path:
    """Write a tiny ring run (tiny MLPs) merged with ``config``; returns the config path."""
    tmp.mkdir(parents=True, exist_ok=True)
    (tmp / "generator.yaml").write_text(yaml.safe_dump(TINY_GENERATOR))
    (tmp / "discriminator.yaml").write_text(yaml.safe_dump(TINY_DISCRIMINATOR))
    base: dict[str, Any] = {
        "task": "gaussian_mixture",
        "output_dir": str(tmp / "out"),
        "model": {
            "generator_config": str(tmp / "generator.yaml"),
            "discriminator_config": str(tmp / "discriminator.yaml"),
        },
        "task_options": {"mixture": "ring", "packing": 1, "plot": False},
        "training": {
            "max_steps": 4,
            "batch_size": 4,
            "eval_every": 2,
            "save_every": 2,
            "log_every": 1,
            "seed": 3,
            "mixed_precision": "no",
            "log_with": ["none"],
        },
        "optim": {"generator": {"lr": 1e-3}, "discriminator": {"lr": 1e-3}},
        "eval": {"batch_size": 4},
        "data": {"train_size": 64, "eval_size": 10},
    }
    merged = deep_merge(base, config)
    path = tmp / "train.yaml"
    path.write_text(yaml.safe_dump(merged))
    return path


def deep_merge(base: dict[str, Any], extra: dict[str, Any]) -> dict[str, Any]:
    out = dict(base)
    for key, value in extra.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = deep_merge(out[key], value)
        else:
            out[key] = value
    return out


def env() -> dict[str, str]:
    """Environment of a launched run: the tests' modules importable, one thread each."""
    out = dict(os.environ)
    out["PYTHONPATH"] = os.pathsep.join([str(TESTS), str(ROOT), out.get("PYTHONPATH", "")])
    out["OMP_NUM_THREADS"] = "1"
    out.pop("WORLD_SIZE", None)
    return out


def worker_env(rank: int, world_size: int, port: int) -> dict[str, str]:
    """The environment a launcher gives worker ``rank`` of a one-node job (for workers that a
    test starts by hand, to give each its own port or working directory)."""
    return env() | {
        "RANK": str(rank),
        "LOCAL_RANK": str(rank),
        "WORLD_SIZE": str(world_size),
        "LOCAL_WORLD_SIZE": str(world_size),
        "MASTER_ADDR": "127.0.0.1",
        "MASTER_PORT": str(port),
    }


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def launch_command(
    args: list[str], processes: int, script: Path = SCRIPT, launcher: str = "accelerate", max_restarts: int = 0
) -> list[str]:
    """The command that runs the script in 1 process (plain python) or N (accelerate launch
    with the 8gpu config, or torchrun). With ``max_restarts`` the launcher restarts every
    worker after a failure, up to that many times (even for 1 process)."""
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
            str(ROOT / "accelerate_configs" / "8gpu.yaml"),
            "--num_processes",
            str(processes),
            "--main_process_port",
            str(free_port()),
            "--max_restarts",
            str(max_restarts),
        ]
        cmd += [str(script), *args]
    return cmd


def launch(
    args: list[str], processes: int, timeout: int = LAUNCH_TIMEOUT, script: Path = SCRIPT, launcher: str = "accelerate"
) -> subprocess.CompletedProcess:
    """Run the script (see launch_command) to its end, with a hard timeout."""
    cmd = launch_command(args, processes, script, launcher)
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env(), cwd=ROOT)


def check(result: subprocess.CompletedProcess) -> subprocess.CompletedProcess:
    assert result.returncode == 0, f"exit {result.returncode}\n{result.stdout[-3000:]}\n{result.stderr[-6000:]}"
    return result


def records(output_dir: Path, split: str | None = None) -> list[dict[str, Any]]:
    lines = (output_dir / "metrics.jsonl").read_text().splitlines()
    found = [json.loads(line) for line in lines if line.strip()]
    return [r for r in found if split is None or r["split"] == split]
