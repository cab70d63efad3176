"""The `text` recipe's stage 2 against TRL's GRPOTrainer at equal work, with the time of each
part of a step, the sampling and the checkpoint costs.

    pip install -e ".[bench]"
    python scripts/bench_text.py                       # tiny and GPT-2-small shape, CPU
    python scripts/bench_text.py --sizes tiny --steps 5 --rounds 1

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
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

#: model shapes: layers, width, heads (the vocabulary is the example tokenizer's)
SIZES = {"tiny": (2, 64, 2), "small": (12, 768, 12)}
#: the trainer's objective of each row, and what TRL runs against it (see the docstring)
OBJECTIVES = {"minimal": "GRPO, beta 0", "shipped": "GRPO, beta = kl_coef, a reference model"}


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
    p.add_argument("--only", choices=["trainer", "trl", "sampling", "checkpoint", "memory"], help=argparse.SUPPRESS)
    p.add_argument("--size", choices=list(SIZES), help=argparse.SUPPRESS)
    p.add_argument("--checkpointing", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--objective", choices=list(OBJECTIVES), default="minimal", help=argparse.SUPPRESS)
    p.add_argument("--vocab", type=int, default=0, help=argparse.SUPPRESS)
    p.add_argument("--forwards", choices=["packed", "padded"], default="packed", help=argparse.SUPPRESS)
    return p


def peak_mb(args: argparse.Namespace) -> float:
    """This process's peak memory: allocated GPU memory on CUDA, resident set size on the CPU."""
    import torch

    from trainer.world import peak_memory_mb

    return peak_memory_mb(torch.device(args.device))


def write_models(out: Path, size: str, vocab: int = 0) -> dict[str, Path]:
    """The example (texts, tokenizer) and this size's generator and reward model, each saved
    with ``save_pretrained`` beside the tokenizer; the same files for both sides. ``vocab``: a
    larger vocabulary than the tokenizer's (0: the tokenizer's)."""
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
        vocab_size=max(len(tokenizer), vocab), n_positions=128, n_embd=width, n_layer=layers, n_head=heads,
        bos_token_id=tokenizer.eos_token_id, eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.eos_token_id, num_labels=1,
    )  # fmt: skip
    for role, cls in (("generator", GPT2LMHeadModel), ("discriminator", GPT2ForSequenceClassification)):
        paths[role] = out / (f"{size}-vocab-{vocab}" if vocab else size) / role
        if not (paths[role] / "config.json").is_file():
            torch.manual_seed(0)
            cls(config).save_pretrained(paths[role])
            tokenizer.save_pretrained(paths[role])
    return paths


def shipped_objective() -> dict[str, Any]:
    """The objective of the shipped configs/training/text_stage2.yaml: its task options,
    training loss, discriminator steps and whether they share the generator step's samples,
    optimizers and dropout setting (not its sizes)."""
    import yaml

    shipped = yaml.safe_load((ROOT / "configs" / "training" / "text_stage2.yaml").read_text())
    options = {k: v for k, v in shipped["task_options"].items() if k not in ("max_new_tokens", "text_column")}
    training = {k: shipped["training"][k] for k in ("objective", "d_steps_per_g_step", "loss", "share_samples")}
    return {"task_options": options, "training": training, "optim": shipped["optim"]}


def trainer_config(args: argparse.Namespace, paths: dict[str, Path], run_dir: Path, **training: Any) -> Any:
    from trainer.config import load_config

    optim = {
        role: {"name": "adamw", "lr": args.lr, "betas": [0.9, 0.999], "weight_decay": 0.0, "max_grad_norm": 1.0}
        for role in ("generator", "discriminator")
    }
    task_options: dict[str, Any] = {"reward": "sequence", "kl_coef": 0.0, "mle_weight": 0.0}
    if args.objective == "shipped":
        shipped = shipped_objective()
        task_options, training, optim = shipped["task_options"], {**shipped["training"], **training}, shipped["optim"]
    return load_config(
        {
            "task": "text",
            "output_dir": str(run_dir),
            "model": {
                "generator_config": str(paths["generator"]),
                "discriminator_config": str(paths["discriminator"]),
                "gradient_checkpointing": args.checkpointing,
                "disable_dropout": True,
            },
            "data": {
                "train_files": str(paths["train"]),
                "eval_files": str(paths["eval"]),
                "cache_dir": str(run_dir / "cache"),
            },  # fmt: skip
            "task_options": {**task_options, "max_new_tokens": args.new_tokens, "write_samples": 0},
            "training": {
                "max_steps": 10**6,
                "batch_size": args.batch,
                "eval_every": 10**6,
                "save_every": 10**6,
                "log_every": 10**6,
                "log_with": ["none"],
                "mixed_precision": args.precision,
                "d_steps_per_g_step": 0,
                **training,
            },  # fmt: skip
            "optim": optim,
        }
    )


