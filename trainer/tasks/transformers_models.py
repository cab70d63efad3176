"""transformers models built from a YAML mapping of config fields, checked key by key."""

from __future__ import annotations

import inspect
from pathlib import Path
from typing import Any

from transformers import PretrainedConfig

from trainer.errors import CheckpointError, ConfigError
from trainer.schema import suggestion


def build_config(fields: dict[str, Any], source: str, **forced: Any) -> PretrainedConfig:
    """The transformers config that ``fields`` describe (``model_type`` plus config fields).

    transformers keeps unknown keyword arguments as attributes without a word, so a typo
    would silently leave a default in place; here it is an error naming the file and key.
    ``forced`` values are set whatever the file says.
    """
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING

    model_type = fields.get("model_type")
    if not isinstance(model_type, str) or model_type not in CONFIG_MAPPING:
        raise ConfigError(
            f"{source}: key 'model_type' is {model_type!r}, not a transformers model type (e.g. gpt2)"
            + suggestion(str(model_type), CONFIG_MAPPING.keys())
        )
    config_class = CONFIG_MAPPING[model_type]
    known = set(config_class().to_dict()) | set(config_class.attribute_map) | {"num_labels"}
    known |= set(inspect.signature(config_class.__init__).parameters) - {"self", "kwargs"}
    for key in fields:
        if key not in known:
            raise ConfigError(f"{source}: unknown key {key!r} for a {model_type} config" + suggestion(key, known))
    values = {key: value for key, value in fields.items() if key != "model_type"}
    try:
        return config_class(**{**values, **forced})
    except (TypeError, ValueError) as exc:
        raise ConfigError(f"{source}: not a valid {model_type} config: {exc}") from None


def load_pretrained(auto_class: Any, path: Path, what: str, **config: Any) -> Any | None:
    """A model from a ``save_pretrained`` directory, or None when ``path`` is not one.

    ``config`` values replace the saved ones (a classifier head can start from a language
    model's body: its head is then newly initialised).
    """
    if not (path.is_dir() and (path / "config.json").is_file()):
        return None
    return from_pretrained(auto_class, str(path), what, **config)


def from_pretrained(auto_class: Any, source: str, what: str, **config: Any) -> Any:
    """``auto_class.from_pretrained(source)`` (a directory or a model id); a failure is one
    CheckpointError naming the source."""
    try:
        return auto_class.from_pretrained(source, **config)
    except (OSError, ValueError, KeyError) as exc:
        raise CheckpointError(f"{source}: cannot load the {what}: {str(exc).splitlines()[0][:200]}") from None
