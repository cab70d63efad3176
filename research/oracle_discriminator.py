"""Does an oracle_text discriminator rate quality beyond what its generator's likelihood knows?

    python research/oracle_discriminator.py outputs/oracle/stage1/best
    python research/oracle_discriminator.py outputs/oracle/stage2/final --samples 8000

A stage 2 that follows a discriminator's ratings can beat the generator's temperature frontier
only if the ratings tell good sequences from bad beyond what the generator's own log-likelihood
already tells (a lower temperature favours exactly the sequences the generator finds likely).
On samples of the pair's generator this prints the correlation of the discriminator's rating
with the oracle's log-likelihood (quality), the generator's own, and the partial correlation of
the rating with quality given the generator's log-likelihood: near 0, the ratings add nothing a
temperature does not give. Each row: over all samples, then over each --chunk of them (the
spread from one sample set to the next).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from trainer.commands.cli import report  # noqa: E402
from trainer.commands.oracle_report import QUALITY_ROWS, command_overrides, discriminator_quality  # noqa: E402
from trainer.contract.errors import ConfigError, UserError  # noqa: E402
from trainer.contract.logs import configure_logging  # noqa: E402


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="oracle_discriminator", description=__doc__.split("\n\n")[0])
    p.add_argument("pair", help="a directory holding generator/ and discriminator/, e.g. OUTPUT/stage1/best")
    p.add_argument("--config", default="configs/training/stage2.yaml", help="the recipe's options")
    p.add_argument("--oracle", help="the oracle's safetensors file (data.oracle_path); default: the seeded oracle")
    p.add_argument("--samples", type=int, default=4000)
    p.add_argument("--chunk", type=int, default=1000)
    p.add_argument("--seed", type=int, default=0, help="the sampling's seed")
    p.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="dotted.key=value")
    return p


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    configure_logging()
    try:
        overrides = command_overrides(args.overrides, args.oracle, args.device)
        if not 0 < args.chunk <= args.samples:
            raise ConfigError(f"--chunk {args.chunk}: needs 0 < chunk <= --samples {args.samples}")
        rows = discriminator_quality(
            args.pair, args.config, overrides, args.samples, args.chunk, args.device, args.seed
        )
    except UserError as exc:
        return report(exc, "0")
    print(f"{args.samples} sequences of the generator in {args.pair} (temperature 1): all, then each {args.chunk}")
    width = max(map(len, QUALITY_ROWS.values()))
    for key, label in QUALITY_ROWS.items():
        values = rows[key]
        print(f"{label:{width}} {values[0]:7.3f}   " + " ".join(f"{v:.3f}" for v in values[1:]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
