"""The main job: stage 1 then stage 2 of the oracle_text recipe, then the metric table.

    python scripts/run_oracle.py                      # small default size, CPU, ~10 minutes
    python scripts/run_oracle.py --full               # the SeqGAN-size benchmark (hours on a CPU)
    python scripts/run_oracle.py --oracle ../shared/data/seqgan_oracle.safetensors

Runs as `python`, under `torchrun` and under `accelerate launch` (every rank runs both stages).
Outputs: OUTPUT/stage1 (generator_mle/, best/, ...) and OUTPUT/stage2; --resume latest continues
an interrupted pipeline.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from trainer.cli import configure_logging, report  # noqa: E402
from trainer.errors import UserError  # noqa: E402
from trainer.runtime import end_process_group  # noqa: E402

#: --full: the SeqGAN protocol's scale (a 10,000-sequence corpus, a larger generator trained
#: by maximum likelihood for about 100 epochs, a longer adversarial stage)
FULL_SIZE = [
    "stage1.generator.training.max_steps=15000",
    "stage1.generator.training.eval_every=1000",
    "stage1.discriminator.training.max_steps=2000",
    "stage1.discriminator.training.eval_every=500",
    "training.max_steps=3000",
    "training.eval_every=250",
    "data.eval_size=5000",
]


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="run_oracle", description=__doc__.split("\n\n")[0])
    p.add_argument("--stage1-config", default="configs/training/stage1.yaml")
    p.add_argument("--stage2-config", default="configs/training/stage2.yaml")
    p.add_argument("--output-dir", default="outputs/oracle")
    p.add_argument("--oracle", help="the oracle's safetensors file (data.oracle_path); default: a seeded oracle")
    p.add_argument("--full", action="store_true", help="the SeqGAN-size benchmark instead of the small default")
    p.add_argument("--device", default="auto", choices=["auto", "cpu", "cuda"])
    p.add_argument("--resume", metavar="latest", help="continue an interrupted pipeline")
    p.add_argument("--overwrite", action="store_true", help="replace the runs of an earlier pipeline in --output-dir")
    p.add_argument("--goal", action="store_true", help="exit 1 unless stage 2 meets the benchmark goal")
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="dotted.key=value")
    return p


def run_overrides(args: argparse.Namespace) -> list[str]:
    """The overrides every run of both stages gets: --full's sizes, --set, --oracle."""
    overrides = [*(FULL_SIZE if args.full else []), *args.overrides]
    if args.oracle:
        overrides.append(f"data.oracle_path={args.oracle}")
    return overrides


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    configure_logging()
    rank = os.environ.get("RANK", "0")
    overrides = run_overrides(args)
    try:
        from trainer.stages import benchmark_goal, fit_pipeline, oracle_table

        result = fit_pipeline(
            args.stage1_config, args.stage2_config, args.output_dir, overrides, args.device, args.resume, args.overwrite
        )
    except UserError as exc:
        return report(exc, rank)
    finally:
        end_process_group()
    if rank == "0":
        if result.stopped:
            print(f"stopped by {result.stopped}; continue with --resume latest")
            return 0
        print(oracle_table(result, published=bool(args.oracle)))
    if args.goal and not result.stopped:
        met, verdict = benchmark_goal(result)
        if rank == "0":
            print(verdict)
        return 0 if met else 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
