"""Check a machine or cluster before training: launch it exactly like training.

    accelerate launch --config_file accelerate_configs/8gpu.yaml scripts/doctor.py \
        --config configs/training/ring.yaml --device cuda

Per rank it prints host, rank, local rank and device; it fails on two ranks sharing a device,
times one round of all_reduce, all_gather, broadcast and barrier over the chosen backend,
checks that every rank can write to the output directory and that the configs parse. It ends
within ``--timeout`` seconds (a watchdog ends a rank that hangs) with one verdict line, and
exits non-zero on any failure.
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from trainer.commands.cli import exit_command  # noqa: E402
from trainer.distributed.doctor import main  # noqa: E402

if __name__ == "__main__":
    exit_command(main())
