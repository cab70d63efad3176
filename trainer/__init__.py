"""trainer: stage-2 adversarial training on Hugging Face Accelerate that cannot deadlock.

Importing the package touches no device and imports no heavy library: the API below is
loaded on first use.

- :func:`load_config`: the training config and both model configs (overrides as a dict)
- :class:`Trainer`: ``Trainer(run, device).fit()`` in this process; ``.evaluate(source)``
- :func:`launch`: N processes through accelerate's ``notebook_launcher``
- :func:`fit_stage1`, :func:`fit_pipeline`: stage 1, and stage 1 then stage 2
- :class:`Task`: the base class of recipes (``task: package.module:Class``)
"""

from __future__ import annotations

import importlib
from typing import Any

from trainer import compat

__version__ = "0.1.0"

compat.install()  # the modules' earlier names, for one release

_API = {
    "load_config": "trainer.contract.config",
    "Trainer": "trainer.training.loop",
    "launch": "trainer.commands.api",
    "fit_stage1": "trainer.commands.stages",
    "fit_pipeline": "trainer.commands.stages",
    "Task": "trainer.contract.task",
}

__all__ = [*_API, "__version__"]


def __getattr__(name: str) -> Any:
    if name in _API:
        return getattr(importlib.import_module(_API[name]), name)
    raise AttributeError(f"module 'trainer' has no attribute {name!r}")
