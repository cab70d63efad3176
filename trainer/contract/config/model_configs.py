"""Where a model's config comes from: a YAML of config fields (a fresh model), a
``save_pretrained`` directory (its config.json), or a model id (its config, from the Hub or
the local cache of downloads)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from trainer.contract.config.schema import read_yaml
from trainer.contract.errors import ConfigError

#: ``model.discriminator_config``: the generator's architecture and weights, with a new head
GENERATOR_BODY = "generator"


def is_model_source(path: str | Path) -> bool:
    """Whether a model config names a model to load (a ``save_pretrained`` directory or a model
    id) rather than a YAML of config fields for a fresh model."""
    return Path(path).is_dir() or not (Path(path).suffix in (".yaml", ".yml", ".json") or Path(path).exists())


def read_model_config(path: str | Path, role: str) -> dict[str, Any]:
    """A model config: a YAML file, a ``save_pretrained`` directory (its config.json), or a
    model id (its config, from the Hub or the local cache of downloads)."""
    if is_model_source(path) and not Path(path).is_dir():
        return hub_model_config(str(path), role)
    path = Path(path)
    if path.is_dir():
        file = path / "config.json"
        if not file.is_file():
            raise ConfigError(f"{path}: a directory without config.json is not a {role} model config")
        try:
            return json.loads(file.read_text())
        except json.JSONDecodeError as exc:
            raise ConfigError(f"{file}: not valid JSON: {exc}") from None
    return read_yaml(path, f"{role} model config")


def hub_model_config(model_id: str, role: str) -> dict[str, Any]:
    """The config of a model id, as ``from_pretrained`` would fetch it; one line when the id is
    neither a local directory nor reachable (offline, or no such model)."""
    from transformers import AutoConfig

    try:
        return AutoConfig.from_pretrained(model_id).to_dict()
    except (OSError, ValueError) as exc:
        first = next((line for line in str(exc).splitlines() if line.strip()), type(exc).__name__)
        raise ConfigError(
            f"{model_id}: the {role} model config is neither a file, a local directory nor a model id "
            f"that could be fetched ({first[:200]})"
        ) from None
