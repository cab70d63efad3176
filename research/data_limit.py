"""The data-limit experiment (issue: "Why stage 2 does not pay"): the main job's stage 2 and its
maximum-likelihood baseline on more real sequences than the sampled 10,000, up to an endless
stream (``task_options.train_sequences``), each against the frontier of the same data.

Stage 1 runs once (``--stage1-config``, on its sampled set). Then, for each data setting
(``--rows``: 10000, 100000, -1 for endless), each objective (``--objectives``: reinforce, the
shipped stage 2; seqgan, the same with ``training.d_steps_per_g_step`` 5; ddo) and each seed,
stage 2 from the stage-1 pair; the maximum-likelihood baseline on the same rows; and the
frontier: the stage-1 generator and that baseline at ``--frontier``'s temperatures. One table
row per setting and objective: the seeds beyond the frontier, nll_oracle and nll_test (mean
and range), the frontier's nll_oracle at the seeds' mean nll_test, and d_accuracy (mean); OUTPUT/rows-R/frontier.png
draws each setting (R: the rows, or endless). A finished run (its final/ written) is read, not trained again,
and an interrupted one goes on from its last checkpoint.

    python research/data_limit.py --device cpu          # all of it: about 95 minutes on 2 cores
    python research/data_limit.py --device cpu --rows 10000 -1 --objectives reinforce --seeds 0
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from statistics import mean

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from trainer.commands.cli import report  # noqa: E402
from trainer.commands.frontier import Curve, Point, add_frontier_option, judge, plot  # noqa: E402
from trainer.commands.oracle_report import frontier  # noqa: E402
from trainer.contract.devices import DEVICE_HELP, DEVICES  # noqa: E402
from trainer.contract.errors import UserError  # noqa: E402
from trainer.contract.logs import configure_logging  # noqa: E402

CONFIGS = ROOT / "configs" / "training"
#: each objective: its stage-2 config and what it sets beside it (--set strings)
OBJECTIVES: dict[str, tuple[Path, list[str]]] = {
    "reinforce": (CONFIGS / "stage2.yaml", []),
    "seqgan": (CONFIGS / "stage2.yaml", ["training.d_steps_per_g_step=5"]),
    "ddo": (CONFIGS / "stage2_ddo.yaml", []),
}
BASELINE = (CONFIGS / "stage2.yaml", ["training.objective=mle"])


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="data_limit", description=__doc__.split("\n\n")[0])
    p.add_argument("--rows", type=int, nargs="+", default=[10000, 100000, -1], help="train_sequences settings")
    p.add_argument("--objectives", nargs="+", default=list(OBJECTIVES), choices=list(OBJECTIVES))
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    p.add_argument("--stage1-config", default=str(CONFIGS / "stage1.yaml"))
    p.add_argument("--output-dir", default="outputs/data_limit")
    p.add_argument("--device", default="auto", choices=DEVICES, help=DEVICE_HELP)
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="dotted.key=value")
    add_frontier_option(p, "the frontier's temperatures")
    return p


def last_eval(run_dir: Path) -> dict[str, float]:
    lines = (run_dir / "metrics.jsonl").read_text().splitlines()
    return [r for r in map(json.loads, filter(str.strip, lines)) if r["split"] == "eval"][-1]


def trained(config: Path, overrides: list[str], out: Path, device: str) -> dict[str, float]:
    """A run's last eval: read when the run finished (its final/ is there), else trained, from
    its last checkpoint where an interrupted run left one."""
    from trainer.contract.config import load_config
    from trainer.training.loop import Trainer

    if not (out / "final").is_dir():
        Trainer(load_config(config, overrides, output_dir=out), device, resume="latest").fit()
    return last_eval(out)


def curve(name: str, generator: Path, args: argparse.Namespace) -> Curve:
    """A generator at the frontier's temperatures, scored on the runs' eval set."""
    rows = frontier(str(generator), args.stage1_config, args.overrides, args.frontier, args.device)
    return Curve(name, tuple(Point(t, test, oracle) for t, oracle, test in rows))


def spread(values: list[float]) -> str:
    return f"{mean(values):.3f} [{min(values):.3f}, {max(values):.3f}]"


def setting(args: argparse.Namespace, rows: int, stage1: Path) -> list[str]:
    """Every run of one data setting: the baseline, each objective's seeds; its table rows."""
    name = "endless" if rows == -1 else f"{rows:,}"
    out = Path(args.output_dir) / f"rows-{'endless' if rows == -1 else rows}"
    init = [f"init.{role}={stage1 / 'best' / role}" for role in ("generator", "discriminator")]
    common = [*args.overrides, *init, f"task_options.train_sequences={rows}"]
    baseline = out / "stage2-mle"
    config, extra = BASELINE
    trained(config, [*common, *extra, f"training.seed={args.seeds[0]}"], baseline, args.device)
    curves = [
        curve("stage 1", stage1 / "best" / "generator", args),
        curve("stage 1 + maximum likelihood", baseline / "final" / "generator", args),
    ]
    lines, drawn = [], {}
    for objective in args.objectives:
        config, extra = OBJECTIVES[objective]
        seeds, evals = {}, {}
        for seed in args.seeds:
            metrics = trained(
                config, [*common, *extra, f"training.seed={seed}"], out / objective / f"seed-{seed}", args.device
            )
            seeds[seed], evals[seed] = Point(1.0, metrics["nll_test"], metrics["nll_oracle"]), metrics
        drawn |= {f"{objective}, seed {seed}": point for seed, point in seeds.items()}
        beyond = sum(judge(curves, point).beyond for point in seeds.values())
        at = judge(curves, Point(1.0, mean(p.diversity for p in seeds.values()), 0.0)).frontier
        oracle, test = [p.quality for p in seeds.values()], [p.diversity for p in seeds.values()]
        frontier_text = "outside its range" if at is None else f"{at:.3f}"
        accuracy = mean(e["d_accuracy"] for e in evals.values())
        lines.append(
            f"| {name} | {objective} | {beyond} of {len(seeds)} | {spread(oracle)} | {spread(test)} "
            f"| {frontier_text} | {accuracy:.3f} |"
        )
    plot(curves, drawn, "nll_oracle", "nll_test", out / "frontier.png")
    return lines


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    configure_logging()
    from trainer.commands.stages import fit_stage1

    stage1 = Path(args.output_dir) / "stage1"
    try:
        if not (stage1 / "final").is_dir():
            fit_stage1(args.stage1_config, args.overrides, output_dir=stage1, device=args.device, resume="latest")
        table = [line for rows in args.rows for line in setting(args, rows, stage1)]
    except UserError as exc:
        return report(exc, "0")
    print(
        "| real sequences | objective | beyond the frontier | nll_oracle | nll_test | frontier at the mean nll_test "
        "| d_accuracy |"
    )
    print("|---|---|---|---|---|---|---|")
    print("\n".join(table))
    return 0


if __name__ == "__main__":
    sys.exit(main())
