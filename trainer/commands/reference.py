"""The docs' reference pages, made from the code so that they cannot drift from it: every config
key and every built-in recipe's option from their dataclasses (type, default, and the ``#:``
comment above the field), every command's options from its ``--help``.

``python -m trainer.commands.reference`` rewrites ``docs/reference/``; tests/test_docs.py fails
when a page there differs from what this module makes.
"""

from __future__ import annotations

import ast
import dataclasses
import inspect
import json
import os
import subprocess
import sys
import textwrap
import types
import typing
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, Literal

from trainer.contract.config import Config
from trainer.contract.registry import BUILT_IN, task_class

ROOT = Path(__file__).resolve().parents[2]
#: the commands whose ``--help`` the CLI page shows: the console scripts' two, then scripts/
COMMANDS = (
    "train_stage1.py",
    "train_stage2.py",
    "run_oracle.py",
    "run_text.py",
    "doctor.py",
    "make_text_example.py",
    "convert_checkpoint.py",
    "plot_metrics.py",
    "fault_matrix.py",
)
#: the width argparse wraps ``--help`` to (it reads COLUMNS), so a page is the same everywhere
HELP_COLUMNS = "100"
GENERATED = "<!-- made by `python -m trainer.commands.reference` from the code: edit the code, not this page -->"


def field_comments(cls: type) -> dict[str, str]:
    """Each field's ``#:`` comment (its lines joined; empty without one), from the class that
    defines the field."""
    comments: dict[str, str] = {}
    for klass in reversed(cls.__mro__):
        if not dataclasses.is_dataclass(klass):
            continue
        lines, _ = inspect.getsourcelines(klass)
        body = ast.parse(textwrap.dedent("".join(lines))).body[0]
        assert isinstance(body, ast.ClassDef)
        for node in body.body:
            if not (isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name)):
                continue
            above, row = [], node.lineno - 2
            while row >= 0 and lines[row].strip().startswith("#:"):
                above.insert(0, lines[row].strip()[2:].strip())
                row -= 1
            comments[node.target.id] = " ".join(above)
    return comments


def type_name(tp: Any) -> str:
    """A field's type as the YAML reader sees it: ``int``, ``list of float``, ``a`` | ``b``."""
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if origin is Literal:
        return " \\| ".join(f"`{json.dumps(value)}`" for value in args)
    if origin in (types.UnionType, typing.Union):
        return " or ".join(type_name(arg) for arg in args)
    if origin is list:
        return f"list of {type_name(args[0])}"
    if origin is dict or tp is dict:
        return "mapping"
    if tp is Any:
        return "any"
    return tp.__name__


def default_text(field: dataclasses.Field) -> str:
    if field.default is not dataclasses.MISSING:
        value = field.default
    elif field.default_factory is not dataclasses.MISSING:
        value = field.default_factory()
    else:
        return ""
    return f"`{json.dumps(value)}`"


def rows(cls: type, prefix: str = "", own_only: bool = False) -> Iterator[str]:
    """A table row per key of dataclass ``cls`` (nested sections walked, their keys dotted);
    ``own_only``: the fields ``cls`` defines, not those it inherits. A key without a ``#:``
    comment is an error: every key a user can set is documented."""
    comments, hints = field_comments(cls), typing.get_type_hints(cls)
    own = set(cls.__dict__.get("__annotations__", {}))
    for field in dataclasses.fields(cls):
        if own_only and field.name not in own:
            continue
        tp = hints[field.name]
        if dataclasses.is_dataclass(tp):
            yield from rows(tp, f"{prefix}{field.name}.")  # a section: its comment is its keys'
            continue
        if not comments[field.name]:
            raise ValueError(f"{cls.__module__}.{cls.__qualname__}.{field.name} has no #: comment")
        meaning = comments[field.name].replace("|", "\\|")
        yield f"| `{prefix}{field.name}` | {type_name(tp)} | {default_text(field)} | {meaning} |"


def table(lines: Iterator[str]) -> str:
    return "\n".join(["| key | type | default | meaning |", "|---|---|---|---|", *lines])


def recipe_option_tables() -> Iterator[str]:
    """One table per options class of the built-in recipes, under the recipes that take it."""
    owners: dict[type, list[str]] = {}
    for name in BUILT_IN:
        for klass in task_class(name).Options.__mro__:
            if dataclasses.is_dataclass(klass):
                owners.setdefault(klass, []).append(name)
    shared_last = sorted(owners.items(), key=lambda item: len(item[1]) > 1)
    for klass, recipes in shared_last:
        title = f"`{recipes[0]}`" if len(recipes) == 1 else "Shared by " + " and ".join(f"`{r}`" for r in recipes)
        source = f"`{klass.__module__}.{klass.__qualname__}`"
        yield f"### {title}\n\nFrom {source}:\n\n{table(rows(klass, 'task_options.', own_only=True))}\n"


def model_config_tables() -> Iterator[str]:
    """The gaussian_mixture recipe's model configs (the transformers recipes take transformers'
    own config fields)."""
    from trainer.tasks.gaussian_mixture import DiscriminatorConfig, GeneratorConfig

    for role, klass in (("generator", GeneratorConfig), ("discriminator", DiscriminatorConfig)):
        yield f"### The {role} (`model.{role}_config`)\n\n{table(rows(klass))}\n"


def config_page() -> str:
    return "\n".join(
        [
            "# Config keys",
            "",
            GENERATED,
            "",
            "Every key of a training config, with its type and default; [Config](../config.md) says how a",
            "config is read, checked and overridden. A mapping's keys are dotted on the command line",
            "(`--set training.max_steps=10`).",
            "",
            "## The training config",
            "",
            table(rows(Config)),
            "",
            "## Each recipe's `task_options`",
            "",
            *recipe_option_tables(),
            "## The `gaussian_mixture` recipe's model configs",
            "",
            "The `text` and `oracle_text` recipes take a transformers config's own fields instead.",
            "",
            *model_config_tables(),
        ]
    )


def help_text(script: str) -> str:
    """``python scripts/SCRIPT --help``, as the command prints it."""
    env = {**os.environ, "COLUMNS": HELP_COLUMNS, "PYTHONPATH": str(ROOT)}
    done = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / script), "--help"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    if done.returncode != 0:
        raise RuntimeError(f"scripts/{script} --help exited {done.returncode}: {done.stderr.strip()[-500:]}")
    return done.stdout.rstrip()


def cli_page() -> str:
    parts = [
        "# Commands",
        "",
        GENERATED,
        "",
        "Every command's options, as its `--help` prints them. `trainer-stage1` and `trainer-stage2`",
        "(installed with the package) are `scripts/train_stage1.py` and `scripts/train_stage2.py`;",
        "under `accelerate launch` or `torchrun` each takes the same options after the script.",
        "[Outputs and exit codes](../outputs.md) says what a run writes and how it exits.",
        "",
    ]
    for script in COMMANDS:
        parts += [f"## `scripts/{script}`", "", "```", help_text(script), "```", ""]
    return "\n".join(parts)


#: each page of docs/reference/ and what makes it
PAGES: dict[str, Callable[[], str]] = {"config.md": config_page, "cli.md": cli_page}


def main() -> None:
    folder = ROOT / "docs" / "reference"
    folder.mkdir(exist_ok=True)
    for name, page in PAGES.items():
        (folder / name).write_text(page().rstrip() + "\n")
        print(f"wrote docs/reference/{name}")


if __name__ == "__main__":
    main()
