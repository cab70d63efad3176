"""The doctor: start-up checks of a (multi-)process world, run with the training launcher.

Every rank runs every check in the same order, so the collectives line up; a check's
failure on any rank is agreed (one all-gather) and reported by every rank.
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Sequence
from pathlib import Path

from trainer.contract.devices import DEVICE_HELP, DEVICES
from trainer.contract.errors import UserError, print_error_line


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="doctor", description="Check the launch, devices and collectives before training.")
    p.add_argument("--config", help="training config to parse (optional)")
    p.add_argument("--generator-config")
    p.add_argument("--discriminator-config")
    p.add_argument("--device", default="auto", choices=DEVICES, help=DEVICE_HELP)
    p.add_argument("--output-dir", help="directory every rank must be able to write (default: the config's)")
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="dotted.key=value")
    p.add_argument("--timeout", type=float, default=120.0, help="seconds before a hanging rank gives up")
    p.add_argument("--size-mb", type=float, default=16.0, help="size of the timed all_reduce")
    return p


def main(argv: Sequence[str] | None = None) -> int:
    args = parser().parse_args(argv)
    rank = os.environ.get("RANK", "0")
    try:
        return run(args)
    except UserError as exc:
        print_error_line(f"error (rank {rank}): {exc}")
        print(f"doctor (rank {rank}): FAILED", flush=True)
        return 1
    finally:
        from trainer.distributed.world import end_process_group

        end_process_group()


def run(args: argparse.Namespace) -> int:
    import torch.distributed as dist

    from trainer.contract.config import Config, load_config
    from trainer.distributed import collectives, world
    from trainer.distributed.watchdog import HEARTBEAT, Watchdog

    config_problem = ""
    cfg = Config()
    if args.config:
        try:
            cfg = load_config(
                args.config,
                args.overrides,
                generator_config=args.generator_config,
                discriminator_config=args.discriminator_config,
                output_dir=args.output_dir,
            ).config
        except UserError as exc:
            config_problem = str(exc)
    output_dir = Path(args.output_dir or cfg.output_dir)
    cfg.distributed.timeout_s = args.timeout
    accelerator = world.build_accelerator(cfg, args.device, None)
    me = accelerator.process_index
    problems: list[str] = []

    def say(text: str) -> None:
        print(f"doctor (rank {me}): {text}", flush=True)

    def check(name: str, local_problem: str) -> None:
        """Agree on one check: every rank learns which ranks failed it."""
        failed = collectives.ranks_with(accelerator, bool(local_problem), f"doctor: {name}")
        if local_problem:
            say(f"{name}: FAILED: {local_problem}")
        if failed:
            problems.append(f"{name} failed on rank(s) {', '.join(map(str, failed))}")
        else:
            say(f"{name}: ok")

    with Watchdog(args.timeout, output_dir, me), HEARTBEAT.inside("the doctor's checks"):
        say(world.describe_rank(accelerator))
        say(
            f"world {accelerator.num_processes} ({accelerator.distributed_type.value}), backend "
            f"{dist.get_backend() if dist.is_initialized() else 'none'}"
        )
        check("configs parse", config_problem)

        devices = world.device_map(accelerator)
        if accelerator.is_main_process:
            for host, rank, identity, _ in devices:
                say(f"device map: rank {rank} on {host}: {identity}")
        check("one device per rank", world.shared_devices(devices))

        if accelerator.num_processes > 1:
            timings, bad_sum = collectives.timed_round(accelerator, args.size_mb)
            for name, ms in timings:
                say(f"{name}: {ms:.1f} ms")
            check("all_reduce result", bad_sum)

        check("output directory writable", writable(output_dir, me))
    verdict = "OK" if not problems else "FAILED: " + "; ".join(problems)
    say(f"verdict: {verdict}")
    return 0 if not problems else 1


def writable(directory: Path, rank: int) -> str:
    probe = directory / f".doctor-rank{rank}"
    try:
        directory.mkdir(parents=True, exist_ok=True)
        probe.write_text("ok")
        probe.unlink()
    except OSError as exc:
        return f"{directory}: {exc.strerror or exc}"
    return ""
