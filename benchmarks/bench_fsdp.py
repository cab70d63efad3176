"""Per-rank memory of a GPT-2-small-shape pair under DDP and FSDP2, at 1, 2 and 4 CPU processes.

    python benchmarks/bench_fsdp.py                      # GPT-2 small shape: 124M parameters a model
    python benchmarks/bench_fsdp.py --size tiny --processes 1 2

The run: the oracle_text recipe (the oracle's vocabulary of 50,256 tokens and the start token:
GPT-2's 50,257), a generator and a discriminator of GPT-2 small's shape (12 blocks of width
768; the discriminator a sequence classifier), fresh weights, Adam, fp32. After one whole
optimizer step (so that Adam's moments exist), each rank takes the gradients of both models
again (a discriminator phase, then a generator phase) and reports, before any optimizer step:
its bytes of parameters, gradients and optimizer state (under FSDP2 its shards alone), and its
peak resident memory (which counts start-up: each rank builds both models whole before
accelerate shards them). One process is the same run under either config (nothing to shard).
The rows give the largest rank's figures; the ratios are FSDP2's over DDP's at the same count.

``--sampling``: instead, at each count of two or more, the generator's sampling under FSDP2 (the
recipe's ``generate``: 16 sequences of ``--sampling-tokens`` new tokens) two ways, each in a
launch of its own (gathering once changes the groups' resharding, which torch cannot read back
to restore): each forward all-gathering its groups (how the trainer samples), and every group
gathered once for the whole generation (torch's ``unshard``, no reshard after a forward), each
``--rounds`` times after a first untimed one: sequences/s, the median over the rounds and their
range. Gathered once, each rank holds the whole generator while it samples.

``--loading``: instead, at each count of two or more, each rank's peak resident memory once the
run has started (the models read, sharded, prepared; no step yet), both models read from one
``save_pretrained`` directory (``init.*``), three ways: DDP, FSDP2 as shipped (accelerate's
``fsdp_cpu_ram_efficient_loading``: rank 0's weights broadcast to the others' shards), and FSDP2
with each rank sharding the weights it read itself.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import torch
import yaml

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from harness.launch import launch_command, launch_env  # noqa: E402

#: model shapes: GPT-2 small's, and a tiny one for a quick look (and the test)
SIZES = {
    "gpt2-small": {"vocab": 50256, "n_embd": 768, "n_layer": 12, "n_head": 12},
    "tiny": {"vocab": 500, "n_embd": 64, "n_layer": 2, "n_head": 2},
}
CONFIGS = {"DDP": "8gpu.yaml", "FSDP2": "cpu_fsdp.yaml"}
#: the third way of --loading: cpu_fsdp.yaml with each rank sharding its own weights (written for the launch)
OWN_WEIGHTS = "FSDP2 own weights"


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="bench_fsdp", description=__doc__.split("\n\n")[0])
    p.add_argument("--size", choices=list(SIZES), default="gpt2-small")
    p.add_argument("--processes", type=int, nargs="+", default=[1, 2, 4])
    p.add_argument("--sampling", action="store_true", help="time sampling under FSDP2 two ways")
    p.add_argument("--sampling-tokens", type=int, default=32)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--loading", action="store_true", help="peak memory at start-up, models read from a directory")
    p.add_argument("--worker", help=argparse.SUPPRESS)  # a launched rank: the run's config file
    p.add_argument(
        "--worker-part",
        choices=("memory", "loading", "per forward", "gathered once"),
        default="memory",
        help=argparse.SUPPRESS,
    )
    return p


def write_run(directory: Path, size: str, tokens: int = 8, pretrained: bool = False) -> Path:
    """The run's config and its two model configs in ``directory``; ``pretrained``: both models
    read from a ``save_pretrained`` directory written there (the discriminator's head new)."""
    shape = SIZES[size]
    model = {"model_type": "gpt2", "vocab_size": shape["vocab"] + 1, "n_positions": 64}
    model.update({key: shape[key] for key in ("n_embd", "n_layer", "n_head")})
    model.update(resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0)
    (directory / "model.yaml").write_text(yaml.safe_dump(model))
    config = {
        "task": "oracle_text",
        "output_dir": str(directory / "out"),
        "model": {"generator_config": str(directory / "model.yaml"), "discriminator_config": "generator"},
        "task_options": {
            "vocab_size": shape["vocab"],
            "seq_len": tokens,
            "oracle_embed_dim": 8,
            "oracle_hidden_dim": 8,
        },
        "training": {"max_steps": 10, "batch_size": 2, "mixed_precision": "no", "log_with": ["none"], "seed": 0},
        "eval": {"batch_size": 2},
        "data": {"train_size": 16, "eval_size": 2, "cache_dir": str(directory / "cache")},
    }
    if pretrained:
        from transformers import AutoConfig, AutoModelForCausalLM

        saved = directory / "pretrained"
        start = {"bos_token_id": shape["vocab"], "eos_token_id": shape["vocab"]}  # the oracle's start token
        AutoModelForCausalLM.from_config(AutoConfig.for_model(**model, **start)).save_pretrained(saved)
        config["init"] = {"generator": str(saved), "discriminator": str(saved)}
    path = directory / "train.yaml"
    path.write_text(yaml.safe_dump(config))
    return path


def local_bytes(tensors: Any) -> int:
    """Bytes of these tensors held by this rank (a DTensor's local shard)."""
    from torch.distributed.tensor import DTensor

    total = 0
    for tensor in tensors:
        local = tensor.to_local() if isinstance(tensor, DTensor) else tensor
        total += local.numel() * local.element_size()
    return total


def worker(config: str, part: str) -> None:  # the memory and loading parts
    """One rank: (memory) a whole step, then both models' gradients again, or (loading) nothing
    once started; rank 0 prints every rank's figures."""
    from trainer.contract.config import load_config
    from trainer.distributed import collectives, world
    from trainer.training.loop import Trainer

    trainer = Trainer(load_config(config), "cpu")
    with trainer.start():
        if part == "loading":
            mine = {"peak_rss_mb": world.peak_memory_mb(trainer.accelerator.device)}
            every = collectives.gather_objects(trainer.accelerator, [mine], "the bench's figures")
            if trainer.accelerator.is_main_process:
                print("FIGURES " + json.dumps(every), flush=True)
            return
        trainer.train_step()
        trainer.compute_gradients(trainer.d, 0)
        trainer.compute_gradients(trainer.g, 1)
        phases = (trainer.d, trainer.g)
        params = [p for phase in phases for p in phase.params]
        states = [v for phase in phases for s in phase.optimizer.optimizer.state.values() for v in s.values()]
        mine = {
            "parameters": local_bytes(params),
            "gradients": local_bytes(p.grad for p in params if p.grad is not None),
            "optimizer": local_bytes(v for v in states if isinstance(v, torch.Tensor) and v.dim() > 0),
            "peak_rss_mb": world.peak_memory_mb(trainer.accelerator.device),
            "world_size": trainer.accelerator.num_processes,
            "sharded": trainer.accelerator.is_fsdp2,
        }
        every = collectives.gather_objects(trainer.accelerator, [mine], "the bench's figures")
        if trainer.accelerator.is_main_process:
            print("FIGURES " + json.dumps(every), flush=True)


def sampling_worker(config: str, rounds: int, way: str) -> None:
    """One rank: the generator's sampling ``way`` (per forward, gathered once); rank 0 prints
    sequences/s."""
    import time

    from torch.distributed.fsdp import FSDPModule

    from trainer.contract.config import load_config
    from trainer.distributed import sharding
    from trainer.training.loop import Trainer

    trainer = Trainer(load_config(config), "cpu")
    with trainer.start():
        generator, task = trainer.g.model, trainer.task
        groups = [m for m in generator.modules() if isinstance(m, FSDPModule)]
        rng = torch.Generator().manual_seed(0)

        def per_forward() -> None:
            task.generate(generator, 16, rng)

        def gathered_once() -> None:
            for group in groups:
                group.unshard()
            task.generate(generator, 16, rng)
            sharding.reshard(generator)

        if way == "gathered once":
            for group in groups:  # for the rest of this process: explicit gathers stay
                group.set_reshard_after_forward(False, recurse=False)
        sample = gathered_once if way == "gathered once" else per_forward
        seconds = []
        for round_ in range(rounds + 1):  # the first round builds caches
            began = time.perf_counter()
            with torch.no_grad():
                sample()
            if round_:
                seconds.append(time.perf_counter() - began)
        if trainer.accelerator.is_main_process:
            rates = sorted(16 / s for s in seconds)
            print("FIGURES " + json.dumps({"groups": len(groups), "rates": rates}), flush=True)


def launch_worker(size: str, kind: str, processes: int, part: str, *extra: str, tokens: int = 8) -> str:
    """One launch of a worker part; the JSON its rank 0 printed."""
    with tempfile.TemporaryDirectory() as tmp:
        config = write_run(Path(tmp), size, tokens, pretrained=part == "loading")
        accelerate_config = CONFIGS.get(kind, CONFIGS["FSDP2"])
        if kind == OWN_WEIGHTS:
            shipped = (ROOT / "accelerate_configs" / accelerate_config).read_text()
            accelerate_config = str(Path(tmp) / "own_weights.yaml")
            own = shipped.replace("cpu_ram_efficient_loading: true", "cpu_ram_efficient_loading: false")
            assert own != shipped, "cpu_fsdp.yaml no longer loads on rank 0 alone"
            Path(accelerate_config).write_text(own)
        args = ["--worker", str(config), "--worker-part", part, *extra]
        cmd = launch_command(args, processes, script=Path(__file__), accelerate_config=accelerate_config)
        done = subprocess.run(cmd, capture_output=True, text=True, env=launch_env(), cwd=ROOT, timeout=1800)
    lines = [line for line in done.stdout.splitlines() if line.startswith("FIGURES ")]
    if done.returncode or not lines:
        failed = f"bench_fsdp: {kind} {part} at {processes} process(es) failed (exit {done.returncode})"
        sys.exit(f"{failed}:\n{done.stderr[-3000:]}")
    return lines[0].removeprefix("FIGURES ")


def measure(size: str, kind: str, processes: int) -> dict[str, Any]:
    """One launch of the memory part: the largest rank's figures."""
    ranks = json.loads(launch_worker(size, kind, processes, "memory"))
    assert all(r["world_size"] == processes for r in ranks), ranks
    assert all(r["sharded"] == (kind == "FSDP2" and processes > 1) for r in ranks), ranks
    figures = {key: max(r[key] for r in ranks) for key in ("parameters", "gradients", "optimizer", "peak_rss_mb")}
    figures["model_state"] = figures["parameters"] + figures["gradients"] + figures["optimizer"]
    return figures


def memory_table(args: argparse.Namespace) -> None:
    print(f"bench_fsdp: {args.size}, torch {torch.__version__}, per-rank figures (the largest rank), MB")
    print("| processes | kind | parameters | gradients | optimizer | model state | ratio to DDP | peak RSS |")
    print("|---|---|---|---|---|---|---|---|")
    mb = 2**20
    for processes in args.processes:
        kinds = ["DDP"] if processes == 1 else list(CONFIGS)
        rows = {kind: measure(args.size, kind, processes) for kind in kinds}
        for kind, f in rows.items():
            ratio = f["model_state"] / rows["DDP"]["model_state"]
            print(
                f"| {processes} | {'whole' if processes == 1 else kind} | {f['parameters'] / mb:.1f} | "
                f"{f['gradients'] / mb:.1f} | {f['optimizer'] / mb:.1f} | {f['model_state'] / mb:.1f} | "
                f"{ratio:.2f} | {f['peak_rss_mb']:.0f} |",
                flush=True,
            )


def sampling_table(args: argparse.Namespace) -> None:
    print(f"bench_fsdp --sampling: {args.size}, 16 sequences of {args.sampling_tokens} tokens, {args.rounds} rounds")
    print("| processes | groups | per forward, sequences/s | gathered once, sequences/s | ratio |")
    print("|---|---|---|---|---|")
    for processes in (p for p in args.processes if p > 1):
        ways = {}
        for way in ("per forward", "gathered once"):
            extra = ("--rounds", str(args.rounds))
            ways[way] = json.loads(
                launch_worker(args.size, "FSDP2", processes, way, *extra, tokens=args.sampling_tokens)
            )
        each, once = ([statistics.median(w["rates"]), w["rates"][0], w["rates"][-1]] for w in ways.values())
        f = ways["per forward"]
        print(
            f"| {processes} | {f['groups']} | {each[0]:.2f} [{each[1]:.2f}-{each[2]:.2f}] | "
            f"{once[0]:.2f} [{once[1]:.2f}-{once[2]:.2f}] | {once[0] / each[0]:.2f} |",
            flush=True,
        )


def loading_table(args: argparse.Namespace) -> None:
    print(f"bench_fsdp --loading: {args.size}, both models from one save_pretrained directory, peak RSS MB")
    print("| processes | kind | rank 0 | other ranks (the largest) |")
    print("|---|---|---|---|")
    for processes in (p for p in args.processes if p > 1):
        for kind in (*CONFIGS, OWN_WEIGHTS):
            ranks = [r["peak_rss_mb"] for r in json.loads(launch_worker(args.size, kind, processes, "loading"))]
            assert len(ranks) == processes, ranks
            print(f"| {processes} | {kind} | {ranks[0]:.0f} | {max(ranks[1:]):.0f} |", flush=True)


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    if args.worker:
        if args.worker_part in ("memory", "loading"):
            worker(args.worker, args.worker_part)
        else:
            sampling_worker(args.worker, args.rounds, args.worker_part)
        return 0
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    table = sampling_table if args.sampling else loading_table if args.loading else memory_table
    table(args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
