"""Shared helpers of the tests: tiny configs, launching 1..N processes with a hard timeout."""

from __future__ import annotations

import copy
import subprocess
from pathlib import Path
from typing import Any

import torch
import yaml
from torch import nn

from harness import launch as launching
from harness.forked import fork_launch
from harness.launch import ROOT, SCRIPT, free_port, launch_command, launch_env, records
from harness.tiny import TINY_DISCRIMINATOR, TINY_GENERATOR, deep_merge, write_run

TESTS = Path(__file__).resolve().parent
__all__ = [
    "ROOT",
    "SCRIPT",
    "TINY_DISCRIMINATOR",
    "deep_merge",
    "fork_launch",
    "free_port",
    "launch_command",
    "records",
    "write_run",
]
LAUNCH_TIMEOUT = 240

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


def env() -> dict[str, str]:
    """Environment of a launched run: the tests' modules importable, one thread each."""
    return launch_env([TESTS])


def worker_env(rank: int, world_size: int, port: int) -> dict[str, str]:
    """The environment a launcher gives worker ``rank`` (see harness.launch.worker_env)."""
    return launching.worker_env(rank, world_size, port, [TESTS])


def launch(
    args: list[str],
    processes: int,
    timeout: int = LAUNCH_TIMEOUT,
    script: Path = SCRIPT,
    launcher: str = "accelerate",
    precision: str | None = "no",
    accelerate_config: str = "8gpu.yaml",
) -> subprocess.CompletedProcess:
    """Run the script (see launch_command) to its end, with a hard timeout."""
    cmd = launch_command(args, processes, script, launcher, precision=precision, accelerate_config=accelerate_config)
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
    from trainer.distributed import world

    build = world.build_accelerator

    def build_with_scaler(*args: Any, **kwargs: Any) -> Any:
        accelerator = build(*args, **kwargs)
        accelerator.scaler = scaler
        return accelerator

    monkeypatch.setattr(world, "build_accelerator", build_with_scaler)


def hand_refreshed(model: nn.Module, task, batches: int, batch_size: int, seed: int) -> dict[str, torch.Tensor]:
    """The running mean and (unbiased) variance each BatchNorm layer of ``model`` would hold as
    the plain average over every training-mode forward that ``batches`` calls of task.generate
    make, taken from the layers' inputs."""
    model = copy.deepcopy(model).train()
    inputs: dict[str, list[torch.Tensor]] = {}
    for name, module in model.named_modules():
        if isinstance(module, nn.BatchNorm1d):
            module.register_forward_pre_hook(lambda m, args, name=name: inputs.setdefault(name, []).append(args[0]))
    rng = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for _ in range(batches):
            task.generate(model, batch_size, rng)
    expected = {}
    for name, seen in inputs.items():
        expected[f"{name}.running_mean"] = torch.stack([x.mean(0) for x in seen]).mean(0)
        expected[f"{name}.running_var"] = torch.stack([x.var(0) for x in seen]).mean(0)
    return expected
