"""Stage-1 pre-training (the generator by maximum likelihood, then the discriminator); runs as
`python`, under `torchrun` and under `accelerate launch`."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from trainer.commands.cli import stage1_command  # noqa: E402

if __name__ == "__main__":
    stage1_command()
