"""The SeqGAN synthetic-data benchmark: stage 1 then stage 2 of oracle_text on a given oracle.

    python scripts/bench_oracle.py ../shared/data/seqgan_oracle.safetensors [--full] [run_oracle flags]

Vocabulary 5000, length 20, 10,000 training sequences sampled from the oracle. Prints
nll_oracle and nll_test after stage 1 and after stage 2 beside the published values (MLE 9.038,
SeqGAN 8.736) and checks the goal: stage 2 lowers nll_oracle by at least 3% relative to stage 1
while nll_test rises by at most 5%. Then, as the baseline stage 2 has to beat, the stage-1
generator's eval at lower temperatures (scripts/oracle_frontier.py). Without --full the model
and step counts are the main job's small ones (minutes on a CPU); --full is the SeqGAN scale.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

from oracle_frontier import frontier, table  # noqa: E402
from run_oracle import main, parser, run_overrides  # noqa: E402

if __name__ == "__main__":
    args = sys.argv[1:]
    if not args or args[0].startswith("-"):
        sys.exit("usage: bench_oracle.py ORACLE.safetensors [--full] [run_oracle flags]")
    argv = ["--oracle", args[0], "--output-dir", "outputs/bench_oracle", "--goal", *args[1:]]
    status = main(argv)
    pipeline = parser().parse_args(argv)
    generator = Path(pipeline.output_dir) / "stage1" / "best" / "generator"
    # Rank 0 alone, after the pipeline (0: goal met, 1: not met); no collective: a local eval.
    if os.environ.get("RANK", "0") == "0" and status in (0, 1) and generator.is_dir():
        cuda = pipeline.device == "cuda" or (pipeline.device == "auto" and torch.cuda.is_available())
        temperatures = [1.0, 0.9, 0.85, 0.8]
        rows = frontier(
            str(generator), pipeline.stage1_config, run_overrides(pipeline), temperatures, "cuda" if cuda else "cpu"
        )
        print(f"\nthe stage-1 generator at lower temperatures (no training):\n{table(rows)}")
    sys.exit(status)