#: the parts of a step timed on both sides, in the order of the table
PARTS = ("generation", "reward", "reference", "G forward", "G backward", "D step", "optimizer", "other")


class PartTimes:
    """Seconds spent in each part of a step, each second counted once: in the innermost timed
    call (a reward computed inside the generator's loss counts as reward), except inside an
    absorbing part (the D step holds its own sampling, forward, backward and optimizer)."""

    def __init__(self) -> None:
        self.seconds = dict.fromkeys(PARTS, 0.0)
        self._stack: list[list[Any]] = []  # [part, absorbing, start of its current stretch]

    def reset(self) -> None:
        self.seconds = dict.fromkeys(PARTS, 0.0)

    def wrap(self, function: Any, part: Any, absorbing: bool = False) -> Any:
        """``function`` timed as ``part`` (a name, or a function of the call's arguments giving
        the name or None: not timed)."""

        def timed(*a: Any, **k: Any) -> Any:
            name = part(*a, **k) if callable(part) else part
            if name is None or (self._stack and self._stack[-1][1]):
                return function(*a, **k)
            now = time.perf_counter()
            if self._stack:
                outer = self._stack[-1]
                self.seconds[outer[0]] += now - outer[2]
            self._stack.append([name, absorbing, now])
            try:
                return function(*a, **k)
            finally:
                now = time.perf_counter()
                self.seconds[name] += now - self._stack.pop()[2]
                if self._stack:
                    self._stack[-1][2] = now

        return timed

    def current(self) -> str:
        """The part running now (``other`` outside every timed part)."""
        return self._stack[-1][0] if self._stack else "other"

    def holds(self, part: str) -> bool:
        """Whether the call being made is inside ``part``."""
        return any(entry[0] == part for entry in self._stack)

    def per_step(self, steps: int, seconds: float) -> dict[str, float]:
        """Milliseconds per step of each part; ``other`` is the step's time outside them."""
        timed = {part: value for part, value in self.seconds.items() if part != "other"}
        timed["other"] = max(seconds - sum(timed.values()), 0.0)
        return {part: 1000 * value / steps for part, value in timed.items()}


def time_adamw(times: PartTimes) -> None:
    """AdamW's step timed as ``optimizer`` (both sides use torch's AdamW), for the optimizers
    made after this call."""
    import torch

    torch.optim.AdamW.step = times.wrap(torch.optim.AdamW.step, "optimizer")


