"""Overrides of config values: ``--set dotted.key=value`` strings or a mapping of dotted keys,
and nested mappings flattened into dotted keys."""

from __future__ import annotations

from typing import Any

import yaml

from trainer.contract.errors import ConfigError


def parse_override(text: str) -> tuple[str, Any]:
    """Split ``dotted.key=value``; the value is read as YAML (so ``3`` is an int)."""
    if "=" not in text:
        raise ConfigError(f"--set {text}: expected dotted.key=value")
    key, raw = text.split("=", 1)
    try:
        value = yaml.safe_load(raw) if raw.strip() else ""
    except yaml.YAMLError:
        value = raw
    return key.strip(), value


def override_mapping(overrides: dict[str, Any] | list[str] | None) -> dict[str, Any]:
    """Overrides as a mapping of dotted keys to values, from a mapping or ``--set`` strings."""
    if isinstance(overrides, dict):
        return dict(overrides)
    return dict(parse_override(item) for item in overrides or [])


def dotted(mapping: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    """``mapping`` with nested mappings flattened into dotted keys (``{"a": {"b": 1}}`` ->
    ``{"a.b": 1}``); later keys win, so an override set with ``--set`` beats the file's."""
    flat: dict[str, Any] = {}
    for key, value in mapping.items():
        if isinstance(value, dict) and value:
            flat.update(dotted(value, f"{prefix}{key}."))
        else:
            flat[f"{prefix}{key}"] = value
    return flat
