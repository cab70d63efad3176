"""The quality-diversity frontier of an oracle_text generator: its eval at several temperatures.

    python research/oracle_frontier.py outputs/oracle/stage1/best/generator
    python research/oracle_frontier.py outputs/bench_oracle/stage1/best/generator \\
        --oracle ../shared/data/seqgan_oracle.safetensors --temperatures 1 0.9 0.8

Sampling below temperature 1 trades diversity (nll_test rises) for quality (nll_oracle falls)
with no training at all, so it is the baseline a stage 2 has to beat: a stage-2 generator is
better than its stage-1 generator only if no temperature of the stage-1 generator reaches its
nll_oracle at an nll_test as low. Each row is the recipe's own eval (the eval sequences and
their fixed uniform numbers, `task_options.eval_temperature` set to the row's temperature), on
one process.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from trainer.commands.cli import report  # noqa: E402
from trainer.commands.frontier import temperature_argument  # noqa: E402
from trainer.commands.oracle_report import command_overrides, frontier, table  # noqa: E402
from trainer.contract.errors import UserError  # noqa: E402
from trainer.contract.logs import configure_logging  # noqa: E402


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="oracle_frontier", description=__doc__.split("\n\n")[0])
    p.add_argument("generator", help="a generator's save_pretrained directory, e.g. OUTPUT/stage1/best/generator")
    p.add_argument("--config", default="configs/training/stage1.yaml", help="the recipe's options, data and eval")
    p.add_argument("--oracle", help="the oracle's safetensors file (data.oracle_path); default: the seeded oracle")
    p.add_argument("--temperatures", type=temperature_argument, nargs="+", default=[1.0, 0.95, 0.9, 0.85, 0.8])
    p.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="dotted.key=value")
    return p


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    configure_logging()
    try:
        overrides = command_overrides(args.overrides, args.oracle, args.device)
        rows = frontier(args.generator, args.config, overrides, args.temperatures, args.device)
    except UserError as exc:
        return report(exc, "0")
    print(table(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