def run_trainer(args: argparse.Namespace, paths: dict[str, Path], run_dir: Path) -> dict[str, Any]:
    """The trainer's stage 2 (``--objective``): steps/s, new tokens per step, peak memory and
    the time of each part of a step."""
    import trainer.collectives
    from harness.forward_counts import ForwardCounts, count_task_tokens
    from trainer.loop import Trainer  # here, not at the top: the TRL side's memory is its own

    times, generated = PartTimes(), []
    counts = ForwardCounts(times.current)
    time_adamw(times)  # before accelerate binds the optimizer's step
    with Trainer(trainer_config(args, paths, run_dir), device=args.device).start() as run:
        task = run.task
        generate = task.generate

        def counting_generate(*a: Any, **k: Any) -> Any:
            sequences = generate(*a, **k)
            # the samples the generator learns from: the D step's with training.share_samples,
            # else the G phase's own (the D step then samples for itself)
            if times.holds("D step") == run.config.training.share_samples:
                mask = task.generated_mask(sequences)
                generated.append(sequences.numel() if mask is None else int(mask.sum()))
            return sequences

        task.generate = times.wrap(counting_generate, "generation")
        task._advantages = times.wrap(task._advantages, "reward")
        task.kl_to_reference = times.wrap(task.kl_to_reference, "reference")
        run.g.compute = times.wrap(run.g.compute, "G forward")
        d_step = lambda phase, slot: "D step" if phase is run.d else None  # noqa: E731
        run.run_phase = times.wrap(run.run_phase, d_step, absorbing=True)
        backward = trainer.collectives.backward
        trainer.collectives.backward = times.wrap(backward, lambda *a: "G backward" if a[-1] == "generator" else None)
        for model in (run.g.unwrapped, run.d.unwrapped, task.__dict__.get("reference")):
            if model is not None:
                counts.watch(model)
        count_task_tokens(counts, task)
        for _ in range(args.warmup):
            run.train_step()
        times.reset()
        counts.reset()
        generated.clear()
        start = time.perf_counter()
        for _ in range(args.steps):
            run.train_step()
        seconds = time.perf_counter() - start
    return {
        "steps_per_s": args.steps / seconds,
        "tokens_per_step": sum(generated) / args.steps,
        "peak_mb": peak_mb(args),
        "parts_ms": times.per_step(args.steps, seconds),
        "forwards": counts.per_step(args.steps),
    }


def run_trl(args: argparse.Namespace, paths: dict[str, Path], run_dir: Path) -> dict[str, Any]:
    """TRL's GRPOTrainer on the same models and budget (see the module's docstring): steps/s,
    new tokens per step, peak memory and the time of each part of a step."""
    import torch
    from datasets import Dataset
    from transformers import AutoModelForSequenceClassification, AutoTokenizer, TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    from harness.forward_counts import ForwardCounts

    tokenizer = AutoTokenizer.from_pretrained(paths["generator"])
    total = args.warmup + args.steps
    times, ends, generated = PartTimes(), [], []
    counts = ForwardCounts(times.current)
    scorer = AutoModelForSequenceClassification.from_pretrained(paths["discriminator"]).to(args.device).eval()

    def discriminator_rating(completion_ids: list[list[int]], **_: Any) -> list[float]:
        """The frozen classifier's rating (its sigmoid, as the trainer's reward) of the start
        token and each completion, read from the token ids: no decoding and tokenizing again."""
        generated.append(sum(map(len, completion_ids)))
        rows = [[tokenizer.bos_token_id, *ids] for ids in completion_ids]
        width = max(map(len, rows))
        ids = torch.full((len(rows), width), tokenizer.pad_token_id, dtype=torch.long)
        mask = torch.zeros_like(ids)
        for i, row in enumerate(rows):
            ids[i, : len(row)], mask[i, : len(row)] = torch.tensor(row), 1
        with torch.inference_mode():
            logits = scorer(input_ids=ids.to(args.device), attention_mask=mask.to(args.device)).logits[:, 0]
        return torch.sigmoid(logits.float()).tolist()

    class StepTimes(TrainerCallback):
        def on_step_end(self, *_: Any, **__: Any) -> None:
            ends.append(time.perf_counter())
            if len(ends) == args.warmup:
                times.reset()
                counts.reset()
                generated.clear()

    beta = shipped_objective()["task_options"]["kl_coef"] if args.objective == "shipped" else 0.0
    config = GRPOConfig(
        output_dir=str(run_dir), max_steps=total, per_device_train_batch_size=args.batch,
        num_generations=args.batch, max_completion_length=args.new_tokens, learning_rate=args.lr,
        lr_scheduler_type="constant", weight_decay=0.0, max_grad_norm=1.0, beta=beta, num_iterations=1,
        optim="adamw_torch", adam_beta1=0.9, adam_beta2=0.999, disable_dropout=True,
        temperature=1.0, use_cpu=args.device == "cpu", bf16=args.precision == "bf16", gradient_checkpointing=False,
        logging_steps=total + 1, report_to="none", save_strategy="no", disable_tqdm=True, seed=0,
    )  # fmt: skip
    prompts = Dataset.from_dict({"prompt": [tokenizer.bos_token] * total})
    trl = GRPOTrainer(
        model=str(paths["generator"]), reward_funcs=discriminator_rating, args=config, train_dataset=prompts,
        processing_class=tokenizer, callbacks=[StepTimes()],
    )  # fmt: skip
    trl._generate = times.wrap(trl._generate, "generation")
    trl._calculate_rewards = times.wrap(trl._calculate_rewards, "reward")
    # outside the loss (TRL computes the reference's log-probabilities with the samples)
    logps = trl._get_per_token_logps_and_entropies
    reference = lambda *a, **k: None if times.holds("G forward") else "reference"  # noqa: E731
    trl._get_per_token_logps_and_entropies = times.wrap(logps, reference)
    trl.compute_loss = times.wrap(trl.compute_loss, "G forward")
    trl.accelerator.backward = times.wrap(trl.accelerator.backward, "G backward")
    time_adamw(times)
    for model in (trl.model, getattr(trl, "ref_model", None), scorer):
        if model is not None:
            counts.watch(trl.accelerator.unwrap_model(model), valid_from_mask=True)
    trl.train()
    seconds = ends[-1] - ends[args.warmup - 1] if args.warmup else ends[-1] - ends[0]
    return {
        "steps_per_s": args.steps / seconds,
        "tokens_per_step": sum(generated) / len(generated),
        "peak_mb": peak_mb(args),
        "parts_ms": times.per_step(args.steps, seconds),
        "forwards": counts.per_step(args.steps),
    }


