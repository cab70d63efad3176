"""The config's ``task:``: a built-in recipe's name or ``package.module:Class``, resolved to a
Task subclass. The built-in recipes are named by their import path, imported on first use: the
contract knows the recipes by name only, and no module below them imports them."""

from __future__ import annotations

import importlib

from trainer.contract.config import RunConfig
from trainer.contract.config.schema import suggestion
from trainer.contract.errors import ConfigError
from trainer.contract.task import Task

BUILT_IN = {
    "gaussian_mixture": "trainer.tasks.gaussian_mixture:GaussianMixtureTask",
    "oracle_text": "trainer.tasks.oracle_text:OracleTextTask",
    "text": "trainer.tasks.text:TextTask",
}


def task_class(name: str, source: str = "config") -> type[Task]:
    """Resolve a built-in recipe name or ``package.module:Class`` to a Task subclass."""
    target = BUILT_IN.get(name, name)
    if ":" not in target:
        raise ConfigError(
            f"{source}: key 'task' is {name!r}, neither a built-in recipe "
            f"({', '.join(BUILT_IN)}) nor package.module:Class" + suggestion(name, BUILT_IN)
        )
    module_name, _, class_name = target.partition(":")
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise ConfigError(f"{source}: key 'task': cannot import {module_name!r}: {exc}") from None
    cls = getattr(module, class_name, None)
    if not (isinstance(cls, type) and issubclass(cls, Task)):
        raise ConfigError(f"{source}: key 'task': {target!r} is not a subclass of trainer.Task")
    return cls


def load_task(run: RunConfig) -> Task:
    """Instantiate the configured task (this also checks its options and model configs)."""
    return task_class(run.config.task, run.source)(run)
