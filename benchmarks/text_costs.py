"""bench_text.py's costs beside the steps, each run in a process of its own: sampling, a
checkpoint's save and load, the generator phase's peak memory."""

from __future__ import annotations

import argparse
import os
import statistics
import time
from pathlib import Path
from typing import Any

from text_sides import trainer_config


def run_sampling(args: argparse.Namespace, paths: dict[str, Path], run_dir: Path) -> dict[str, float]:
    """Tokens/s of the trainer's inverse-CDF sampling and of ``generate(do_sample=True)`` (top-k
    off, as the trainer samples), the same model, batch and lengths: the median of
    ``--sampling-rounds`` alternating rounds after ``--warmup``."""
    import torch

    from trainer.training.loop import Trainer

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

    import trainer.state.checkpoint
    from trainer.training.loop import Trainer

    flush_seconds: list[float] = []
    fsync_tree = trainer.state.checkpoint.fsync_tree

    def timed_fsync_tree(root: Path) -> None:
        began = time.perf_counter()
        fsync_tree(root)
        flush_seconds.append(time.perf_counter() - began)

    # save_checkpoint looks fsync_tree up at each call
    with (
        mock.patch.object(trainer.state.checkpoint, "fsync_tree", timed_fsync_tree),
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
    from trainer.training.loop import Trainer

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
