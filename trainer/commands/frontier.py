"""The quality-diversity frontier a stage 2 has to beat, and the verdict on a stage-2 point.

Sampling a generator at a lower temperature buys quality with diversity and no training, and
more maximum-likelihood steps may buy both; so a stage-2 generator has earned something only
if it lies beyond the frontier those reach. A curve is one generator's evals at several
temperatures, its points joined by straight lines in temperature order (a diversity metric
such as ``nll_test`` is not monotonic in the temperature: it is lowest near 1, so the branch
above 1 and the branch below 1 may both span one value). The frontier at a diversity value is
the best quality of every segment of every curve that spans it; a point whose diversity no
segment spans is not beyond it.
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

#: the temperatures of a frontier's curves, from above 1 (its diverse end) to well below; 0.02
#: apart from 1 to 0.9, where stage 2 lands: between points 0.1 apart the straight line lies
#: above the curve (on the oracle, 0.03 of nll_oracle above the eval at 0.96), which would call
#: a point on the curve beyond it
FRONTIER_TEMPERATURES = (1.2, 1.1, 1.05, 1.0, 0.98, 0.96, 0.94, 0.92, 0.9, 0.85, 0.8, 0.7, 0.6)


def temperature_argument(text: str) -> float:
    """argparse type of a temperature on the command line: a positive number."""
    value = float(text)
    if not value > 0:
        raise argparse.ArgumentTypeError(f"{text} is not a positive number")
    return value


def add_frontier_option(parser: argparse.ArgumentParser, purpose: str) -> None:
    """``--frontier T ...``: a command's frontier temperatures, ``FRONTIER_TEMPERATURES`` by default."""
    parser.add_argument(
        "--frontier",
        type=temperature_argument,
        nargs="+",
        metavar="T",
        default=list(FRONTIER_TEMPERATURES),
        help=f"{purpose} (default: %(default)s)",
    )


@dataclass(frozen=True)
class Point:
    """One eval: the temperature it sampled at, its diversity and quality metrics."""

    temperature: float
    diversity: float
    quality: float


@dataclass(frozen=True)
class Curve:
    """One generator at several temperatures (points in the order the temperatures were given)."""

    name: str
    points: tuple[Point, ...]


@dataclass(frozen=True)
class Verdict:
    """A stage-2 point against the frontier: the frontier's quality at its diversity (None
    outside the frontier's range) and whether the point is strictly better."""

    point: Point
    frontier: float | None
    beyond: bool


def frontier_at(curves: Sequence[Curve], diversity: float, higher_is_better: bool = False) -> float | None:
    """The frontier's quality at ``diversity``: the best of the segments that span it."""
    values = []
    for curve in curves:
        for a, b in zip(curve.points, curve.points[1:], strict=False):
            low, high = sorted((a.diversity, b.diversity))
            if not low <= diversity <= high:
                continue
            if high == low:
                values.extend((a.quality, b.quality))
            else:
                share = (diversity - a.diversity) / (b.diversity - a.diversity)
                values.append(a.quality + share * (b.quality - a.quality))
    if not values:
        return None
    return max(values) if higher_is_better else min(values)


def judge(curves: Sequence[Curve], point: Point, higher_is_better: bool = False) -> Verdict:
    """Whether ``point``'s quality is strictly better than the frontier's at its diversity."""
    value = frontier_at(curves, point.diversity, higher_is_better)
    if value is None:
        return Verdict(point, None, False)
    beyond = point.quality > value if higher_is_better else point.quality < value
    return Verdict(point, value, beyond)


def verdict_line(verdict: Verdict, quality: str, diversity: str) -> str:
    """``frontier: stage 2 Q X at D Y; frontier at Y: Z; beyond: yes|no``."""
    p = verdict.point
    at = "outside its range" if verdict.frontier is None else f"{verdict.frontier:.4f}"
    return (
        f"frontier: stage 2 {quality} {p.quality:.4f} at {diversity} {p.diversity:.4f}; "
        f"frontier at {p.diversity:.4f}: {at}; beyond: {'yes' if verdict.beyond else 'no'}"
    )


def summary_line(verdicts: Sequence[Verdict]) -> str:
    """``beyond the frontier: K of N seeds``."""
    return f"beyond the frontier: {sum(v.beyond for v in verdicts)} of {len(verdicts)} seeds"


def meaning_line(verdicts: Sequence[Verdict], quality: str, diversity: str, page: str) -> str:
    """What :func:`summary_line` means for whoever ran the job, in one sentence, and where the
    figures are (``page``)."""
    beyond, seeds = sum(v.beyond for v in verdicts), len(verdicts)
    against = (
        f"better {quality} at its own {diversity} than the stage-1 generator (and the maximum-likelihood baseline, "
        "where run) reach by sampling at another temperature, with no further training"
    )
    if beyond == seeds:
        outcome = f"every seed's stage 2 reached {against}: here stage 2 paid"
    elif beyond == 0:
        outcome = f"no seed's stage 2 reached {against}: here stage 2 bought nothing a temperature does not"
    else:
        outcome = f"{beyond} of {seeds} seeds' stage 2 reached {against}: here stage 2 does not pay reliably"
    return f"what this means: {outcome}; the figures and what was tried: {page}"


def curve_table(curves: Sequence[Curve], quality: str, diversity: str) -> str:
    """Each curve's points as text."""
    lines = [f"{'generator':28} {'temperature':>11} {quality:>12} {diversity:>12}"]
    for curve in curves:
        lines += [f"{curve.name:28} {p.temperature:11.2f} {p.quality:12.4f} {p.diversity:12.4f}" for p in curve.points]
    return "\n".join(lines)


def plot(curves: Sequence[Curve], stage2: dict[str, Point], quality: str, diversity: str, path: Path) -> Path | None:
    """The curves (each point labelled with its temperature) and the stage-2 points on one PNG;
    None when matplotlib (the ``plots`` extra) is not installed."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    figure, axes = plt.subplots(figsize=(7, 5))
    for curve in curves:
        xs, ys = [p.diversity for p in curve.points], [p.quality for p in curve.points]
        axes.plot(xs, ys, marker="o", label=curve.name)
        for p in curve.points:
            axes.annotate(f"{p.temperature:g}", (p.diversity, p.quality), fontsize=7, xytext=(3, 3),
                          textcoords="offset points")  # fmt: skip
    for name, p in stage2.items():
        axes.plot([p.diversity], [p.quality], marker="*", markersize=12, linestyle="none", label=name)
    axes.set_xlabel(f"{diversity} (the curves: temperatures as labelled)")
    axes.set_ylabel(quality)
    axes.legend(fontsize=8)
    axes.grid(alpha=0.3)
    figure.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(path, dpi=120)
    plt.close(figure)
    return path
