"""The `text` recipe's stage 2 against TRL's GRPOTrainer, with the sampling and checkpoint costs.

    pip install -e ".[bench]"
    python scripts/bench_text.py                       # tiny and GPT-2-small shape, CPU
    python scripts/bench_text.py --sizes tiny --steps 5

Both sides train the same generator (a GPT-2, fresh weights from one seed, the offline example's
tokenizer) against the same frozen sequence classifier as the reward model, from the start
token alone: the same number of sequences and new tokens per optimizer step, AdamW at the same
constant learning rate, gradient norm clipped at 1, no KL term, fp32, the same thread count.
The trainer runs `training.d_steps_per_g_step: 0`, `task_options.reward: sequence`. TRL's
GRPOTrainer is its trainer closest to that REINFORCE: with every sequence of a step in one group
(`num_generations` = the batch) its advantage is the reward minus the batch mean over their
standard deviation, as the trainer's; with `num_iterations: 1` the importance ratio is 1 and
its clipping never acts, so the gradient is REINFORCE's. (RLOOTrainer's leave-one-out baseline
differs by a factor k/(k-1) and does not normalise.) TRL's gradient checkpointing (on by
default) is turned off, as it is in the trainer by default.

Each side runs in a process of its own (peak memory is that process's resident set); steps/s
is timed over `--steps` optimizer steps after `--warmup`. Then, at each size: the trainer's
inverse-CDF sampling against `generate(do_sample=True)` (tokens/s, the same model, batch and
lengths; the median of `--sampling-rounds` alternating rounds), and at the largest size a full
checkpoint (both models, both optimizers, the trainer's state) saved and loaded by the trainer
against `torch.save`/`torch.load` of the same state dicts, and the trainer's peak memory with
`model.gradient_checkpointing` off and on.
The last line is `ratio trainer/trl: X.XX` (steps/s at the last size).
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
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

#: model shapes: layers, width, heads (the vocabulary is the example tokenizer's)
SIZES = {"tiny": (2, 64, 2), "small": (12, 768, 12)}


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="bench_text", description=__doc__.split("\n\n")[0])
    p.add_argument("--sizes", nargs="+", default=list(SIZES), choices=list(SIZES))
    p.add_argument("--steps", type=int, default=10, help="timed optimizer steps per side")
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--sampling-rounds", type=int, default=20, help="timed rounds of each sampler per size")
    p.add_argument("--batch", type=int, default=16, help="generated sequences per optimizer step")
    p.add_argument("--new-tokens", type=int, default=20)
    p.add_argument("--lr", type=float, default=1e-5)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    p.add_argument("--output-dir", default="outputs/bench_text")
    p.add_argument("--only", choices=["trainer", "trl", "sampling", "checkpoint"], help=argparse.SUPPRESS)
    p.add_argument("--size", choices=list(SIZES), help=argparse.SUPPRESS)
    p.add_argument("--checkpointing", action="store_true", help=argparse.SUPPRESS)
    return p


def peak_mb(args: argparse.Namespace) -> float:
    """This process's peak memory: allocated GPU memory on CUDA, resident set size on the CPU."""
    import torch

    from trainer.world import peak_memory_mb

    return peak_memory_mb(torch.device(args.device))


def write_models(out: Path, size: str) -> dict[str, Path]:
    """The example (texts, tokenizer) and this size's generator and reward model, each saved
    with ``save_pretrained`` beside the tokenizer; the same files for both sides."""
    import torch
    from transformers import AutoTokenizer, GPT2Config, GPT2ForSequenceClassification, GPT2LMHeadModel

    from trainer.text_example import write_text_example

    example = out / "example"
    if not (example / "gpt2" / "config.json").is_file():
        write_text_example(example)
    paths = {"train": example / "texts.jsonl", "eval": example / "eval.jsonl"}
    tokenizer = AutoTokenizer.from_pretrained(example / "gpt2")
    layers, width, heads = SIZES[size]
    config = GPT2Config(
        vocab_size=len(tokenizer), n_positions=128, n_embd=width, n_layer=layers, n_head=heads,
        bos_token_id=tokenizer.eos_token_id, eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.eos_token_id, num_labels=1,
    )  # fmt: skip
    for role, cls in (("generator", GPT2LMHeadModel), ("discriminator", GPT2ForSequenceClassification)):
        paths[role] = out / size / role
        if not (paths[role] / "config.json").is_file():
            torch.manual_seed(0)
            cls(config).save_pretrained(paths[role])
            tokenizer.save_pretrained(paths[role])
    return paths


