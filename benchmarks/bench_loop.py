"""The trainer against a plain-torch loop with the same models, data and math, in one run.

Both run the ring recipe's default models (G: 4 x 400, D: 3 x 200, PacGAN2), batch 100 per
process, Adam, the non-saturating loss, one D phase and one G phase per step; the plain loop
is what one would write by hand (a tensor of points indexed per rank, DDP forward/backward,
the torch optimizers), and carries none of the trainer's checks.

Steps/s and the ratio: both loops run in the same process (one per rank), on the same
prepared models and optimizers, alternating blocks of ``--block`` steps for ``--rounds``
rounds: a plain block, then a block of the trainer's own step loop. The ratio is the median
of the per-round ratios. Runs of the same command in separate processes differ by up to 10%
on a shared machine; alternating short blocks in one process cancels that.
Peak memory: each loop alone in its own short run (the paired process holds both).
All processes run with glibc's malloc thresholds fixed (MALLOC_MMAP_THRESHOLD_,
MALLOC_TRIM_THRESHOLD_): with the defaults, how often freed tensors go back to the system and
fault in again varies by process, from 4 to 250 page faults per step for either loop.

    python benchmarks/bench_loop.py [--rounds 150] [--block 20] [--processes 1 2] [--device cpu]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from harness.launch import launch_command, launch_env, records  # noqa: E402

BATCH, PACKING, TRAIN_SIZE = 100, 2, 100_000
MALLOC_ENV = {"MALLOC_MMAP_THRESHOLD_": str(2**30), "MALLOC_TRIM_THRESHOLD_": str(2**30)}


class PlainLoop:
    """The hand-written loop: one D step (real vs generated) then one G step per iteration."""

    def __init__(self, g: Any, d: Any, opt_g: Any, opt_d: Any, data: Any, rank: int, world: int, device: Any) -> None:
        import torch

        # g and d may be DDP-wrapped; the G step goes through the unwrapped D with its parameters frozen
        self.g, self.d, self.opt_g, self.opt_d = g, d, opt_g, opt_d
        self.g_bare, self.d_bare = getattr(g, "module", g), getattr(d, "module", d)
        self.data, self.rank, self.world, self.device = data, rank, world, device
        self.noise = torch.Generator(device=device).manual_seed(rank + 1)
        self.order = torch.Generator().manual_seed(0)
        self.batches: list[Any] = []
        self.done = 0

    def next_real(self) -> Any:
        import torch

        if not self.batches:
            perm = torch.randperm(TRAIN_SIZE, generator=self.order)
            usable = TRAIN_SIZE // (BATCH * self.world) * BATCH * self.world
            self.batches.extend(perm[:usable].view(-1, self.world, BATCH)[:, self.rank].unbind(0))
        return self.data[self.batches.pop()].to(self.device)

    def steps(self, count: int) -> None:
        import torch
        import torch.nn.functional as F

        def score(model: torch.nn.Module, x: torch.Tensor) -> torch.Tensor:
            return model(x.reshape(-1, 2 * PACKING)).reshape(-1)

        for _ in range(count):
            real = self.next_real()
            with torch.no_grad():
                fake = self.g_bare(torch.randn(BATCH, 2, generator=self.noise, device=self.device))
            real_scores, fake_scores = score(self.d, torch.cat([real, fake])).chunk(2)
            d_loss = F.softplus(-real_scores).mean() + F.softplus(fake_scores).mean()
            self.opt_d.zero_grad(set_to_none=True)
            d_loss.backward()
            self.opt_d.step()
            self.d_bare.requires_grad_(False)
            fake = self.g(torch.randn(BATCH, 2, generator=self.noise, device=self.device))
            g_loss = F.softplus(-score(self.d_bare, fake)).mean()
            self.opt_g.zero_grad(set_to_none=True)
            g_loss.backward()
            self.opt_g.step()
            self.d_bare.requires_grad_(True)
        self.done += count


def plain_alone(steps: int, device_name: str, result: Path) -> None:
    """The plain loop in a process of its own, as a user would run it (for peak memory)."""
    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP

    from trainer.distributed.world import peak_memory_mb
    from trainer.tasks.gaussian_mixture import mlp, sample_mixture

    world = int(os.environ.get("WORLD_SIZE", "1"))
    rank = int(os.environ.get("RANK", "0"))
    device = torch.device(device_name if device_name == "cpu" else f"cuda:{int(os.environ.get('LOCAL_RANK', '0'))}")
    if world > 1:
        dist.init_process_group("gloo" if device.type == "cpu" else "nccl")
    torch.manual_seed(0)
    g, d = mlp(2, 400, 4, 2).to(device), mlp(2 * PACKING, 200, 3, 1).to(device)
    if world > 1:
        g, d = DDP(g), DDP(d)
    opt_g = torch.optim.Adam(g.parameters(), lr=1e-4, betas=(0.5, 0.999))
    opt_d = torch.optim.Adam(d.parameters(), lr=1e-4, betas=(0.5, 0.999))
    PlainLoop(g, d, opt_g, opt_d, sample_mixture("ring", TRAIN_SIZE, 0), rank, world, device).steps(steps)
    if rank == 0:
        result.write_text(json.dumps({"peak_memory_mb": peak_memory_mb(device)}))
    if world > 1:
        dist.destroy_process_group()


def ring_overrides(steps: int, output_dir: Path) -> list[str]:
    """The ring recipe for ``steps`` steps, with no eval, checkpoint or log inside them."""
    return [
        f"training.max_steps={steps}", f"training.log_every={steps}", f"training.eval_every={steps}",
        f"training.save_every={steps}", "training.log_with=[none]", "task_options.plot=false",
        "data.eval_size=100", f"output_dir={output_dir}",
    ]  # fmt: skip


def paired(rounds: int, block: int, device: str, result: Path) -> None:
    """Alternating blocks of the plain loop and of the trainer's step loop, in this process."""
    import torch

    from trainer.contract.config import load_config
    from trainer.distributed import world
    from trainer.training.loop import Trainer

    # One output directory for every rank (beside the result file): the trainer checks that
    # every rank sees the same one.
    run_dir = result.parent / "paired-run"
    ring = ROOT / "configs" / "training" / "ring.yaml"
    overrides = ring_overrides(rounds * block + 1, run_dir)
    trainer = Trainer(load_config(ring, overrides=overrides), device, overwrite=True)
    # The bench drives the trainer's steps itself, to interleave the blocks.
    with trainer.start():
        acc = trainer.accelerator
        data = trainer.stream.dataset.columns["points"]
        plain = PlainLoop(
            trainer.g.model, trainer.d.model, trainer.g.optimizer.optimizer, trainer.d.optimizer.optimizer,
            data, acc.process_index, acc.num_processes, acc.device,
        )  # fmt: skip

        def timed(work: Callable[[], object]) -> float:
            start = time.perf_counter()
            work()
            if acc.device.type == "cuda":
                torch.cuda.synchronize()
            return time.perf_counter() - start

        def trainer_block() -> None:
            for _ in range(block):
                trainer.step()

        blocks = [(timed(lambda: plain.steps(block)), timed(trainer_block)) for _ in range(rounds)]
        is_main, steps = acc.is_main_process, {"plain": plain.done, "trainer": trainer.state.step}
    if is_main:
        result.write_text(json.dumps({"blocks": blocks, "steps": steps}))
    world.end_process_group()


