"""The built-in recipes (``task: text``, ``oracle_text``, ``gaussian_mixture``): each a
:class:`~trainer.contract.task.Task` subclass, the contract a user's recipe implements too.

``trainer.tasks.Task`` (with ``NoOptions`` and ``Penalties``) is the contract's earlier name, kept
for one release; ``from trainer import Task`` is the name to use."""

from trainer.contract.task import NoOptions, Penalties, Task

__all__ = ["NoOptions", "Penalties", "Task"]