def trainer_config(args: argparse.Namespace, paths: dict[str, Path], run_dir: Path, **training: Any) -> Any:
    from trainer.config import load_config

    return load_config(
        {
            "task": "text",
            "output_dir": str(run_dir),
            "model": {
                "generator_config": str(paths["generator"]),
                "discriminator_config": str(paths["discriminator"]),
                "gradient_checkpointing": args.checkpointing,
            },
            "data": {
                "train_files": str(paths["train"]),
                "eval_files": str(paths["eval"]),
                "cache_dir": str(run_dir / "cache"),
            },  # fmt: skip
            "task_options": {"max_new_tokens": args.new_tokens, "reward": "sequence", "write_samples": 0},
            "training": {
                "max_steps": 10**6,
                "batch_size": args.batch,
                "eval_every": 10**6,
                "save_every": 10**6,
                "log_every": 10**6,
                "log_with": ["none"],
                "mixed_precision": "no",
                "d_steps_per_g_step": 0,
                **training,
            },  # fmt: skip
            "optim": {
                role: {"name": "adamw", "lr": args.lr, "weight_decay": 0.0, "max_grad_norm": 1.0}
                for role in ("generator", "discriminator")
            },
        }
    )


def timed_steps(step: Any, warmup: int, steps: int) -> float:
    """Seconds that ``steps`` calls of ``step`` take, after ``warmup`` calls."""
    for _ in range(warmup):
        step()
    start = time.perf_counter()
    for _ in range(steps):
        step()
    return time.perf_counter() - start


def run_trainer(args: argparse.Namespace, paths: dict[str, Path], run_dir: Path) -> dict[str, float]:
    """The trainer's stage 2 against the frozen reward model: steps/s and generated tokens/s."""
    from trainer.loop import Trainer  # here, not at the top: the TRL side's memory is its own

    with Trainer(trainer_config(args, paths, run_dir), device=args.device).start() as trainer:
        task, generate, generated = trainer.task, trainer.task.generate, []

        def counting_generate(*a: Any, **k: Any) -> Any:
            sequences = generate(*a, **k)
            mask = task.generated_mask(sequences)
            generated.append(sequences.numel() if mask is None else int(mask.sum()))
            return sequences

        task.generate = counting_generate
        seconds = timed_steps(trainer.train_step, args.warmup, args.steps)
    tokens = sum(generated[args.warmup :])
    return {"steps_per_s": args.steps / seconds, "tokens_per_s": tokens / seconds, "peak_mb": peak_mb(args)}


def run_trl(args: argparse.Namespace, paths: dict[str, Path], run_dir: Path) -> dict[str, float]:
    """TRL's GRPOTrainer on the same models and budget: steps/s and generated tokens/s."""
    from datasets import Dataset
    from transformers import AutoModelForSequenceClassification, AutoTokenizer, TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    tokenizer = AutoTokenizer.from_pretrained(paths["generator"])
    total = args.warmup + args.steps
    ends: list[float] = []

    class StepTimes(TrainerCallback):
        def on_step_end(self, *_: Any, **__: Any) -> None:
            ends.append(time.perf_counter())

    config = GRPOConfig(
        output_dir=str(run_dir), max_steps=total, per_device_train_batch_size=args.batch,
        num_generations=args.batch, max_completion_length=args.new_tokens, learning_rate=args.lr,
        lr_scheduler_type="constant", weight_decay=0.0, max_grad_norm=1.0, beta=0.0, num_iterations=1,
        temperature=1.0, use_cpu=args.device == "cpu", bf16=False, gradient_checkpointing=False,
        logging_steps=1, report_to="none", save_strategy="no", disable_tqdm=True, seed=0,
    )  # fmt: skip
    prompts = Dataset.from_dict({"prompt": [tokenizer.bos_token] * total})
    reward = AutoModelForSequenceClassification.from_pretrained(paths["discriminator"])
    trl = GRPOTrainer(
        model=str(paths["generator"]), reward_funcs=reward, args=config, train_dataset=prompts,
        processing_class=tokenizer, reward_processing_classes=tokenizer, callbacks=[StepTimes()],
    )  # fmt: skip
    trl.train()
    seconds = ends[-1] - ends[args.warmup - 1] if args.warmup else ends[-1] - ends[0]
    lengths = [log["completions/mean_length"] for log in trl.state.log_history if "completions/mean_length" in log]
    tokens = sum(lengths[args.warmup :]) * args.batch
    return {"steps_per_s": args.steps / seconds, "tokens_per_s": tokens / seconds, "peak_mb": peak_mb(args)}


