"""bench_text.py's two sides, each run in a process of its own: the example's models written once,
the trainer's stage 2 and TRL's GRPOTrainer at equal work."""

from __future__ import annotations

import argparse
import time
from pathlib import Path
from typing import Any

from text_common import ROOT, SIZES, PartTimes, peak_mb, time_adamw


def write_models(out: Path, size: str, vocab: int = 0) -> dict[str, Path]:
    """The example (texts, tokenizer) and this size's generator and reward model, each saved
    with ``save_pretrained`` beside the tokenizer; the same files for both sides. ``vocab``: a
    larger vocabulary than the tokenizer's (0: the tokenizer's)."""
    import torch
    from transformers import AutoTokenizer, GPT2Config, GPT2ForSequenceClassification, GPT2LMHeadModel

    from trainer.commands.text_example import write_text_example

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
    from trainer.contract.config import load_config

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


def run_trainer(args: argparse.Namespace, paths: dict[str, Path], run_dir: Path) -> dict[str, Any]:
    """The trainer's stage 2 (``--objective``): steps/s, new tokens per step, peak memory and
    the time of each part of a step."""
    import trainer.distributed.collectives
    from harness.forward_counts import ForwardCounts, count_task_tokens
    from trainer.training.loop import Trainer  # here, not at the top: the TRL side's memory is its own

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
        backward = trainer.distributed.collectives.backward
        trainer.distributed.collectives.backward = times.wrap(
            backward, lambda *a: "G backward" if a[-1] == "generator" else None
        )
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
