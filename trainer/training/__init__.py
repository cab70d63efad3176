"""The loop: :class:`~trainer.training.loop.Trainer` and what one optimizer step is (phases), the
eval, what a run writes as it goes (outputs, metrics), the parts a run is built from, the
sample order and BatchNorm statistics.
"""