def run_sampling(args: argparse.Namespace, paths: dict[str, Path], run_dir: Path) -> dict[str, float]:
    """Tokens/s of the trainer's inverse-CDF sampling and of ``generate(do_sample=True)`` (top-k
    off, as the trainer samples), the same model, batch and lengths: the median of
    ``--sampling-rounds`` alternating rounds after ``--warmup``."""
    import torch

    from trainer.loop import Trainer

    with Trainer(trainer_config(args, paths, run_dir), device=args.device).start(training=False) as trainer:
        task, model = trainer.task, trainer.g.bare
        device = trainer.accelerator.device
        start = torch.full((args.batch, 1), task.start_id, dtype=torch.long, device=device)
        rng = torch.Generator(device=device).manual_seed(0)

        def inverse_cdf() -> int:
            uniforms = torch.rand(args.batch, args.new_tokens, generator=rng, device=device)
            return task.sample_sequences(model, start[:, :0], uniforms).shape[1]

        def do_sample() -> int:
            out = model.generate(
                input_ids=start, attention_mask=torch.ones_like(start), do_sample=True, top_k=0, top_p=1.0,
                max_new_tokens=args.new_tokens, pad_token_id=task.pad_id, eos_token_id=task.eos_id,
            )  # fmt: skip
            return out.shape[1] - 1

        rates: dict[str, list[float]] = {"inverse_cdf": [], "generate": []}
        with torch.no_grad():
            for round_ in range(args.warmup + args.sampling_rounds):
                for name, sample in (("inverse_cdf", inverse_cdf), ("generate", do_sample)):
                    began = time.perf_counter()
                    tokens = sample() * args.batch
                    if round_ >= args.warmup:
                        rates[name].append(tokens / (time.perf_counter() - began))
    return {f"{name}_tokens_per_s": statistics.median(values) for name, values in rates.items()}


def run_checkpoint(args: argparse.Namespace, paths: dict[str, Path], run_dir: Path) -> dict[str, Any]:
    """A full training checkpoint (both models and optimizers, after one step of each) saved
    and loaded by the trainer, against ``torch.save``/``torch.load`` + ``load_state_dict`` of the
    same state dicts: median seconds of 5 alternating rounds each, each round's seconds, bytes
    written, and the trainer's share spent flushing its files to disk (its durability, which
    ``torch.save`` lacks)."""
    from unittest import mock

    import torch

    import trainer.checkpoint
    from trainer.loop import Trainer

    flush_seconds: list[float] = []
    fsync_tree = trainer.checkpoint.fsync_tree

    def timed_fsync_tree(root: Path) -> None:
        began = time.perf_counter()
        fsync_tree(root)
        flush_seconds.append(time.perf_counter() - began)

    # save_checkpoint looks fsync_tree up at each call
    with (
        mock.patch.object(trainer.checkpoint, "fsync_tree", timed_fsync_tree),
        Trainer(trainer_config(args, paths, run_dir, d_steps_per_g_step=1), device=args.device).start() as run,
    ):
        run.train_step()
        phases = (run.g, run.d)

        def trainer_round() -> tuple[float, int]:
            began = time.perf_counter()
            path = run.checkpoints.save()
            run.checkpoints.load(path)
            return time.perf_counter() - began, sum(f.stat().st_size for f in path.rglob("*") if f.is_file())

        def torch_round() -> tuple[float, int]:
            file = run_dir / "state.pt"
            state = {}
            for phase in phases:
                state[phase.role] = phase.bare.state_dict()
                state[f"{phase.role}_optimizer"] = phase.optimizer.state_dict()
            began = time.perf_counter()
            torch.save(state, file)
            loaded = torch.load(file, map_location="cpu")
            for phase in phases:
                phase.bare.load_state_dict(loaded[phase.role])
                phase.optimizer.load_state_dict(loaded[f"{phase.role}_optimizer"])
            return time.perf_counter() - began, file.stat().st_size

        # Alternating, each round after an untimed sync: otherwise the write-back of one side's
        # 2 GB lands in the other side's time.
        rounds: dict[str, list[tuple[float, int]]] = {"trainer": [], "torch": []}
        for _ in range(5):
            for name, measure in (("trainer", trainer_round), ("torch", torch_round)):
                os.sync()
                rounds[name].append(measure())
    result: dict[str, Any] = {"trainer_fsync_s": statistics.median(flush_seconds)}
    for name, values in rounds.items():
        result[f"{name}_s"] = statistics.median(seconds for seconds, _ in values)
        result[f"{name}_mb"] = values[-1][1] / 2**20
        result[f"{name}_rounds_s"] = [round(seconds, 2) for seconds, _ in values]
    return result


