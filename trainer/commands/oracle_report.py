"""The oracle_text benchmark's reports: a generator's evals over temperatures, the stage table
against the SeqGAN paper's published figures, and each stage-2 seed against the frontier (the
stage-1 and maximum-likelihood generators over temperatures, see :mod:`trainer.commands.frontier`)."""

from __future__ import annotations

import math
import statistics
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from trainer.commands.frontier import (
    Curve,
    Point,
    Verdict,
    curve_table,
    judge,
    meaning_line,
    plot,
    summary_line,
    verdict_line,
)
from trainer.commands.stages import MLE_BASELINE
from trainer.contract.config import load_config
from trainer.contract.errors import ConfigError
from trainer.contract.registry import load_task
from trainer.tasks.sequence_metrics import pearson

if TYPE_CHECKING:
    from trainer.commands.stages import StageResult


def command_overrides(overrides: list[str], oracle: str | None, device: str) -> list[str]:
    """The ``--set`` overrides of an oracle script, with ``--oracle`` as ``data.oracle_path``;
    ``--device cuda`` where no GPU is visible is a ConfigError."""
    if device == "cuda" and not torch.cuda.is_available():
        raise ConfigError("--device cuda: no GPU is visible to this process")
    return [*overrides, f"data.oracle_path={oracle}"] if oracle else list(overrides)


@torch.no_grad()
def frontier(
    generator_dir: str, config: str, overrides: list[str], temperatures: list[float], device: str
) -> list[tuple[float, float, float]]:
    """(temperature, nll_oracle, nll_test) of the generator in ``generator_dir``, one per temperature."""
    run = load_config(config, overrides, generator_config=generator_dir)
    task = load_task(run)
    generator = task.build_generator().to(device).eval()
    loader = torch.utils.data.DataLoader(
        task.eval_dataset(), batch_size=run.config.eval.batch_size, collate_fn=task.collate
    )
    rows = []
    for temperature in temperatures:
        totals = {"nll_oracle": 0.0, "nll_test": 0.0}
        for batch in loader:
            batch = {name: value.to(device) for name, value in batch.items()}
            outputs = task.generator_eval(generator, batch, temperature)
            for name in totals:
                totals[name] += float(outputs[name].double().sum())
        count = len(loader.dataset)
        rows.append((temperature, totals["nll_oracle"] / count, totals["nll_test"] / count))
    return rows


def partial_correlation(x: torch.Tensor, y: torch.Tensor, given: torch.Tensor) -> float:
    """Pearson's correlation of ``x`` and ``y`` with what ``given`` explains linearly of each removed."""
    r_xy, r_xz, r_yz = pearson(x, y), pearson(x, given), pearson(y, given)
    return (r_xy - r_xz * r_yz) / math.sqrt((1 - r_xz**2) * (1 - r_yz**2))


#: the rows of :func:`discriminator_quality`: what each says, by key
QUALITY_ROWS = {
    "d_oracle": "corr(discriminator's rating, oracle log-likelihood)",
    "g_oracle": "corr(generator's log-likelihood, oracle log-likelihood)",
    "d_g": "corr(discriminator's rating, generator's log-likelihood)",
    "d_oracle_given_g": "partial corr(discriminator, oracle | generator's log-likelihood)",
}


