"""The trainer against a plain-torch loop with the same models, data and math, in one run.

Both run the ring recipe's default models (G: 4 x 400, D: 3 x 200, PacGAN2), batch 100 per
process, Adam, the non-saturating loss, one D phase and one G phase per step; the plain loop
is what one would write by hand (DDP over gloo/NCCL when launched with torchrun). Every
measurement is a separate process; they alternate (plain, trainer, plain, trainer, ...) and
each side keeps its best repeat, so a noisy machine penalises neither. Prints optimizer
steps/s, the ratio trainer/plain and peak memory, for 1 and 2 processes.

    python scripts/bench_loop.py [--steps 2000] [--repeats 2] [--processes 1 2] [--device cpu]
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

BATCH, PACKING, TRAIN_SIZE = 100, 2, 100_000


def plain_worker(steps: int, warmup: int, device_name: str, result: Path) -> None:
    """A hand-written loop: one D step (real vs generated) then one G step per iteration."""
    import torch
    import torch.distributed as dist
    import torch.nn.functional as F
    from torch.nn.parallel import DistributedDataParallel as DDP

    from trainer.runtime import peak_memory_mb
    from trainer.tasks.gaussian_mixture import mlp, sample_mixture

    world = int(os.environ.get("WORLD_SIZE", "1"))
    rank = int(os.environ.get("RANK", "0"))
    device = torch.device(device_name if device_name == "cpu" else f"cuda:{int(os.environ.get('LOCAL_RANK', '0'))}")
    if world > 1:
        dist.init_process_group("gloo" if device.type == "cpu" else "nccl")
    torch.manual_seed(0)
    g_bare = mlp(2, 400, 4, 2).to(device)
    d_bare = mlp(2 * PACKING, 200, 3, 1).to(device)
    g, d = (DDP(g_bare), DDP(d_bare)) if world > 1 else (g_bare, d_bare)
    opt_g = torch.optim.Adam(g.parameters(), lr=1e-4, betas=(0.5, 0.999))
    opt_d = torch.optim.Adam(d.parameters(), lr=1e-4, betas=(0.5, 0.999))
    data = sample_mixture("ring", TRAIN_SIZE, 0)
    noise = torch.Generator(device=device).manual_seed(rank + 1)
    order = torch.Generator().manual_seed(0)
    batches: list[torch.Tensor] = []

    def next_real() -> torch.Tensor:
        if not batches:
            perm = torch.randperm(TRAIN_SIZE, generator=order)
            mine = perm[: TRAIN_SIZE // (BATCH * world) * BATCH * world].view(-1, world, BATCH)[:, rank]
            batches.extend(mine.unbind(0))
        return data[batches.pop(0)].to(device)

    def score(model: torch.nn.Module, x: torch.Tensor) -> torch.Tensor:
        return model(x.reshape(-1, 2 * PACKING)).reshape(-1)

    start = time.perf_counter()
    for step in range(steps):
        if step == warmup:
            if device.type == "cuda":
                torch.cuda.synchronize()
            start = time.perf_counter()
        real = next_real()
        with torch.no_grad():
            fake = g_bare(torch.randn(BATCH, 2, generator=noise, device=device))
        real_scores, fake_scores = score(d, torch.cat([real, fake])).chunk(2)
        d_loss = F.softplus(-real_scores).mean() + F.softplus(fake_scores).mean()
        opt_d.zero_grad(set_to_none=True)
        d_loss.backward()
        opt_d.step()
        d_bare.requires_grad_(False)
        g_loss = F.softplus(-score(d_bare, g(torch.randn(BATCH, 2, generator=noise, device=device)))).mean()
        opt_g.zero_grad(set_to_none=True)
        g_loss.backward()
        opt_g.step()
        d_bare.requires_grad_(True)
    if device.type == "cuda":
        torch.cuda.synchronize()
    elapsed = time.perf_counter() - start
    if rank == 0:
        result.write_text(
            json.dumps({"steps_per_s": (steps - warmup) / elapsed, "peak_memory_mb": peak_memory_mb(device)})
        )
    if world > 1:
        dist.destroy_process_group()


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def run_plain(processes: int, steps: int, warmup: int, device: str, work: Path) -> dict:
    result = work / "plain.json"
    worker = [
        __file__,
        "--worker",
        "--steps",
        str(steps),
        "--warmup",
        str(warmup),
        "--device",
        device,
        "--result",
        str(result),
    ]
    if processes == 1:
        cmd = [sys.executable, *worker]
    else:
        cmd = [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--standalone",
            "--nproc_per_node",
            str(processes),
            *worker,
        ]
    subprocess.run(cmd, check=True, capture_output=True, timeout=1800)
    return json.loads(result.read_text())


def run_trainer(processes: int, steps: int, warmup: int, device: str, work: Path) -> dict:
    out = work / "trainer"
    args = [
        str(ROOT / "scripts" / "train_stage2.py"),
        "--config", str(ROOT / "configs" / "training" / "ring.yaml"),
        "--device", device, "--output-dir", str(out),
        "--set", f"training.max_steps={steps}", "--set", f"training.log_every={warmup}",
        "--set", f"training.eval_every={steps}", "--set", f"training.save_every={steps}",
        "--set", "training.log_with=[none]", "--set", "task_options.plot=false",
        "--set", "data.eval_size=100",
    ]  # fmt: skip
    if processes == 1:
        cmd = [sys.executable, *args]
    else:
        cmd = [
            sys.executable, "-m", "accelerate.commands.launch",
            "--config_file", str(ROOT / "accelerate_configs" / "8gpu.yaml"),
            "--num_processes", str(processes), "--main_process_port", str(free_port()), *args,
        ]  # fmt: skip
    subprocess.run(cmd, check=True, capture_output=True, timeout=1800)
    train = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines() if '"train"' in line]
    timed = train[1:]  # the first window holds the warm-up, as in the plain loop
    steps_timed = warmup * len(timed)
    seconds = sum(warmup / r["steps_per_s"] for r in timed)
    return {"steps_per_s": steps_timed / seconds, "peak_memory_mb": train[-1]["peak_memory_mb"]}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--steps", type=int, default=2000)
    p.add_argument("--warmup", type=int, default=200)
    p.add_argument("--repeats", type=int, default=2)
    p.add_argument("--processes", type=int, nargs="+", default=[1, 2])
    p.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--result", type=Path, help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.worker:
        plain_worker(args.steps, args.warmup, args.device, args.result)
        return
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    rows = []
    for processes in args.processes:
        best = {"plain": None, "trainer": None}
        for _ in range(args.repeats):
            for name, run in (("plain", run_plain), ("trainer", run_trainer)):
                with tempfile.TemporaryDirectory() as work:
                    measured = run(processes, args.steps, args.warmup, args.device, Path(work))
                if best[name] is None or measured["steps_per_s"] > best[name]["steps_per_s"]:
                    best[name] = measured
        rows.append((processes, best["plain"], best["trainer"]))
    print("| processes | plain steps/s | trainer steps/s | trainer / plain | plain peak MB | trainer peak MB |")
    print("|---|---|---|---|---|---|")
    for processes, plain, trainer in rows:
        print(
            f"| {processes} | {plain['steps_per_s']:.1f} | {trainer['steps_per_s']:.1f} | "
            f"{trainer['steps_per_s'] / plain['steps_per_s']:.3f} | {plain['peak_memory_mb']:.0f} | "
            f"{trainer['peak_memory_mb']:.0f} |"
        )


if __name__ == "__main__":
    main()
