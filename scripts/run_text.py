"""The text recipe end to end on the offline example: stage 1 then stage 2 per seed, then the
table of nll_test, bleu4 and self_bleu4, and each seed's stage 2 against the frontier it has to
beat.

    python scripts/run_text.py --device cpu                   # seeds 0 1 2, one after another
    python scripts/run_text.py --device cpu --seeds 0         # one seed
    python scripts/run_text.py --device cpu --stage2-config configs/training/text_stage2_ddo.yaml

The example (scripts/make_text_example.py) is written to OUTPUT/text_example when missing;
each seed's runs go to OUTPUT/seed-N/stage1, OUTPUT/seed-N/stage2 and OUTPUT/seed-N/stage2-mle
(the stage-1 generator trained on by maximum likelihood alone with stage 2's config: its
steps, batch and optimizer). Sampling below temperature 1 trades diversity (self_bleu4 rises)
for quality (bleu4 rises) without training, and more maximum-likelihood steps may buy both:
the frontier is the stage-1 and the maximum-likelihood generators at temperatures 1.2 to 0.6
(`--frontier`), bleu4 (quality) against self_bleu4 (diversity), both scored on the same
generated texts as in "Language GANs Falling Short" (Caccia et al.); nll_test scores the
model, not its texts. A seed's stage 2 is beyond the frontier when its bleu4 is higher than
the frontier's at its self_bleu4. Rows give the mean over the seeds and the range [min, max];
OUTPUT/frontier-seed-N.png draws a seed's frontier and its stage 2.
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
from pathlib import Path
from statistics import mean

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from trainer.commands.cli import exit_command  # noqa: E402
from trainer.commands.frontier import add_frontier_option  # noqa: E402
from trainer.contract.devices import DEVICE_HELP, DEVICES  # noqa: E402
from trainer.contract.logs import configure_logging  # noqa: E402

METRICS = ("nll_test", "bleu4", "self_bleu4")
#: the frontier's metrics: quality (higher is better) against diversity (lower is better)
QUALITY, DIVERSITY = "bleu4", "self_bleu4"


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="run_text", description=__doc__.split("\n\n")[0])
    p.add_argument("--output-dir", default="outputs/text_runs")
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    p.add_argument("--device", default="auto", choices=DEVICES, help=DEVICE_HELP)
    p.add_argument(
        "--stage2-config",
        default="configs/training/text_stage2.yaml",
        help="stage 2's config, also the maximum-likelihood baseline's steps, batch and optimizer",
    )
    add_frontier_option(p, "the frontier's temperatures, 1 among them; fewer take less time")
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="dotted.key=value")
    return p


def example_overrides(example: Path, seed: int) -> list[str]:
    """What points both stages' configs at the example, with the seed."""
    return [
        f"data.train_files={example / 'texts.jsonl'}",
        f"data.eval_files={example / 'eval.jsonl'}",
        f"training.seed={seed}",
    ]


