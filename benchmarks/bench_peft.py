"""Peak memory and steps/s of the `text` recipe's stage 2: full fine-tuning against LoRA.

    pip install -e ".[peft]"
    python benchmarks/bench_peft.py                          # GPT-2-small shape (12 x 768), CPU
    python benchmarks/bench_peft.py --size tiny --steps 3
    python benchmarks/bench_peft.py --checkpointing          # activations recomputed in backward

The shipped `configs/training/text_stage2.yaml` (per-prefix rewards, a discriminator step per
generator step, the KL penalty to the reference generator, the maximum-likelihood term),
on fresh GPT-2 weights of one seed and the offline example's texts (benchmarks/bench_text.py
writes both), three ways, each in a process of its own:

- `full`: every weight trains; the KL reference is a second, frozen copy of the generator;
- `lora`: a LoRA adapter (r 16) on the generator, whose base weights stay frozen; the
  reference is the generator with its adapter off (no copy);
- `lora-both`: the same, and a LoRA adapter (r 16) on the discriminator (its head trains whole).

Peak memory is the process's resident set at the end (the models' loading included); steps/s
is timed over `--steps` steps after `--warmup`. The last line is
`ratio lora/full: memory X, steps/s Y`.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench_text import SIZES, write_models  # noqa: E402  (this directory: the same models and texts)

LORA = {"r": 16, "lora_alpha": 32, "lora_dropout": 0.0}
VARIANTS = {
    "full": {},
    "lora": {"model.peft": LORA},
    "lora-both": {"model.peft": LORA, "model.discriminator_peft": LORA},
}


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="bench_peft", description=__doc__.split("\n\n")[0])
    p.add_argument("--size", default="small", choices=list(SIZES))
    p.add_argument("--steps", type=int, default=5, help="timed steps per variant")
    p.add_argument("--warmup", type=int, default=1)
    p.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    p.add_argument("--output-dir", default="outputs/bench_peft")
    p.add_argument("--checkpointing", action="store_true", help="model.gradient_checkpointing in every variant")
    p.add_argument("--only", choices=list(VARIANTS), help=argparse.SUPPRESS)
    return p


def measure(args: argparse.Namespace, variant: str) -> dict[str, float]:
    """One variant's steps/s and peak memory, in this process."""
    import torch

    from trainer.contract.config import load_config
    from trainer.distributed.world import peak_memory_mb
    from trainer.training.loop import Trainer

    paths = write_models(Path(args.output_dir), args.size)
    with tempfile.TemporaryDirectory(prefix=f"bench_peft_{variant}_") as run_dir:
        overrides = {
            "output_dir": run_dir,
            "model.generator_config": str(paths["generator"]),
            "model.discriminator_config": str(paths["discriminator"]),
            "data.train_files": str(paths["train"]),
            "data.eval_files": str(paths["eval"]),
            "data.cache_dir": str(Path(run_dir) / "cache"),
            "training.log_with": ["none"],
            "training.eval_every": 10**6,
            "training.save_every": 10**6,
            "training.log_every": 10**6,
            "training.max_steps": 10**6,
            "model.gradient_checkpointing": args.checkpointing,
            **VARIANTS[variant],
        }
        config = load_config(str(ROOT / "configs" / "training" / "text_stage2.yaml"), overrides=overrides)
        with Trainer(config, device=args.device).start() as trainer:
            for _ in range(args.warmup):
                trainer.train_step()
            start = time.perf_counter()
            for _ in range(args.steps):
                trainer.train_step()
            seconds = time.perf_counter() - start
            trained = sum(
                p.numel()
                for model in (trainer.g.unwrapped, trainer.d.unwrapped)
                for p in model.parameters()
                if p.requires_grad
            )
    return {
        "steps_per_s": args.steps / seconds,
        "peak_mb": peak_memory_mb(torch.device(args.device)),
        "trained_parameters": trained,
    }


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    if args.only:
        print(json.dumps(measure(args, args.only)))
        return 0
    command = [sys.executable, __file__, "--size", args.size, "--steps", str(args.steps)]
    command += ["--warmup", str(args.warmup), "--device", args.device, "--output-dir", args.output_dir]
    command += ["--checkpointing"] if args.checkpointing else []
    results = {}
    for variant in VARIANTS:
        done = subprocess.run([*command, "--only", variant], capture_output=True, text=True)
        if done.returncode != 0:
            sys.exit(f"bench_peft: {variant} failed ({done.returncode}):\n{done.stderr[-3000:]}")
        results[variant] = json.loads(done.stdout.strip().splitlines()[-1])
    print(f"{'variant':10} {'steps/s':>9} {'peak MB':>9} {'trained parameters':>19}")
    for variant, r in results.items():
        print(f"{variant:10} {r['steps_per_s']:9.4f} {r['peak_mb']:9.0f} {r['trained_parameters']:19,d}")
    full, lora = results["full"], results["lora"]
    print(
        f"ratio lora/full: memory {lora['peak_mb'] / full['peak_mb']:.2f}, "
        f"steps/s {lora['steps_per_s'] / full['steps_per_s']:.2f}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
