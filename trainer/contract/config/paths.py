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


#: where stage 1's overrides of each part live: their keys name the config's (``data.path``)
STAGE1_PARTS = ("stage1.generator.", "stage1.discriminator.")


def resolve_paths(data: dict[str, Any], config_file: Path, prefix: str = "") -> dict[str, Any]:
    """``data``, a training config file's mapping (or the part of it below ``prefix``; dotted
    keys as in ``--set`` too), with each relative path under PATH_KEYS, also in the
    ``stage1.<part>`` overrides, made relative to the file's directory."""
    resolved: dict[str, Any] = {}
    for name, value in data.items():
        key = f"{prefix}{name}"
        path_key = next((key.removeprefix(part) for part in STAGE1_PARTS if key.startswith(part)), key)
        if isinstance(value, dict) and path_key != "model.peft":
            resolved[name] = resolve_paths(value, config_file, f"{key}.")
        elif path_key in PATH_KEYS and isinstance(value, str):
            resolved[name] = resolve(value, path_key, config_file, key)
        elif path_key in PATH_KEYS and isinstance(value, list):
            resolved[name] = [resolve(str(item), path_key, config_file, key) for item in value]
        else:
            resolved[name] = value
    return resolved


def resolve(value: str, key: str, config_file: Path, shown: str = "") -> str:
    """Where the config ``config_file`` means ``value`` of ``key`` (``shown``: the key as the
    file spells it): beside the file where it is there; else in the working directory where it
    is only there (said in one line); else a name where the key takes one (a model id, a
    dataset); else beside the file (where the error that it is missing names it)."""
    if not value or Path(value).is_absolute() or (key == "model.discriminator_config" and value == GENERATOR_BODY):
        return value
    beside = os.path.normpath(config_file.parent / value)
    if Path(beside).exists():
        return beside
    if Path(value).exists():
        if os.environ.get("RANK", "0") == "0":  # before any process group: one line, not one per rank
            logger.warning(
                f"{config_file}: key '{shown or key}': {value!r} is not beside the config ({beside} does not exist); "
                "taken from the working directory (write it relative to the config's directory)"
            )
        return value
    if key in NAME_KEYS or (key in MODEL_KEYS and is_model_source(value)):
        return value
    return beside