def run_seed(out: Path, example: Path, seed: int, args: argparse.Namespace) -> tuple[dict, list]:
    """Stage 1, stage 2 and the maximum-likelihood baseline of one seed; the rows of the table
    (stage 1 at temperature 1, stage 2) and the frontier's curves."""
    from trainer.commands.frontier import Curve, Point
    from trainer.commands.stages import MLE_BASELINE, fit_run, fit_stage1
    from trainer.contract.config import load_config
    from trainer.training.loop import Trainer

    device, stage2_config = args.device, args.stage2_config
    overrides = [*example_overrides(example, seed), *args.overrides]
    stage1 = [f"model.generator_config={example / 'gpt2'}", *overrides]
    fit_stage1("configs/training/text_stage1.yaml", stage1, output_dir=out / "stage1", device=device, resume="latest")
    pair = [f"model.{role}_config={out / 'stage1' / 'best' / role}" for role in ("generator", "discriminator")]
    run = load_config(stage2_config, [*pair, *overrides], output_dir=out / "stage2")
    stage2, _ = fit_run(run, device, resume="latest")
    mle = [*pair, *overrides, "training.objective=mle"]
    fit_run(load_config(stage2_config, mle, output_dir=out / MLE_BASELINE), device, "latest")
    curves = []
    for name, weights in (
        ("stage 1", out / "stage1" / "best"),
        ("stage 1 + maximum likelihood", out / MLE_BASELINE / "final"),
    ):
        points = []
        for temperature in args.frontier:
            at = [*stage1, f"task_options.temperature={temperature}"]
            metrics = Trainer(load_config("configs/training/text_stage1.yaml", at), device=device).evaluate(weights)
            points.append(Point(temperature, metrics[DIVERSITY], metrics[QUALITY]))
            if name == "stage 1" and temperature == 1.0:
                stage1_metrics = metrics
        curves.append(Curve(name, tuple(points)))
    return {"stage 1": stage1_metrics, "stage 2": stage2}, curves


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


#: where the text recipe's figures against its frontier are
TEXT_RESULTS = 'docs/own-models.md, "Your own models and texts: the `text` recipe"'


def frontier_report(runs: dict[int, tuple[dict, list]], out: Path) -> str:
    """Each seed's curves and its stage 2 against them, the plots, the count of seeds beyond."""
    from trainer.commands.frontier import Point, curve_table, judge, meaning_line, plot, summary_line, verdict_line

    lines, verdicts, drawn = [], [], []
    for seed, (rows, curves) in runs.items():
        point = Point(1.0, rows["stage 2"][DIVERSITY], rows["stage 2"][QUALITY])
        verdicts.append(judge(curves, point, higher_is_better=True))
        lines += [f"\nseed {seed}, the frontier:", curve_table(curves, QUALITY, DIVERSITY)]
        lines.append(f"seed {seed}: {verdict_line(verdicts[-1], QUALITY, DIVERSITY)}")
        seed_curves = [dataclasses.replace(c, name=f"seed {seed}, {c.name}") for c in curves]
        drawn.append(
            plot(
                seed_curves,
                {f"seed {seed}, stage 2": point},
                QUALITY,
                DIVERSITY,
                out / f"frontier-seed-{seed}.png",
            )
        )
    lines.append(f"plots: {', '.join(map(str, drawn))}" if all(drawn) else "plots: not drawn (pip install matplotlib)")
    lines.append(summary_line(verdicts))
    lines.append(meaning_line(verdicts, QUALITY, DIVERSITY, TEXT_RESULTS))
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    arguments = parser()
    args = arguments.parse_args(argv)
    if 1.0 not in args.frontier:  # the table's stage-1 row is stage 1 at temperature 1
        given = " ".join(f"{t:g}" for t in args.frontier)
        arguments.error(f"--frontier {given}: the temperatures must include 1 (the table's stage-1 row)")
    configure_logging()
    from trainer.commands.text_example import write_text_example
    from trainer.distributed.world import end_process_group

    out = Path(args.output_dir)
    example = out / "text_example"
    if not (example / "gpt2" / "config.json").is_file():
        write_text_example(example)
    try:
        runs = {seed: run_seed(out / f"seed-{seed}", example, seed, args) for seed in args.seeds}
    finally:
        end_process_group()
    print(f"seeds {' '.join(map(str, args.seeds))}: mean [min, max]")
    print(table([rows for rows, _ in runs.values()]))
    for seed in args.seeds:
        for stage in ("stage1", "stage2"):
            samples = sorted((out / f"seed-{seed}" / stage / "samples").glob("step-*.txt"))
            if samples:
                print(f"\nseed {seed}, {stage}, {samples[-1].name}:")
                print("\n".join(samples[-1].read_text().splitlines()[:3]))
    print(frontier_report(runs, out))
    return 0


if __name__ == "__main__":
    exit_command(main())
