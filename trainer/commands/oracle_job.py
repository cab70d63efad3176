"""The main job (scripts/run_oracle.py): stage 1 then stage 2 of the oracle_text recipe, the
maximum-likelihood baseline, then the metric table and each stage-2 seed against the frontier."""

from __future__ import annotations

import argparse
import os
from collections.abc import Sequence
from pathlib import Path

from trainer.commands.cli import report
from trainer.commands.frontier import add_frontier_option
from trainer.contract.devices import DEVICE_HELP, DEVICES
from trainer.contract.errors import UserError
from trainer.contract.logs import configure_logging

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


def oracle_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="run_oracle", description="The main job: stage 1 then stage 2 of oracle_text, then the metric table."
    )
    p.add_argument("--stage1-config", default="configs/training/stage1.yaml")
    p.add_argument("--stage2-config", default="configs/training/stage2.yaml")
    p.add_argument("--output-dir", default="outputs/oracle")
    p.add_argument("--oracle", help="the oracle's safetensors file (data.oracle_path); default: a seeded oracle")
    p.add_argument("--full", action="store_true", help="the SeqGAN-size benchmark instead of the small default")
    p.add_argument("--device", default="auto", choices=DEVICES, help=DEVICE_HELP)
    p.add_argument("--resume", metavar="latest", help="continue an interrupted pipeline")
    p.add_argument("--overwrite", action="store_true", help="replace the runs of an earlier pipeline in --output-dir")
    p.add_argument(
        "--stage2-seeds",
        type=int,
        default=3,
        metavar="K",
        help="stage 2 from the same stage-1 pair with K seeds (training.seed, +1, ...); the table gives their mean",
    )
    p.add_argument("--goal", action="store_true", help="exit 1 unless every stage-2 seed lies beyond the frontier")
    add_frontier_option(p, "the temperatures of the frontier stage 2 must beat")
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="dotted.key=value")
    return p


def run_overrides(args: argparse.Namespace) -> list[str]:
    """The overrides every run of both stages gets: --full's sizes, --set, --oracle."""
    overrides = [*(FULL_SIZE if args.full else []), *args.overrides]
    if args.oracle:
        overrides.append(f"data.oracle_path={args.oracle}")
    return overrides


def main_oracle(argv: Sequence[str] | None = None) -> int:
    """scripts/run_oracle.py: stage 1 then stage 2 of oracle_text (every rank runs both), then
    the maximum-likelihood baseline, then on rank 0 the table, each seed against the frontier
    (``--frontier`` temperatures; ``--goal``: exit 1 unless every seed lies beyond it)."""
    args = oracle_parser().parse_args(argv)
    if args.stage2_seeds < 1:
        oracle_parser().error("--stage2-seeds must be at least 1")
    configure_logging()
    rank = os.environ.get("RANK", "0")
    overrides = run_overrides(args)
    from trainer.distributed.world import end_process_group

    try:
        from trainer.commands.stages import fit_pipeline

        result = fit_pipeline(
            args.stage1_config,
            args.stage2_config,
            args.output_dir,
            overrides,
            args.device,
            args.resume,
            args.overwrite,
            args.stage2_seeds,
            mle_baseline=True,
        )
    except UserError as exc:
        return report(exc, rank)
    finally:
        end_process_group()
    if result.stopped:
        if rank == "0":
            print(f"stopped by {result.stopped}; continue with --resume latest")
        return 0
    # Rank 0 alone from here, after the pipeline; no collective: printing and a local eval.
    if rank != "0":
        return 0
    import torch

    from trainer.commands.oracle_report import frontier_curves, frontier_report, oracle_table

    print(oracle_table(result, published=bool(args.oracle)))
    cuda = args.device == "cuda" or (args.device == "auto" and torch.cuda.is_available())
    out = Path(args.output_dir)
    curves = frontier_curves(out, args.stage1_config, overrides, args.frontier, "cuda" if cuda else "cpu")
    report_text, verdicts = frontier_report(result, curves, out)
    print(f"\n{report_text}")
    status = 1 if args.goal and not all(v.beyond for v in verdicts) else 0
    return status
