"""The `text` recipe's stage 2 against TRL's GRPOTrainer at equal work, with the time of each
part of a step, the sampling and the checkpoint costs.

    pip install -e ".[bench]"
    python benchmarks/bench_text.py                       # tiny and GPT-2-small shape, CPU
    python benchmarks/bench_text.py --sizes tiny --steps 5 --rounds 1

Both sides train the same generator (a GPT-2, fresh weights from one seed, the offline example's
tokenizer) from the start token alone, 16 sequences of up to 20 new tokens per optimizer step,
both models in the mode of their use (the trained one in train mode) with every dropout off (the
shipped text_stage2.yaml's `model.disable_dropout`, TRL's `disable_dropout`), torch's AdamW
(foreach) with betas 0.9/0.999 at a constant learning rate, gradient norm clipped at 1, fp32
(`--precision bf16`: bf16 autocast on both sides, as scripts/gpu_check.sh runs it on a GPU),
the same threads (`--threads`, default OMP_NUM_THREADS, else 2), TRL's logging off during the
timed steps. TRL's reward is a function on the completions' token ids that runs the frozen
sequence classifier on the start token and the completion and returns its sigmoid, as the
trainer's reward: no decoding and tokenizing again for the reward model (TRL still decodes the
completions once, inside its generation).

Two rows per size:
- minimal: the trainer with a frozen discriminator as the reward model
  (`training.d_steps_per_g_step: 0`, `task_options.reward: sequence`, no KL, no MLE term)
  against GRPO with `beta` 0. With every sequence of a step in one group (`num_generations` =
  the batch), GRPO's advantage is the reward minus the batch mean over the batch's standard
  deviation, as the trainer's; with `num_iterations: 1` its importance ratio is 1 and its
  clipping never acts, so the two compute the same gradient.
- shipped: the objective of configs/training/text_stage2.yaml (a discriminator step per
  generator step, per-prefix rewards, KL to a frozen reference copy with `kl_coef` 0.2, an MLE
  term on real texts; its optimizers) against GRPO with `beta` = `kl_coef` (TRL's reference
  copy) and the same sequences. The trainer does more work here (the D step, the prefix
  ratings, the MLE term's real texts): the per-part times show how much.

Each side runs in a process of its own (peak memory is that process's resident set), `--rounds`
times, alternated (trainer, TRL, trainer, ...); steps/s is timed over `--steps` optimizer steps
after `--warmup`; the rows give medians over the rounds and their range. The time of each part
of a step (milliseconds, median over rounds): generation (sampling, and TRL's decoding), reward
(the frozen classifier's forward on the samples), reference (the reference model's forward),
G forward (the generator's forward and loss), G backward, D step (the whole discriminator step,
its own sampling included), optimizer (AdamW's step, of the generator outside the D step),
other (the rest of the step: gradient clipping, zeroing, bookkeeping). Each second counts once,
in the innermost part.

Then, at each size: the trainer's inverse-CDF sampling against `generate(do_sample=True)`
(tokens/s, the same model, batch and lengths; the median of `--sampling-rounds` alternating
rounds), and at the largest size a full checkpoint (both models, both optimizers, the trainer's
state) saved and loaded by the trainer against `torch.save`/`torch.load` of the same state
dicts, and the trainer's peak memory with `model.gradient_checkpointing`. Each row of the
comparison ends with `ratio trainer/trl: X.XX` (steps/s, the medians' ratio).
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

from text_common import OBJECTIVES, PARTS, SIZES
from text_costs import MEMORY_VOCABULARIES, run_checkpoint, run_memory, run_sampling
from text_sides import run_trainer, run_trl, write_models


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="bench_text", description=__doc__.split("\n\n")[0])
    p.add_argument("--sizes", nargs="+", default=list(SIZES), choices=list(SIZES))
    p.add_argument("--objectives", nargs="+", default=list(OBJECTIVES), choices=list(OBJECTIVES))
    p.add_argument("--steps", type=int, default=10, help="timed optimizer steps per side and round")
    p.add_argument("--rounds", type=int, default=3, help="alternated rounds of each side per row")
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--sampling-rounds", type=int, default=20, help="timed rounds of each sampler per size")
    p.add_argument("--batch", type=int, default=16, help="generated sequences per optimizer step")
    p.add_argument("--new-tokens", type=int, default=20)
    p.add_argument("--lr", type=float, default=1e-5)
    p.add_argument("--threads", type=int, default=int(os.environ.get("OMP_NUM_THREADS") or 2))
    p.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    p.add_argument("--precision", default="no", choices=["no", "bf16"], help="both sides: fp32 or bf16 autocast")
    p.add_argument("--output-dir", default="outputs/bench_text")
    p.add_argument(
        "--vocabularies",
        nargs="+",
        type=int,
        default=list(MEMORY_VOCABULARIES),
        help="vocabularies of the generator phase's memory rows (default: %(default)s, Llama's and GPT-2's)",
    )
    p.add_argument("--only", choices=["trainer", "trl", "sampling", "checkpoint", "memory"], help=argparse.SUPPRESS)
    p.add_argument("--size", choices=list(SIZES), help=argparse.SUPPRESS)
    p.add_argument("--checkpointing", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--objective", choices=list(OBJECTIVES), default="minimal", help=argparse.SUPPRESS)
    p.add_argument("--vocab", type=int, default=0, help=argparse.SUPPRESS)
    p.add_argument("--forwards", choices=["packed", "padded"], default="packed", help=argparse.SUPPRESS)
    return p


def subprocess_run(args: argparse.Namespace, only: str, size: str, *extra: str) -> dict[str, Any]:
    """One measurement in a process of its own; its RESULT line."""
    command = [sys.executable, __file__, "--only", only, "--size", size, "--output-dir", args.output_dir]
    flags = ("steps", "warmup", "sampling_rounds", "batch", "new_tokens", "lr", "threads", "device", "objective",
             "precision")  # fmt: skip
    for flag in flags:
        command += [f"--{flag.replace('_', '-')}", str(getattr(args, flag))]
    done = subprocess.run([*command, *extra], capture_output=True, text=True)
    lines = [line for line in done.stdout.splitlines() if line.startswith("RESULT ")]
    if done.returncode != 0 or not lines:
        sys.stderr.write(done.stdout[-3000:] + done.stderr[-6000:])
        raise SystemExit(f"bench_text: {only} at size {size} exited {done.returncode}")
    return json.loads(lines[-1].removeprefix("RESULT "))


def spread(values: list[float]) -> str:
    return f"{min(values):.3g}-{max(values):.3g}"


def compare(args: argparse.Namespace, size: str, objective: str) -> float:
    """``--rounds`` alternated rounds of each side at one size and objective; prints a row per
    side (medians), the time of each part per step, and the ratio; returns the ratio."""
    args.objective = objective
    rounds: dict[str, list[dict[str, Any]]] = {"trainer": [], "trl": []}
    for _ in range(args.rounds):
        for side in rounds:
            rounds[side].append(subprocess_run(args, side, size))
    rates = {side: [r["steps_per_s"] for r in results] for side, results in rounds.items()}
    for side, results in rounds.items():
        tokens = statistics.median(r["tokens_per_step"] for r in results)
        peak = statistics.median(r["peak_mb"] for r in results)
        print(f"{size:6} {objective:8} {side:8} {statistics.median(rates[side]):9.3f} {tokens:8.0f} {peak:8.0f}"
              f"   rounds {spread(rates[side])} steps/s")  # fmt: skip
    print(f"{'':24} ms per step: " + ", ".join(PARTS))
    for side, results in rounds.items():
        parts = [statistics.median(r["parts_ms"][part] for r in results) for part in PARTS]
        print(f"{'':24} {side:8} " + " ".join(f"{value:8.1f}" for value in parts))
    print(f"{'':24} positions computed / valid tokens per step, by part (training forwards)")
    for side, results in rounds.items():
        counted = results[-1]["forwards"]  # the last round's (every round samples from the same seeds)
        cells = [f"{part} {p:.0f}/{v:.0f} ({p / v:.2f}x)" for part, (p, v) in counted.items() if v]
        print(f"{'':24} {side:8} " + ", ".join(cells))
    ratios = [ours / theirs for ours, theirs in zip(rates["trainer"], rates["trl"], strict=True)]
    ratio = statistics.median(rates["trainer"]) / statistics.median(rates["trl"])
    print(f"{size:6} {objective:8} ratio trainer/trl (paired rounds {spread(ratios)}): {ratio:.2f}")
    return ratio


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    out = Path(args.output_dir)
    out.mkdir(parents=True, exist_ok=True)
    if args.only:
        import torch

        torch.set_num_threads(args.threads)
        paths = write_models(out, args.size, args.vocab)
        with tempfile.TemporaryDirectory(dir=out) as run_dir:
            result = RUNS[args.only](args, paths, Path(run_dir))
        print("RESULT " + json.dumps(result))
        return 0
    precision = "fp32" if args.precision == "no" else args.precision
    print(f"{args.batch} sequences x {args.new_tokens} new tokens per step, {args.threads} threads, {args.device}, "
          f"{precision}, {args.rounds} alternated rounds of {args.steps} timed steps per side (medians)")  # fmt: skip
    print(f"{'size':6} {'objective':8} {'side':8} {'steps/s':>9} {'tokens':>8} {'peak MB':>8}")
    for size in args.sizes:
        for objective in args.objectives:
            compare(args, size, objective)
        sampling = subprocess_run(args, "sampling", size)
        ours, theirs = sampling["inverse_cdf_tokens_per_s"], sampling["generate_tokens_per_s"]
        print(f"{size:6} sampling tokens/s: inverse-CDF {ours:.0f}, generate(do_sample) {theirs:.0f}, "
              f"ratio {ours / theirs:.2f}")  # fmt: skip
    args.objective = "minimal"
    largest = args.sizes[-1]
    io = subprocess_run(args, "checkpoint", largest)
    print(f"{largest:6} checkpoint save+load: trainer {io['trainer_s']:.2f} s ({io['trainer_mb']:.0f} MB), "
          f"torch.save/load {io['torch_s']:.2f} s ({io['torch_mb']:.0f} MB), "
          f"ratio {io['trainer_s'] / io['torch_s']:.2f}; of the trainer's, flushing its files to disk "
          f"before the rename that publishes them {io['trainer_fsync_s']:.2f} s")  # fmt: skip
    recompute = subprocess_run(args, "trainer", largest, "--checkpointing")
    print(f"{largest:6} trainer with model.gradient_checkpointing: peak {recompute['peak_mb']:.0f} MB, "
          f"{recompute['steps_per_s']:.3f} steps/s")  # fmt: skip
    for vocab in args.vocabularies:
        peaks = {f: subprocess_run(args, "memory", largest, "--vocab", str(vocab), "--forwards", f)["phase_peak_mb"]
                 for f in ("padded", "packed")}  # fmt: skip
        print(f"{largest:6} generator phase, shipped objective, vocabulary {vocab}: peak above its start "
              f"{peaks['padded']:.0f} MB before packing, {peaks['packed']:.0f} MB packed, "
              f"ratio {peaks['packed'] / peaks['padded']:.2f}")  # fmt: skip
    return 0


RUNS = {
    "trainer": run_trainer,
    "trl": run_trl,
    "sampling": run_sampling,
    "checkpoint": run_checkpoint,
    "memory": run_memory,
}

if __name__ == "__main__":
    sys.exit(main())
