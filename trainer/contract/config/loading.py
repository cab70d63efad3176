"""Loading a run's config: the training config's file, the ``--set`` overrides and the command
line's flags, in that order of precedence, then both model configs; checked before any process
group or device is touched, so a bad config ends the run with one line naming the file and key."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

from trainer.contract.config.model_configs import GENERATOR_BODY, read_model_config
from trainer.contract.config.overrides import override_mapping
from trainer.contract.config.paths import resolve_paths
from trainer.contract.config.schema import from_mapping, read_yaml
from trainer.contract.config.sections import Config, RunConfig, check_override_key
from trainer.contract.errors import ConfigError


def apply_overrides(data: dict[str, Any], overrides: dict[str, Any]) -> None:
    """Set each dotted key of ``overrides`` in the raw mapping ``data`` (checked against Config)."""
    for key, value in overrides.items():
        check_override_key(key)
        parts = key.split(".")
        node = data
        for part in parts[:-1]:
            child = node.get(part)
            if not isinstance(child, dict):
                child = node[part] = {}
            node = child
        node[parts[-1]] = value


def read_training_config(path: str | Path) -> dict[str, Any]:
    """A training config file's mapping, its relative paths read beside it (see config/paths.py)."""
    return resolve_paths(read_yaml(path, "training config"), Path(path))


def load_config(
    config: str | Path | dict[str, Any],
    overrides: dict[str, Any] | list[str] | None = None,
    generator_config: str | Path | None = None,
    discriminator_config: str | Path | None = None,
    output_dir: str | Path | None = None,
    *,
    source: str | None = None,
    output_suffix: str = "",
    read_models: dict[str, dict[str, Any]] | None = None,
) -> RunConfig:
    """The resolved run: the training config and both model configs, read, overridden and
    validated. Later settings win: the built-in defaults, ``config`` (a YAML file, whose
    relative paths are read beside it, or a dict, whose paths are the working directory's),
    ``overrides`` (dotted keys to values, or ``--set`` strings), then
    ``generator_config``, ``discriminator_config`` and ``output_dir`` (the command line's flags).

    ``source``: the name errors give a dict ``config`` (its file, when it was read from one).
    ``output_suffix``: appended to the output directory, unless ``output_dir`` is given.
    ``read_models``: model configs already read, by the name they were read from, so that a
    pipeline of runs reads each file once.
    """
    if isinstance(config, dict):
        source, data = source or "the config dict", copy.deepcopy(config)
    else:
        source, data = str(config), read_training_config(config)
    overriding = override_mapping(overrides)
    apply_overrides(data, overriding)
    if output_dir is not None:
        data["output_dir"] = str(output_dir)
    elif output_suffix:
        data["output_dir"] = f"{data.get('output_dir', Config.output_dir)}{output_suffix}"
    cfg = from_mapping(Config, data, source)
    if generator_config is not None:
        cfg.model.generator_config = str(generator_config)
    if discriminator_config is not None:
        cfg.model.discriminator_config = str(discriminator_config)
    cfg.check(source)
    models = {}
    for role in ("generator", "discriminator"):
        model_path = getattr(cfg.model, f"{role}_config")
        if not model_path:
            raise ConfigError(f"{source}: key 'model.{role}_config' is empty and --{role}-config was not given")
        if role == "discriminator" and model_path == GENERATOR_BODY:
            cfg.model.discriminator_config = cfg.model.generator_config
            models[role] = models["generator"]
            continue
        known = (read_models or {}).get(model_path)
        models[role] = copy.deepcopy(known) if known is not None else read_model_config(model_path, role)
    return RunConfig(
        config=cfg,
        source=source,
        generator=models["generator"],
        discriminator=models["discriminator"],
        generator_source=cfg.model.generator_config,
        discriminator_source=cfg.model.discriminator_config,
        overridden=frozenset(overriding),
    )
