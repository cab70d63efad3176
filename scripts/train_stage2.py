"""Stage-2 training; runs as `python`, under `torchrun` and under `accelerate launch`."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from trainer.commands.cli import stage2_command  # noqa: E402

if __name__ == "__main__":
    stage2_command()
