"""Command line of stage 2: the same flags under python, torchrun and accelerate launch."""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
from collections.abc import Sequence

from trainer.errors import UserError, print_error_line


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="train_stage2",
        description="Stage-2 adversarial training of a generator against a discriminator.",
    )
    p.add_argument("--config", required=True, help="training config (YAML)")
    p.add_argument("--generator-config", help="generator model config (default: model.generator_config)")
    p.add_argument("--discriminator-config", help="discriminator model config (default: model.discriminator_config)")
    p.add_argument("--device", default="auto", choices=["auto", "cpu", "cuda"])
    p.add_argument("--output-dir", help="where outputs go (overrides output_dir)")
    p.add_argument("--resume", metavar="latest|PATH", help="continue from a checkpoint")
    p.add_argument(
        "--set",
        dest="overrides",
        action="append",
        default=[],
        metavar="dotted.key=value",
        help="override a config value (repeatable)",
    )
    return p


def main(argv: Sequence[str] | None = None) -> int:
    """Run stage 2; returns the exit status (0, or 2 for bad input with one line on stderr)."""
    args = parser().parse_args(argv)
    logging.basicConfig(format="%(asctime)s %(levelname)s %(name)s: %(message)s", level=logging.INFO)
    rank = os.environ.get("RANK", "0")
    try:
        # Imported here so that --help and config errors stay fast and touch no device.
        from trainer.config import load_config
        from trainer.loop import Trainer

        run = load_config(
            args.config,
            args.overrides,
            generator_config=args.generator_config,
            discriminator_config=args.discriminator_config,
            output_dir=args.output_dir,
        )
        trainer = Trainer(run, device=args.device, resume=args.resume)
        metrics = trainer.fit()
    except UserError as exc:
        print_error_line(f"error (rank {rank}): {exc}")
        if exc.agreed:
            # Every rank fails here; wait until all have said why before the launcher,
            # seeing the first exit, ends the others.
            import torch.distributed as dist

            if dist.is_initialized():
                dist.barrier()
        return exc.exit_code
    if rank == "0":
        if trainer.stopped:
            print(f"stopped by {trainer.stopped} after saving a checkpoint; continue with --resume latest")
        else:
            print(json.dumps({"final_eval": metrics}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
