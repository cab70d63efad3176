"""transformers models built from a YAML mapping of config fields, checked key by key."""

from __future__ import annotations

import inspect
import logging
import os
from pathlib import Path
from typing import Any

from transformers import PretrainedConfig

from trainer.contract.config.schema import suggestion
from trainer.contract.errors import CheckpointError, ConfigError
from trainer.contract.logs import without_log_records

logger = logging.getLogger("trainer")
#: transformers' own report of the keys it read (5.x: a table; 4.x: "Some weights of ..."),
#: said in the trainer's words in its place
LOAD_REPORTS = ("LOAD REPORT", "Some weights of")


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
    """``auto_class.from_pretrained(source)`` (a directory or a model id); a failure, a weight
    of another shape included, is one CheckpointError naming the source. What was not read
    from the checkpoint is said in the trainer's words (:func:`say_loaded_keys`) in place of
    transformers' load report."""
    try:
        with without_log_records("transformers.modeling_utils", *LOAD_REPORTS):
            # mismatched sizes are let through here to be named below with their shapes
            model, loading = auto_class.from_pretrained(
                source, output_loading_info=True, ignore_mismatched_sizes=True, **config
            )
    except (OSError, ValueError, KeyError) as exc:
        raise CheckpointError(f"{source}: cannot load the {what}: {str(exc).splitlines()[0][:200]}") from None
    say_loaded_keys(model, loading, source, what)
    return model


def say_loaded_keys(model: Any, loading: dict[str, Any], source: str, what: str) -> None:
    """One line for what is expected: a head the checkpoint lacks (a classifier started from a
    language model's body) is newly initialised, a head the model lacks is dropped. A weight of
    the body that is missing or unused is a warning naming it; one of another shape an error."""
    mismatched = sorted(loading["mismatched_keys"])
    if mismatched:
        shapes = ", ".join(
            f"{key} is {tuple(saved)} in the checkpoint, {tuple(wanted)} in the model"
            for key, saved, wanted in mismatched[:3]
        )
        raise CheckpointError(
            f"{source}: cannot load the {what}: weights of another shape: {shapes}" + more(mismatched)
        )
    body = f"{model.base_model_prefix}."
    missing = sorted(loading["missing_keys"])
    new_heads = sorted({key.split(".")[0] for key in missing if not key.startswith(body)})
    if new_heads and os.environ.get("RANK", "0") == "0":
        logger.info(f"{what}: {', '.join(new_heads)} head newly initialised; the rest from {source}")
    missing_body = [key for key in missing if key.startswith(body)]
    if missing_body:
        logger.warning(
            f"{what}: {source}: weights missing from the checkpoint, newly initialised: "
            + ", ".join(missing_body[:5])
            + more(missing_body, 5)
        )
    unused_body = sorted(key for key in loading["unexpected_keys"] if key.startswith(body))
    if unused_body:
        logger.warning(
            f"{what}: {source}: weights of the checkpoint the model does not use: "
            + ", ".join(unused_body[:5])
            + more(unused_body, 5)
        )


def more(items: list[Any], shown: int = 3) -> str:
    """`` and N more`` when a list is cut after ``shown`` items."""
    return f" and {len(items) - shown} more" if len(items) > shown else ""