def launch(processes: int, script: Path, args: list[str], launcher: str = "accelerate") -> None:
    """``script`` in one process, or under the launcher, as the tests launch runs."""
    cmd = launch_command(args, processes, script, launcher)
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=3600, env={**launch_env(), **MALLOC_ENV})
    if done.returncode:
        sys.exit(f"bench_loop: {' '.join(cmd)} failed ({done.returncode}):\n{done.stderr[-3000:]}")


def measure(processes: int, rounds: int, block: int, device: str, alone_steps: int) -> dict:
    with tempfile.TemporaryDirectory() as work:
        work_dir = Path(work)
        common = ["--device", device]
        here = Path(__file__)
        launch(processes, here, ["--paired", "--rounds", str(rounds), "--block", str(block),
                                 "--result", str(work_dir / "paired.json"), *common])  # fmt: skip
        paired_run = json.loads((work_dir / "paired.json").read_text())
        blocks = paired_run["blocks"]
        if set(paired_run["steps"].values()) != {rounds * block}:
            sys.exit(f"bench_loop: each loop should have run {rounds * block} steps: {paired_run['steps']}")
        launch(processes, here, ["--plain-alone", "--steps", str(alone_steps),
                                 "--result", str(work_dir / "plain.json"), *common], launcher="torchrun")  # fmt: skip
        plain_peak = json.loads((work_dir / "plain.json").read_text())["peak_memory_mb"]
        out = work_dir / "trainer"
        launch(processes, ROOT / "scripts" / "train_stage2.py",
               ["--config", str(ROOT / "configs" / "training" / "ring.yaml"), *common,
                *[arg for item in ring_overrides(alone_steps, out) for arg in ("--set", item)]])  # fmt: skip
        trainer_peak = records(out, "train")[-1]["peak_memory_mb"]
    return {
        "plain_steps_per_s": block / statistics.median(plain for plain, _ in blocks),
        "trainer_steps_per_s": block / statistics.median(trainer for _, trainer in blocks),
        "ratio": statistics.median(plain / trainer for plain, trainer in blocks),
        "plain_peak_mb": plain_peak,
        "trainer_peak_mb": trainer_peak,
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--rounds", type=int, default=150)
    p.add_argument("--block", type=int, default=20, help="steps per block")
    p.add_argument("--alone-steps", type=int, default=300, help="steps of each loop's own run (peak memory)")
    p.add_argument("--processes", type=int, nargs="+", default=[1, 2])
    p.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    p.add_argument("--paired", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--plain-alone", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--steps", type=int, help=argparse.SUPPRESS)
    p.add_argument("--result", type=Path, help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.paired:
        paired(args.rounds, args.block, args.device, args.result)
        return
    if args.plain_alone:
        plain_alone(args.steps, args.device, args.result)
        return
    print(f"{args.rounds} rounds of {args.block} steps per loop; ratio = median of per-round ratios")
    print("| processes | plain steps/s | trainer steps/s | trainer / plain | plain peak MB | trainer peak MB |")
    print("|---|---|---|---|---|---|")
    for processes in args.processes:
        m = measure(processes, args.rounds, args.block, args.device, args.alone_steps)
        print(
            f"| {processes} | {m['plain_steps_per_s']:.1f} | {m['trainer_steps_per_s']:.1f} | {m['ratio']:.3f} | "
            f"{m['plain_peak_mb']:.0f} | {m['trainer_peak_mb']:.0f} |",
            flush=True,
        )


if __name__ == "__main__":
    main()
