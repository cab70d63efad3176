"""The text recipe end to end on the offline example: stage 1 then stage 2 per seed, then the
table of nll_test, bleu4 and self_bleu4, with the stage-1 generator at lower temperatures as
the baseline a stage 2 has to beat.

    python scripts/run_text.py --device cpu                   # seeds 0 1 2, one after another
    python scripts/run_text.py --device cpu --seeds 0         # one seed (about 10 minutes)

The example (scripts/make_text_example.py) is written to OUTPUT/text_example when missing;
each seed's runs go to OUTPUT/seed-N/stage1 and OUTPUT/seed-N/stage2. Sampling below
temperature 1 trades diversity (self_bleu4 rises) for quality (bleu4 rises, nll_test too)
without training, so a stage 2 is better than its stage 1 only where no temperature of the
stage-1 generator reaches its bleu4 at a self_bleu4 and nll_test as low. Rows give the mean
over the seeds and the range [min, max].
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from statistics import mean

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from trainer.logs import configure_logging  # noqa: E402

METRICS = ("nll_test", "bleu4", "self_bleu4")
TEMPERATURES = (1.0, 0.9, 0.8)


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="run_text", description=__doc__.split("\n\n")[0])
    p.add_argument("--output-dir", default="outputs/text_runs")
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    p.add_argument("--device", default="auto", choices=["auto", "cpu", "cuda"])
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="dotted.key=value")
    return p


def example_overrides(example: Path, seed: int) -> list[str]:
    """What points both stages' configs at the example, with the seed."""
    return [
        f"data.train_files={example / 'texts.jsonl'}",
        f"data.eval_files={example / 'eval.jsonl'}",
        f"training.seed={seed}",
    ]


def run_seed(out: Path, example: Path, seed: int, device: str, extra: list[str]) -> dict[str, dict[str, float]]:
    """Stage 1 then stage 2 of one seed; the rows of the table (stage 1 at each temperature,
    stage 2) for it."""
    from trainer.config import load_config
    from trainer.loop import Trainer
    from trainer.stages import fit_run, fit_stage1

    overrides = [*example_overrides(example, seed), *extra]
    stage1 = [f"model.generator_config={example / 'gpt2'}", *overrides]
    fit_stage1("configs/training/text_stage1.yaml", stage1, output_dir=out / "stage1", device=device, resume="latest")
    pair = [f"model.{role}_config={out / 'stage1' / 'best' / role}" for role in ("generator", "discriminator")]
    run = load_config("configs/training/text_stage2.yaml", [*pair, *overrides], output_dir=out / "stage2")
    stage2, _ = fit_run(run, device, resume="latest")
    rows = {}
    for temperature in TEMPERATURES:
        run = load_config("configs/training/text_stage1.yaml", [*stage1, f"task_options.temperature={temperature}"])
        rows[f"stage 1, T={temperature:g}"] = Trainer(run, device=device).evaluate(out / "stage1" / "best")
    rows["stage 2"] = stage2
    return rows


def table(per_seed: list[dict[str, dict[str, float]]]) -> str:
    """Mean and [min, max] over the seeds of each row's metrics."""
    lines = [f"{'':16}" + "".join(f"{m:>26}" for m in METRICS)]
    for name in per_seed[0]:
        cells = []
        for metric in METRICS:
            values = [rows[name][metric] for rows in per_seed]
            cells.append(f"{mean(values):.4f} [{min(values):.4f}, {max(values):.4f}]".rjust(26))
        lines.append(f"{name:16}" + "".join(cells))
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    configure_logging()
    from trainer.text_example import write_text_example
    from trainer.world import end_process_group

    out = Path(args.output_dir)
    example = out / "text_example"
    if not (example / "gpt2" / "config.json").is_file():
        write_text_example(example)
    try:
        per_seed = [run_seed(out / f"seed-{seed}", example, seed, args.device, args.overrides) for seed in args.seeds]
    finally:
        end_process_group()
    print(f"seeds {' '.join(map(str, args.seeds))}: mean [min, max]")
    print(table(per_seed))
    for seed in args.seeds:
        for stage in ("stage1", "stage2"):
            samples = sorted((out / f"seed-{seed}" / stage / "samples").glob("step-*.txt"))
            if samples:
                print(f"\nseed {seed}, {stage}, {samples[-1].name}:")
                print("\n".join(samples[-1].read_text().splitlines()[:3]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