def run_sampling(args: argparse.Namespace, paths: dict[str, Path], run_dir: Path) -> dict[str, float]:
    """Tokens/s of the trainer's inverse-CDF sampling and of ``generate(do_sample=True)`` (top-k
    off, as the trainer samples), the same model, batch and lengths: the median of
    ``--sampling-rounds`` alternating rounds after ``--warmup``."""
    import torch

    from trainer.loop import Trainer

    with Trainer(trainer_config(args, paths, run_dir), device=args.device).start(training=False) as trainer:
        task, model = trainer.task, trainer.g.unwrapped
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
                state[phase.role] = phase.unwrapped.state_dict()
                state[f"{phase.role}_optimizer"] = phase.optimizer.state_dict()
            began = time.perf_counter()
            torch.save(state, file)
            loaded = torch.load(file, map_location="cpu")
            for phase in phases:
                phase.unwrapped.load_state_dict(loaded[phase.role])
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


#: vocabularies of the generator phase's memory row (Llama-2's 32,000 and GPT-2's 50,257)
MEMORY_VOCABULARIES = (32000, 50257)


def run_memory(args: argparse.Namespace, paths: dict[str, Path], run_dir: Path) -> dict[str, Any]:
    """The shipped objective's generator phase (its sampling, rewards, reference and the
    generator's forward and backward), once: its peak memory above what the process held before
    it, with the trainer's forwards or (``--forwards padded``) those before packing."""
    import torch

    from harness.padded import use_padded
    from trainer.loop import Trainer

    args.objective = "shipped"
    # the phase alone, with its own sampling (shared samples would come from a D step not run)
    with Trainer(trainer_config(args, paths, run_dir, share_samples=False), device=args.device).start() as run:
        if args.forwards == "padded":
            use_padded(run.task)
        device = run.accelerator.device
        # Every weight read once first: loaded weights may be mapped from their files, and the
        # pages a first forward reads would count as the phase's memory
        for model in (run.g.unwrapped, run.d.unwrapped, run.task.reference):
            for tensor in [*model.parameters(), *model.buffers()]:
                tensor.detach().sum()
        if device.type == "cuda":
            before = torch.cuda.memory_allocated(device)
            torch.cuda.reset_peak_memory_stats(device)
        else:
            before = int(Path("/proc/self/statm").read_text().split()[1]) * os.sysconf("SC_PAGE_SIZE")
            Path("/proc/self/clear_refs").write_text("5")  # the resident set's high-water mark := now
        run.compute_gradients(run.g, 1)  # the G phase of a step of one D phase
        if device.type == "cuda":
            peak = torch.cuda.max_memory_allocated(device)
        else:
            status = Path("/proc/self/status").read_text()
            peak = 1024 * int(next(line.split()[1] for line in status.splitlines() if line.startswith("VmHWM:")))
    return {"phase_peak_mb": (peak - before) / 2**20}


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
    for vocab in MEMORY_VOCABULARIES:
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