def subprocess_run(args: argparse.Namespace, only: str, size: str, *extra: str) -> dict[str, float]:
    """One measurement in a process of its own; its RESULT line."""
    command = [sys.executable, __file__, "--only", only, "--size", size, "--output-dir", args.output_dir]
    for flag in ("steps", "warmup", "sampling_rounds", "batch", "new_tokens", "lr", "threads", "device"):
        command += [f"--{flag.replace('_', '-')}", str(getattr(args, flag))]
    done = subprocess.run([*command, *extra], capture_output=True, text=True)
    lines = [line for line in done.stdout.splitlines() if line.startswith("RESULT ")]
    if done.returncode != 0 or not lines:
        sys.stderr.write(done.stdout[-3000:] + done.stderr[-6000:])
        raise SystemExit(f"bench_text: {only} at size {size} exited {done.returncode}")
    return json.loads(lines[-1].removeprefix("RESULT "))


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    out = Path(args.output_dir)
    out.mkdir(parents=True, exist_ok=True)
    if args.only:
        import torch

        torch.set_num_threads(args.threads)
        paths = write_models(out, args.size)
        with tempfile.TemporaryDirectory(dir=out) as run_dir:
            result = RUNS[args.only](args, paths, Path(run_dir))
        print("RESULT " + json.dumps(result))
        return 0
    print(f"{args.batch} sequences x {args.new_tokens} new tokens per step, {args.threads} threads, {args.device}")
    print(f"{'size':6} {'side':8} {'steps/s':>9} {'tokens/s':>10} {'peak MB':>9}")
    ratio = 0.0
    for size in args.sizes:
        sides = {side: subprocess_run(args, side, size) for side in ("trainer", "trl")}
        for side, r in sides.items():
            print(f"{size:6} {side:8} {r['steps_per_s']:9.3f} {r['tokens_per_s']:10.1f} {r['peak_mb']:9.0f}")
        ratio = sides["trainer"]["steps_per_s"] / sides["trl"]["steps_per_s"]
        memory = sides["trainer"]["peak_mb"] / sides["trl"]["peak_mb"]
        print(f"{size:6} ratio trainer/trl: steps/s {ratio:.2f}, peak memory {memory:.2f}")
        sampling = subprocess_run(args, "sampling", size)
        ours, theirs = sampling["inverse_cdf_tokens_per_s"], sampling["generate_tokens_per_s"]
        print(f"{size:6} sampling tokens/s: inverse-CDF {ours:.0f}, generate(do_sample) {theirs:.0f}, "
              f"ratio {ours / theirs:.2f}")  # fmt: skip
    largest = args.sizes[-1]
    io = subprocess_run(args, "checkpoint", largest)
    print(f"{largest:6} checkpoint save+load: trainer {io['trainer_s']:.2f} s ({io['trainer_mb']:.0f} MB), "
          f"torch.save/load {io['torch_s']:.2f} s ({io['torch_mb']:.0f} MB), "
          f"ratio {io['trainer_s'] / io['torch_s']:.2f}; of the trainer's, flushing its files to disk "
          f"before the rename that publishes them {io['trainer_fsync_s']:.2f} s")  # fmt: skip
    recompute = subprocess_run(args, "trainer", largest, "--checkpointing")
    print(f"{largest:6} trainer with model.gradient_checkpointing: peak {recompute['peak_mb']:.0f} MB, "
          f"{recompute['steps_per_s']:.3f} steps/s")  # fmt: skip
    print(f"ratio trainer/trl: {ratio:.2f}")
    return 0


RUNS = {"trainer": run_trainer, "trl": run_trl, "sampling": run_sampling, "checkpoint": run_checkpoint}

if __name__ == "__main__":
    sys.exit(main())