@torch.no_grad()
def discriminator_quality(
    pair_dir: str, config: str, overrides: list[str], samples: int, chunk: int, device: str, seed: int = 0
) -> dict[str, list[float]]:
    """Whether a discriminator rates quality beyond what its generator's own likelihood knows:
    on ``samples`` sequences of the generator in ``pair_dir`` (temperature 1), the correlations of
    :data:`QUALITY_ROWS` (per token means of log-likelihoods; the rating is the discriminator's
    logit of the whole sequence), over all samples first, then over each ``chunk`` of them."""
    pair = Path(pair_dir)
    # The pair is what this run starts from: a config's own init (stage 1's outputs) need not exist.
    starts = [f"init.{role}={pair / role}" for role in ("generator", "discriminator")]
    run = load_config(config, [*overrides, *starts], pair / "generator", pair / "discriminator")
    task = load_task(run)
    generator = task.build_generator().to(device).eval()
    discriminator = task.build_discriminator().to(device).eval()
    rng = torch.Generator(device).manual_seed(seed)
    columns: dict[str, list[torch.Tensor]] = {"d": [], "g": [], "oracle": []}
    oracle = task.oracle.to(device)
    for start in range(0, samples, chunk):
        sequences = task.generate(generator, min(chunk, samples - start), rng)
        columns["d"].append(task.score(discriminator, sequences).double().cpu())
        columns["g"].append(task.token_log_probs(generator, sequences).double().mean(1).cpu())
        columns["oracle"].append(oracle.token_log_probs(sequences).double().mean(1).cpu())
    parts = [{name: values[i] for name, values in columns.items()} for i in range(len(columns["d"]))]
    whole = {name: torch.cat(values) for name, values in columns.items()}
    rows: dict[str, list[float]] = {}
    for c in (whole, *parts):
        for key, value in (
            ("d_oracle", pearson(c["d"], c["oracle"])),
            ("g_oracle", pearson(c["g"], c["oracle"])),
            ("d_g", pearson(c["d"], c["g"])),
            ("d_oracle_given_g", partial_correlation(c["d"], c["oracle"], c["g"])),
        ):
            rows.setdefault(key, []).append(value)
    return rows


def table(rows: list[tuple[float, float, float]]) -> str:
    """The frontier as text, each row's change relative to the first row."""
    _, oracle0, test0 = rows[0]
    lines = [f"{'temperature':>11} {'nll_oracle':>10} {'nll_test':>10} {'change':>20}"]
    for temperature, oracle, test in rows:
        change = f"{100 * (oracle / oracle0 - 1):+.2f}% / {100 * (test / test0 - 1):+.2f}%"
        lines.append(f"{temperature:11.2f} {oracle:10.4f} {test:10.4f} {change:>20}")
    return "\n".join(lines)


#: NLL_oracle at length 20 on the SeqGAN oracle (SeqGAN paper, Table 1)
PUBLISHED_NLL_ORACLE = {"stage 1": ("MLE", 9.038), "stage 2": ("SeqGAN", 8.736)}
METRICS = ("nll_oracle", "nll_test", "d_accuracy")


def stage2_runs(result: StageResult) -> dict[int, dict[str, Any]]:
    """The final eval metrics of each stage-2 run of a pipeline, by seed."""
    names = ["stage 2", *(f"stage 2, seed {seed}" for seed in result.stage2_seeds[1:])]
    return {seed: result.metrics.get(name, {}) for seed, name in zip(result.stage2_seeds, names, strict=True)}


def stage2_mean(result: StageResult) -> dict[str, float]:
    """Stage 2's metrics, the mean over its seeds (those that every run has)."""
    runs = list(stage2_runs(result).values())
    return {m: statistics.fmean(run[m] for run in runs) for m in METRICS if runs and all(m in run for run in runs)}


