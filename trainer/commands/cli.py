"""Command lines of stage 1 and stage 2: the same flags under python, torchrun and accelerate
launch; the end of a command's process (see :func:`exit_command`)."""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import NoReturn

from trainer.contract.devices import DEVICE_HELP, DEVICES
from trainer.contract.errors import ConfigError, UserError, print_error_line
from trainer.contract.logs import configure_logging

#: the default of --config: the oracle_text recipe (its paths are relative to the project root)
STAGE_CONFIGS = {
    1: Path("configs/training/stage1.yaml"),
    2: Path("configs/training/stage2.yaml"),
}


def parser(stage: int = 2) -> argparse.ArgumentParser:
    description = {
        1: "Stage 1: pre-train the generator by maximum likelihood, then the discriminator against it.",
        2: "Stage 2: adversarial training of a generator against a discriminator.",
    }[stage]
    p = argparse.ArgumentParser(prog=f"train_stage{stage}", description=description)
    p.add_argument("--config", help=f"training config (YAML; default: a checkout's {STAGE_CONFIGS[stage]})")
    p.add_argument("--generator-config", help="generator model config (default: model.generator_config)")
    p.add_argument("--discriminator-config", help="discriminator model config (default: model.discriminator_config)")
    p.add_argument("--device", default="auto", choices=DEVICES, help=DEVICE_HELP)
    p.add_argument("--output-dir", help="where outputs go (overrides output_dir)")
    p.add_argument("--resume", metavar="latest|PATH", help="continue from a checkpoint")
    p.add_argument(
        "--overwrite",
        action="store_true",
        help="start anew in an output directory that holds an earlier run: its checkpoints, "
        "metrics.jsonl, best/ and final/ are deleted first",
    )
    p.add_argument(
        "--debug",
        action="store_true",
        help="a run to step through: 4 steps, eval and save at step 2, no watchdog, workers 0, "
        "autograd anomaly detection, outputs in OUTPUT-debug, replaced at each run (--set still overrides)",
    )
    p.add_argument(
        "--set",
        dest="overrides",
        action="append",
        default=[],
        metavar="dotted.key=value",
        help="override a config value (repeatable)",
    )
    return p


def main(argv: Sequence[str] | None = None, stage: int = 2) -> int:
    """Run stage 2 (or stage 1); returns the exit status (0, or non-zero with one line on stderr)."""
    args = parser(stage).parse_args(argv)
    configure_logging()
    try:
        return run_stage(args, stage)
    finally:
        from trainer.distributed.world import end_process_group

        end_process_group()


def run_stage(args: argparse.Namespace, stage: int) -> int:
    """The body of :func:`main`, once the arguments are read."""
    rank = os.environ.get("RANK", "0")
    try:
        # Imported here so that --help and config errors stay fast and touch no device.
        from trainer.commands.stages import fit_stage1
        from trainer.contract.config import DEBUG_OVERRIDES, DEBUG_SUFFIX, load_config
        from trainer.training.loop import Trainer

        config = args.config or STAGE_CONFIGS[stage]
        if args.config is None and not config.is_file():
            raise ConfigError(
                f"no --config given, and the default {config} is not in the working directory "
                f"(the trainer's checkout has it): pass --config FILE"
            )
        overrides, overwrite, suffix = args.overrides, args.overwrite, ""
        if args.debug:
            # outputs beside the configured ones (OUTPUT-debug), replaced by each debug run
            overrides, overwrite, suffix = [*DEBUG_OVERRIDES, *overrides], overwrite or not args.resume, DEBUG_SUFFIX
            _detect_anomalies()
        flags = {
            "config": config,
            "overrides": overrides,
            "generator_config": args.generator_config,
            "discriminator_config": args.discriminator_config,
            "output_dir": args.output_dir,
            "output_suffix": suffix,
        }
        if stage == 1:
            result = fit_stage1(**flags, device=args.device, resume=args.resume, overwrite=overwrite)
            metrics, stopped = result.metrics, result.stopped
        else:
            trainer = Trainer(load_config(**flags), args.device, args.resume, overwrite)
            metrics, stopped = trainer.fit(), trainer.stopped
    except UserError as exc:
        return report(exc, rank)
    except Exception as exc:
        return failure_status(exc)
    if rank == "0":
        if stopped:
            print(f"stopped by {stopped} after saving a checkpoint; continue with --resume latest")
        else:
            print(json.dumps({"final_eval": metrics}))
    return 0


def _detect_anomalies() -> None:
    """--debug: autograd's anomaly detection (a backward error names the forward op)."""
    import torch

    torch.autograd.set_detect_anomaly(True)


def report(exc: UserError, rank: str) -> int:
    """Print the one error line of ``exc``; returns its exit status. An error on this rank
    alone is posted for the other ranks too (see :mod:`trainer.distributed.peer_watch`)."""
    line = f"error (rank {rank}): {exc}"
    if not exc.agreed:
        from trainer.distributed.peer_watch import report_failure

        code = report_failure(exc, lambda: print_error_line(line))
        # another rank failed first: this rank printed one line naming it, not its own
        return exc.exit_code if code is None else code
    print_error_line(line)
    # Every rank fails here; wait until all have said why before the launcher, seeing the
    # first exit, ends the others.
    from trainer.distributed.collectives import process_group_barrier

    process_group_barrier("after every rank's error line")
    return exc.exit_code


def failure_status(exc: Exception) -> int:
    """The exit status of an error that is not bad input: the failing rank prints its traceback
    (through ``sys.excepthook``, which torch prefixes with the rank) and posts it for the other
    ranks, status 1; a rank whose error follows a peer's failure (a closed socket) prints one
    line naming that peer instead, and takes its status."""
    from trainer.distributed.peer_watch import report_failure

    code = report_failure(exc, lambda: sys.excepthook(type(exc), exc, exc.__traceback__))
    return 1 if code is None else code


def main_stage1(argv: Sequence[str] | None = None) -> int:
    """Run stage 1 (see :mod:`trainer.commands.stages`)."""
    return main(argv, stage=1)


def exit_command(status: int) -> NoReturn:
    """End a command's process with ``status``: through :func:`trainer.distributed.world.exit_process`
    once the run's modules are loaded (a process group may have run), else at once (a config
    error or --help stays fast)."""
    if "trainer.distributed.world" in sys.modules:
        from trainer.distributed.world import exit_process

        exit_process(status)
    sys.exit(status)


def stage1_command() -> NoReturn:
    """The ``trainer-stage1`` command (scripts/train_stage1.py)."""
    exit_command(main_stage1())


def stage2_command() -> NoReturn:
    """The ``trainer-stage2`` command (scripts/train_stage2.py)."""
    exit_command(main())


if __name__ == "__main__":
    stage2_command()
