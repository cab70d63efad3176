"""Where a relative path in a training config file points: beside the file, so that a config
runs from any directory. A path that exists only relative to the working directory is taken
from there, with one line saying so (a config written for the checkout's root before paths
were read beside their file). Paths on the command line (``--config``, ``--set``, the model
flags) are the working directory's, as in a shell, and so is ``output_dir``: a run writes
where it is started."""

from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import Any

from trainer.contract.config.model_configs import GENERATOR_BODY, is_model_source

logger = logging.getLogger(__name__)

#: the keys whose values are paths the run reads (one path, or a list for the text files)
PATH_KEYS = frozenset(
    {
        *("model.generator_config", "model.discriminator_config", "model.tokenizer", "model.peft"),
        *("init.generator", "init.discriminator"),
        *("data.oracle_path", "data.path", "data.train_files", "data.eval_files", "data.dataset"),
    }
)
#: of those, the keys whose value may be a name instead: a model id, a dataset on the Hub
NAME_KEYS = frozenset({"model.tokenizer", "data.dataset"})
#: and those whose value is a name where it has no YAML or JSON suffix (see is_model_source)
MODEL_KEYS = frozenset({"model.generator_config", "model.discriminator_config"})


def resolve_paths(data: dict[str, Any], config_file: Path) -> dict[str, Any]:
    """``data``, a training config file's mapping, with each relative path under PATH_KEYS
    (also in the ``stage1.<part>`` overrides) made relative to the file's directory."""
    base = config_file.parent
    resolved = _resolved(data, "", base, str(config_file))
    stage1 = resolved.get("stage1")
    if isinstance(stage1, dict):
        for part in ("generator", "discriminator"):
            if isinstance(stage1.get(part), dict):
                stage1[part] = _resolved(stage1[part], "", base, str(config_file), f"stage1.{part}.")
    return resolved


def _resolved(mapping: dict[str, Any], prefix: str, base: Path, source: str, shown: str = "") -> dict[str, Any]:
    """A copy of ``mapping`` (the keys below ``prefix``; dotted keys as in ``--set`` too) with
    its paths resolved; ``shown`` goes before a key in the line that names it."""
    resolved: dict[str, Any] = {}
    for name, value in mapping.items():
        key = f"{prefix}{name}"
        if isinstance(value, dict) and key != "model.peft":
            resolved[name] = _resolved(value, f"{key}.", base, source, shown)
        elif key in PATH_KEYS and isinstance(value, str):
            resolved[name] = resolve(value, key, base, source, shown)
        elif key in PATH_KEYS and isinstance(value, list):
            resolved[name] = [resolve(str(item), key, base, source, shown) for item in value]
        else:
            resolved[name] = value
    return resolved


def resolve(value: str, key: str, base: Path, source: str, shown: str = "") -> str:
    """Where the config at ``source`` (in directory ``base``) means ``value`` of ``key``: beside
    it where it is there; else in the working directory where it is only there (said in one
    line); else a name where the key takes one (a model id, a dataset); else beside it (where
    the error that it is missing names it)."""
    if not value or Path(value).is_absolute() or (key == "model.discriminator_config" and value == GENERATOR_BODY):
        return value
    beside = os.path.normpath(base / value)
    if Path(beside).exists():
        return beside
    if Path(value).exists():
        if os.environ.get("RANK", "0") == "0":  # before any process group: one line, not one per rank
            logger.warning(
                f"{source}: key '{shown}{key}': {value!r} is not beside the config ({beside} does not exist); "
                "taken from the working directory (write it relative to the config's directory)"
            )
        return value
    if key in NAME_KEYS or (key in MODEL_KEYS and is_model_source(value)):
        return value
    return beside
