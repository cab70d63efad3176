"""The ground floor: what a recipe implements and what every layer reads. The Task interface
(:mod:`~trainer.contract.task`), the recipe registry, the config (its sections, loading, schema and
the model configs), the errors (each one line to the user), logging, the losses and the learning
rate schedules. It imports no other layer.
"""
