"""Shared helpers of the tests: tiny configs, launching 1..N processes with a hard timeout."""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any

import yaml

from harness import launch as launching
from harness.launch import ROOT, SCRIPT, free_port, launch_command, launch_env, records

TESTS = Path(__file__).resolve().parent
__all__ = ["ROOT", "SCRIPT", "free_port", "launch_command", "records"]
LAUNCH_TIMEOUT = 240

TINY_GENERATOR = {"latent_dim": 2, "hidden_dim": 16, "num_layers": 2}
TINY_DISCRIMINATOR = {"hidden_dim": 16, "num_layers": 2}
#: PacGAN's models, tiny: a BatchNorm generator, a maxout discriminator, N(0, 0.02) weights
PACGAN_GENERATOR = {**TINY_GENERATOR, "batch_norm": True, "init_std": 0.02}
PACGAN_DISCRIMINATOR = {"hidden_dim": 8, "num_layers": 2, "maxout_pieces": 3, "init_std": 0.02}


def pacgan_models(tmp: Path) -> dict[str, str]:
    """Write the tiny PacGAN model configs; the ``model`` section that names them."""
    tmp.mkdir(parents=True, exist_ok=True)
    (tmp / "pacgan_generator.yaml").write_text(yaml.safe_dump(PACGAN_GENERATOR))
    (tmp / "pacgan_discriminator.yaml").write_text(yaml.safe_dump(PACGAN_DISCRIMINATOR))
    return {
        "generator_config": str(tmp / "pacgan_generator.yaml"),
        "discriminator_config": str(tmp / "pacgan_discriminator.yaml"),
    }


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
    return launch_env([TESTS])


def worker_env(rank: int, world_size: int, port: int) -> dict[str, str]:
    """The environment a launcher gives worker ``rank`` (see harness.launch.worker_env)."""
    return launching.worker_env(rank, world_size, port, [TESTS])


def launch(
    args: list[str], processes: int, timeout: int = LAUNCH_TIMEOUT, script: Path = SCRIPT, launcher: str = "accelerate"
) -> subprocess.CompletedProcess:
    """Run the script (see launch_command) to its end, with a hard timeout."""
    cmd = launch_command(args, processes, script, launcher)
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env(), cwd=ROOT)


def check(result: subprocess.CompletedProcess) -> subprocess.CompletedProcess:
    assert result.returncode == 0, f"exit {result.returncode}\n{result.stdout[-3000:]}\n{result.stderr[-6000:]}"
    return result


def tensorboard_text(out: Path, tag: str) -> list[str]:
    """The texts a run logged to tensorboard under ``tag``, oldest first."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    texts = []
    for run_dir in sorted({path.parent for path in out.rglob("events.out.tfevents.*")}):
        events = EventAccumulator(str(run_dir), size_guidance={"tensors": 0})
        events.Reload()
        for name in (t for t in events.Tags()["tensors"] if t.startswith(tag)):
            texts += [event.tensor_proto.string_val[0].decode() for event in events.Tensors(name)]
    return texts


def use_scaler(monkeypatch: Any, scaler: Any) -> None:
    """Runs built while ``monkeypatch`` holds get ``scaler`` as their Accelerator's GradScaler
    (another initial scale; on the CPU, where accelerate makes none, the fp16 path)."""
    from trainer import world

    build = world.build_accelerator

    def build_with_scaler(*args: Any, **kwargs: Any) -> Any:
        accelerator = build(*args, **kwargs)
        accelerator.scaler = scaler
        return accelerator

    monkeypatch.setattr(world, "build_accelerator", build_with_scaler)
