"""The tiny run the tests and the fault matrix train: the ring recipe with tiny MLPs, a few steps
in batches of 4, merged with each caller's own settings."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

TINY_GENERATOR = {"latent_dim": 2, "hidden_dim": 16, "num_layers": 2}
TINY_DISCRIMINATOR = {"hidden_dim": 16, "num_layers": 2}


def deep_merge(base: dict[str, Any], extra: dict[str, Any]) -> dict[str, Any]:
    """``base`` with ``extra``'s values, mappings merged key by key at every depth."""
    out = dict(base)
    for key, value in extra.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = deep_merge(out[key], value)
        else:
            out[key] = value
    return out


def write_run(
    tmp: Path,
    config: dict[str, Any],
    generator: dict[str, Any] = TINY_GENERATOR,
    discriminator: dict[str, Any] = TINY_DISCRIMINATOR,
) -> Path:
    """Write a tiny ring run (its model configs beside it, outputs in ``tmp/out``) merged with
    ``config``; returns the config's path."""
    tmp.mkdir(parents=True, exist_ok=True)
    (tmp / "generator.yaml").write_text(yaml.safe_dump(generator))
    (tmp / "discriminator.yaml").write_text(yaml.safe_dump(discriminator))
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
    path = tmp / "train.yaml"
    path.write_text(yaml.safe_dump(deep_merge(base, config)))
    return path