def oracle_table(result: StageResult, published: bool) -> str:
    """The metric table of an oracle_text pipeline: stage 1's pair (the eval of the
    discriminator's run, whose generator is the stage-1 one) against stage 2's final eval (the
    mean over its seeds, then each seed), with the relative change and, on the SeqGAN oracle,
    the published values."""
    runs = stage2_runs(result)
    seeds = " ".join(map(str, runs))
    rows = {"stage 1": result.metrics.get("stage 1 discriminator", {}), "stage 2": stage2_mean(result)}
    if len(runs) > 1:
        rows |= {f"  seed {seed}": metrics for seed, metrics in runs.items()}
    header = f"{'':10}" + "".join(f"{m:>12}" for m in METRICS)
    if published:
        header += f"{'published nll_oracle':>26}"
    lines = [header]
    for name, values in rows.items():
        line = f"{name:10}" + "".join(f"{values[m]:12.4f}" if m in values else f"{'-':>12}" for m in METRICS)
        if published and name in PUBLISHED_NLL_ORACLE:
            label, value = PUBLISHED_NLL_ORACLE[name]
            line += f"{f'{label} {value}':>26}"
        if name == "stage 2" and len(runs) > 1:
            line += f"   mean of seeds {seeds}"
        lines.append(line)
    change = relative_change(result)
    if change:
        line = f"{'change':10}" + "".join(f"{100 * change[m]:+11.2f}%" for m in ("nll_oracle", "nll_test"))
        if len(runs) > 1:
            first = rows["stage 1"]["nll_oracle"]
            by_seed = sorted(100 * (run["nll_oracle"] / first - 1) for run in runs.values())
            line += f"{'':12}   nll_oracle by seed: {by_seed[0]:+.2f}% to {by_seed[-1]:+.2f}%"
        lines.append(line)
    if len(runs) == 1:
        lines.append(
            "one seed: stage 2 from the same stage-1 pair moves nll_oracle by several percent from one "
            "seed to the next (docs/results/oracle.md); --stage2-seeds 3 runs three"
        )
    return "\n".join(lines)


def relative_change(result: StageResult) -> dict[str, float]:
    """Stage 2's nll_oracle and nll_test (the mean over its seeds) relative to stage 1's (-0.03:
    3% lower); empty when a run lacks them."""
    first, second = result.metrics.get("stage 1 discriminator", {}), stage2_mean(result)
    if not all(m in first and m in second for m in ("nll_oracle", "nll_test")):
        return {}
    return {m: (second[m] - first[m]) / first[m] for m in ("nll_oracle", "nll_test")}


def frontier_curves(
    output_dir: Path, config: str, overrides: list[str], temperatures: list[float], device: str
) -> list[Curve]:
    """The frontier of a pipeline: the stage-1 generator, and the maximum-likelihood baseline
    (when the pipeline ran it), each at ``temperatures``."""
    generators = {
        "stage 1": output_dir / "stage1" / "best" / "generator",
        "stage 1 + maximum likelihood": output_dir / MLE_BASELINE / "final" / "generator",
    }
    curves = []
    for name, path in generators.items():
        if path.is_dir():
            rows = frontier(str(path), config, overrides, temperatures, device)
            curves.append(Curve(name, tuple(Point(t, test, oracle) for t, oracle, test in rows)))
    return curves


#: where the main job's figures, and every stage-2 objective tried against its frontier, are
ORACLE_RESULTS = 'docs/results/oracle.md, "Stage-2 objectives against the frontier"'


def frontier_report(result: StageResult, curves: list[Curve], output_dir: Path) -> tuple[str, list[Verdict]]:
    """The curves, each stage-2 seed against the frontier (nll_oracle at its nll_test), the
    count of seeds beyond it, the plot's path; and the verdicts."""
    points = {
        seed: Point(1.0, metrics["nll_test"], metrics["nll_oracle"])
        for seed, metrics in stage2_runs(result).items()
        if "nll_test" in metrics and "nll_oracle" in metrics
    }
    verdicts = [judge(curves, point) for point in points.values()]
    lines = ["the frontier (the generators at these temperatures, no further training):"]
    lines += [curve_table(curves, "nll_oracle", "nll_test"), ""]
    lines += [
        f"seed {seed}: {verdict_line(v, 'nll_oracle', 'nll_test')}" for seed, v in zip(points, verdicts, strict=True)
    ]
    seeds = {f"stage 2, seed {seed}": point for seed, point in points.items()}
    path = plot(curves, seeds, "nll_oracle", "nll_test", output_dir / "frontier.png")
    lines.append(f"plot: {path}" if path else "plot: not drawn (pip install matplotlib, the plots extra)")
    lines.append(summary_line(verdicts))
    lines.append(meaning_line(verdicts, "nll_oracle", "nll_test", ORACLE_RESULTS))
    return "\n".join(lines), verdicts
