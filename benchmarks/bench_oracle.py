"""The SeqGAN synthetic-data benchmark: stage 1 then stage 2 of oracle_text on a given oracle.

    python benchmarks/bench_oracle.py ../shared/data/seqgan_oracle.safetensors [--full] [run_oracle flags]

Vocabulary 5000, length 20, 10,000 training sequences sampled from the oracle. Prints
nll_oracle and nll_test after stage 1 and after stage 2 beside the published values (MLE 9.038,
SeqGAN 8.736), then each stage-2 seed against the frontier (the stage-1 generator and the
maximum-likelihood baseline at temperatures 1.2 to 0.6), and exits 1 unless every seed lies
beyond it (run_oracle's --goal). Without --full the model and step counts are the main job's
small ones (minutes on a CPU); --full is the SeqGAN scale.
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from trainer.commands.oracle_job import main_oracle  # noqa: E402

if __name__ == "__main__":
    args = sys.argv[1:]
    if not args or args[0].startswith("-"):
        sys.exit("usage: bench_oracle.py ORACLE.safetensors [--full] [run_oracle flags]")
    output = ["--output-dir", "outputs/bench_oracle"]
    sys.exit(main_oracle(["--oracle", args[0], *output, "--goal", *args[1:]]))
