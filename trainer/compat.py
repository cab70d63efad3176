"""The modules' earlier names (before the layer packages), kept for one release in this one
place: ``import trainer.errors`` or ``from trainer.tasks.base import Task`` in a user's recipe
still works, gives the module under its new name, and warns once with that name.

:data:`MOVED` is the whole list; the next release removes this module."""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import sys
import warnings
from types import ModuleType

#: earlier name -> the module's name now (a package's submodules follow it)
MOVED = {
    **{f"trainer.{name}": f"trainer.contract.{name}" for name in ("errors", "logs", "losses", "schedules", "config")},
    "trainer.tasks.base": "trainer.contract.task",
    **{
        f"trainer.{name}": f"trainer.distributed.{name}"
        for name in ("process_group", "watchdog", "collectives", "peer_watch", "stop_signals", "world", "sharding")
    },
    "trainer.doctor": "trainer.distributed.doctor",
    **{
        f"trainer.{name}": f"trainer.state.{name}"
        for name in ("storage", "integrity", "checkpoint", "weights", "exports", "ema", "adapters")
    },
    **{
        f"trainer.{name}": f"trainer.training.{name}"
        for name in ("loop", "phases", "evaluation", "outputs", "run_parts", "sample_order", "batch_norm", "metrics")
    },
    **{
        f"trainer.{name}": f"trainer.commands.{name}"
        for name in ("cli", "api", "stages", "oracle_job", "frontier", "text_example")
    },
    "trainer.tasks.oracle_report": "trainer.commands.oracle_report",
}


def new_name(name: str) -> str | None:
    """The module's name now, for an earlier name (or one of a moved package's submodules)."""
    for old, new in MOVED.items():
        if name == old or name.startswith(f"{old}."):
            return new + name[len(old) :]
    return None


class MovedModules(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Imports an earlier name as the module under its new name (one module, two names)."""

    def find_spec(self, name: str, path: object = None, target: ModuleType | None = None):
        if not name.startswith("trainer.") or new_name(name) is None:
            return None
        return importlib.machinery.ModuleSpec(name, self)

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> None:
        return None  # a placeholder; exec_module puts the real module in its place

    def exec_module(self, module: ModuleType) -> None:
        now = new_name(module.__name__)
        warnings.warn(
            f"{module.__name__} is now {now}; the earlier name goes in the next release",
            DeprecationWarning,
            stacklevel=2,
        )
        # the import system returns what sys.modules holds under the name once this returns
        sys.modules[module.__name__] = importlib.import_module(now)


def install() -> None:
    """Put the finder ahead of the path's (idempotent)."""
    if not any(isinstance(finder, MovedModules) for finder in sys.meta_path):
        sys.meta_path.insert(0, MovedModules())
