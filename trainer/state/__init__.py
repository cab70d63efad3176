"""What a run keeps on disk and in memory beside its models: checkpoints and their integrity,
writes that survive a full or failing disk, initial weights, exports (``best/``, ``final/``),
the generator's average and LoRA adapters.
"""
