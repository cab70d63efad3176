"""Strict conversion of YAML mappings into typed dataclasses.

Every config object of the project (training config, model configs, task options) goes
through :func:`from_mapping`, so an unknown key, a wrong type or a missing required key is
reported the same way everywhere: the file, the dotted key and, for a misspelled key, the
closest valid one.
"""

from __future__ import annotations

import dataclasses
import difflib
import re
import types
import typing
from pathlib import Path
from typing import Any, Literal, TypeVar, Union, get_args, get_origin, get_type_hints

import yaml

from trainer.contract.errors import ConfigError

T = TypeVar("T")

#: numbers in exponent notation without a dot (1e-4), which yaml.safe_load leaves as strings
FLOAT_WITHOUT_DOT = re.compile(r"[-+]?[0-9]+[eE][-+]?[0-9]+")


def require(condition: bool, source: str, key: str, message: str) -> None:
    """A ConfigError ``SOURCE: key 'KEY' MESSAGE`` unless ``condition`` holds."""
    if not condition:
        raise ConfigError(f"{source}: key '{key}' {message}")


def read_yaml(path: str | Path, what: str = "config") -> dict[str, Any]:
    """Read a YAML mapping with ``yaml.safe_load``; an empty file is an empty mapping."""
    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"{path}: {what} file not found")
    try:
        data = yaml.safe_load(path.read_text())
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" (line {mark.line + 1})" if mark is not None else ""
        raise ConfigError(f"{path}: not valid YAML{where}: {getattr(exc, 'problem', exc)}") from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: expected a mapping of keys to values, got {type(data).__name__}")
    return data


def suggestion(name: str, valid: typing.Iterable[str], prefix: str = "") -> str:
    """A ``; did you mean 'prefix.x'?`` suffix when a close match exists, else ''."""
    close = difflib.get_close_matches(name, list(valid), n=1, cutoff=0.6)
    return f"; did you mean '{prefix}{close[0]}'?" if close else ""


def _type_name(tp: Any) -> str:
    origin = get_origin(tp)
    if origin is Literal:
        return " or ".join(repr(a) for a in get_args(tp))
    if origin in (list, tuple):
        return f"a list of {_type_name(get_args(tp)[0])}"
    if origin in (Union, types.UnionType):
        return " or ".join(_type_name(a) for a in get_args(tp) if a is not type(None))
    if dataclasses.is_dataclass(tp):
        return "a mapping"
    return {int: "an integer", float: "a number", str: "a string", bool: "true or false"}.get(
        tp, getattr(tp, "__name__", str(tp))
    )


def _convert(value: Any, tp: Any, source: str, key: str) -> Any:
    """Convert one YAML value to ``tp`` or raise a ConfigError naming the key."""
    origin = get_origin(tp)

    def bad() -> ConfigError:
        return ConfigError(f"{source}: key '{key}' must be {_type_name(tp)}, got {value!r} ({type(value).__name__})")

    if dataclasses.is_dataclass(tp):
        if not isinstance(value, dict):
            raise bad()
        return from_mapping(tp, value, source, prefix=f"{key}.")
    if origin in (Union, types.UnionType):
        args = [a for a in get_args(tp) if a is not type(None)]
        if value is None and len(args) < len(get_args(tp)):
            return None
        for arg in args:
            try:
                return _convert(value, arg, source, key)
            except ConfigError:
                continue
        raise bad()
    if origin is Literal:
        if isinstance(value, bool) and "no" in get_args(tp):
            # YAML 1.1 reads an unquoted no/yes as a boolean.
            value = "yes" if value else "no"
        if value not in get_args(tp):
            raise ConfigError(
                f"{source}: key '{key}' must be {_type_name(tp)}, got {value!r}"
                + suggestion(str(value), [str(a) for a in get_args(tp)])
            )
        return value
    if origin in (list, tuple):
        if not isinstance(value, (list, tuple)):
            raise bad()
        (item_type, *_) = get_args(tp)
        items = [_convert(v, item_type, source, f"{key}[{i}]") for i, v in enumerate(value)]
        return tuple(items) if origin is tuple else items
    if origin is dict or tp is dict:
        if not isinstance(value, dict):
            raise bad()
        return dict(value)
    if tp is Any:
        return value
    if tp is bool:
        if not isinstance(value, bool):
            raise bad()
        return value
    if tp is int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise bad()
        return value
    if tp is float:
        if isinstance(value, str) and FLOAT_WITHOUT_DOT.fullmatch(value.strip()):
            return float(value)  # YAML 1.1 reads 1e-4 (no dot) as a string
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise bad()
        return float(value)
    if tp is str:
        if not isinstance(value, str):
            raise bad()
        return value
    raise TypeError(f"unsupported config field type {tp!r} for '{key}'")


def from_mapping(cls: type[T], data: dict[str, Any], source: str, prefix: str = "") -> T:
    """Build dataclass ``cls`` from ``data``, rejecting unknown keys and wrong types.

    ``source`` names the file (or flag) the values came from, for error messages; ``prefix``
    is the dotted path of ``data`` inside that file.
    """
    hints = get_type_hints(cls)
    fields = {f.name: f for f in dataclasses.fields(cls) if f.init}
    for name in data:
        if name not in fields:
            raise ConfigError(f"{source}: unknown key '{prefix}{name}'" + suggestion(str(name), fields, prefix))
    kwargs = {}
    for name, field in fields.items():
        if name in data:
            kwargs[name] = _convert(data[name], hints[name], source, prefix + name)
        elif field.default is dataclasses.MISSING and field.default_factory is dataclasses.MISSING:
            raise ConfigError(f"{source}: missing required key '{prefix}{name}'")
    return cls(**kwargs)


def to_mapping(obj: Any) -> Any:
    """The plain-YAML form of a config dataclass (tuples become lists)."""
    if dataclasses.is_dataclass(obj):
        return {f.name: to_mapping(getattr(obj, f.name)) for f in dataclasses.fields(obj)}
    if isinstance(obj, (list, tuple)):
        return [to_mapping(v) for v in obj]
    if isinstance(obj, dict):
        return {k: to_mapping(v) for k, v in obj.items()}
    return obj


def field_type(cls: type, name: str, prefix: str = "") -> Any:
    """The declared type of field ``name`` of dataclass ``cls``, or KeyError with a hint;
    ``prefix`` is the dotted path of ``cls`` in the config, for the message."""
    hints = get_type_hints(cls)
    if name not in hints:
        raise KeyError(f"unknown key '{prefix}{name}'" + suggestion(name, hints, prefix))
    return hints[name]
