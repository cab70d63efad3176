"""The main job: stage 1 then stage 2 of the oracle_text recipe, then the metric table and each
stage-2 seed against the frontier (the stage-1 and maximum-likelihood generators over
temperatures).

    python scripts/run_oracle.py                      # small default size, CPU, 7 to 12 minutes
    python scripts/run_oracle.py --full               # the SeqGAN-size benchmark (hours on a CPU)
    python scripts/run_oracle.py --oracle ../shared/data/seqgan_oracle.safetensors

Runs as `python`, under `torchrun` and under `accelerate launch` (every rank runs both stages).
Outputs: OUTPUT/stage1 (generator_mle/, best/, ...), OUTPUT/stage2 (and stage2-seed-N/),
OUTPUT/stage2-mle (the maximum-likelihood baseline), OUTPUT/frontier.png; --resume latest
continues an interrupted pipeline. See trainer.commands.oracle_job.main_oracle.
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from trainer.commands.cli import exit_command  # noqa: E402
from trainer.commands.oracle_job import main_oracle  # noqa: E402

if __name__ == "__main__":
    exit_command(main_oracle())
