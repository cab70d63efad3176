"""The ring or the grid over several seeds, with and without variants of the config, as a table
beside PacGAN's (Lin et al., 2018, Table 1).

    python research/mixture_seeds.py configs/training/ring.yaml                  # seeds 0-9, as configured
    python research/mixture_seeds.py configs/training/ring.yaml \\
        --variant "no EMA:training.ema_decay=0" --seeds 0 1 2 --jobs 2

Each run is `scripts/train_stage2.py` in its own process with one thread, `--jobs` of them side
by side, into OUTPUT/LABEL/seed-N (log beside it, as seed-N.log); a run whose `final/` is
already there is read, not run again, and one stopped before its end (a schedule of hours) goes
on from its last checkpoint. Rows give the mean and the range [min, max] over the
seeds of `modes`, `high_quality` and `reverse_kl` at the last eval (or each seed's mean over its
last K evals, `--last K`: late evals move by points from one to the next), and how many seeds
reach every mode.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from statistics import mean

ROOT = Path(__file__).resolve().parent.parent
METRICS = ("modes", "high_quality", "reverse_kl")
#: PacGAN's best row per mixture: modes, high-quality share, reverse KL
PACGAN = {"ring": ("PacGAN2", 7.9, 0.956, 0.07), "grid": ("PacGAN4", 24.8, 0.936, 0.04)}
#: glibc keeps freed tensors instead of faulting them in again each step (see docs/results/benchmarks.md)
KEEP_FREED_MEMORY = {"MALLOC_MMAP_THRESHOLD_": "1073741824", "MALLOC_TRIM_THRESHOLD_": "1073741824"}


def run_environment(threads: int) -> dict[str, str]:
    """This process's environment for one run with ``threads`` intra-op threads."""
    return {**os.environ, **KEEP_FREED_MEMORY, "OMP_NUM_THREADS": str(threads), "MKL_NUM_THREADS": str(threads)}


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="mixture_seeds", description=__doc__.split("\n\n")[0])
    p.add_argument("config", help="a gaussian_mixture training config, e.g. configs/training/ring.yaml")
    p.add_argument("--seeds", type=int, nargs="+", default=list(range(10)))
    p.add_argument("--jobs", type=int, default=2, help="runs side by side")
    p.add_argument(
        "--threads",
        type=int,
        default=1,
        help="threads of each run (default 1); one run alone on 2 cores: --jobs 1 --threads 2",
    )
    p.add_argument("--output-dir", default=None, help="default: outputs/seeds/<config name>")
    p.add_argument(
        "--variant",
        action="append",
        default=[],
        metavar="LABEL:KEY=VALUE[,KEY=VALUE]",
        help="a second row of runs with these overrides (repeatable); the config as it is comes first",
    )
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="dotted.key=value")
    p.add_argument(
        "--last",
        type=int,
        default=1,
        metavar="K",
        help="score each seed by the mean of its last K evals (default 1: the last eval, as the paper)",
    )
    return p


def parse_variant(text: str) -> tuple[str, list[str]]:
    """``"no EMA:training.ema_decay=0"`` -> ``("no EMA", ["training.ema_decay=0"])``."""
    label, sep, overrides = text.partition(":")
    if not sep or not label.strip() or "=" not in overrides:
        raise SystemExit(f"--variant {text!r}: expected LABEL:KEY=VALUE[,KEY=VALUE]")
    return label.strip(), [o.strip() for o in overrides.split(",") if o.strip()]


def last_evals(run_dir: Path, count: int) -> dict[str, float]:
    """Each metric's mean over the last ``count`` eval records of a finished run (``modes`` is
    the full count only where each of them reached every mode)."""
    path = run_dir / "metrics.jsonl"
    lines = path.read_text().splitlines()
    evals = [r for r in map(json.loads, filter(str.strip, lines)) if r.get("split") == "eval"]
    if len(evals) < count:
        raise SystemExit(f"{path}: {len(evals)} eval records, fewer than --last {count}")
    last = evals[-count:]
    return {m: mean(r[m] for r in last) for m in METRICS}


def run_one(config: str, run_dir: Path, seed: int, overrides: list[str], count: int, threads: int) -> dict[str, float]:
    """One seed of one variant: trained with ``threads`` threads unless its final export is there
    (an interrupted run goes on from its last checkpoint, its log appended to), then its last
    ``count`` evals."""
    if not (run_dir / "final").is_dir():
        command = [sys.executable, str(ROOT / "scripts" / "train_stage2.py"), "--config", config]
        command += ["--device", "cpu", "--output-dir", str(run_dir), "--set", f"training.seed={seed}"]
        command += ["--resume", "latest"]  # a fresh start where there is no checkpoint yet
        for override in overrides:
            command += ["--set", override]
        log = run_dir.with_suffix(".log")
        log.parent.mkdir(parents=True, exist_ok=True)
        with log.open("a") as out:
            done = subprocess.run(command, stdout=out, stderr=subprocess.STDOUT, env=run_environment(threads))
        if done.returncode != 0:
            raise SystemExit(f"seed {seed} ({run_dir}) exited {done.returncode}; see {log}")
        if not (run_dir / "final").is_dir():  # a signal or training.max_time: saved, then exit 0
            raise SystemExit(
                f"seed {seed} ({run_dir}) stopped before its end; run the command again to continue it "
                "from its last checkpoint"
            )
    return last_evals(run_dir, count)


def row(label: str, finals: list[dict[str, float]]) -> str:
    """Mean [min, max] of each metric over the seeds, and the seeds that reached every mode."""
    cells = []
    for metric in METRICS:
        values = [f[metric] for f in finals]
        digits = ".1f" if metric == "modes" else ".4f"
        cells.append(f"{mean(values):{digits}} [{min(values):{digits}}, {max(values):{digits}}]".rjust(28))
    return f"{label:18}" + "".join(cells)


def main(argv: list[str] | None = None) -> int:
    arguments = parser()
    args = arguments.parse_args(argv)
    if args.last < 1:
        arguments.error(f"--last {args.last}: expected 1 or more evals")
    if args.threads < 1:
        arguments.error(f"--threads {args.threads}: expected 1 or more")
    import yaml

    mixture = yaml.safe_load(Path(args.config).read_text())["task_options"]["mixture"]
    out = Path(args.output_dir or f"outputs/seeds/{Path(args.config).stem}")
    variants = [("as configured", []), *map(parse_variant, args.variant)]
    jobs = [(label, seed, [*args.overrides, *overrides]) for label, overrides in variants for seed in args.seeds]
    folder = {label: label.replace(" ", "_").replace("/", "_") for label, _ in variants}

    def run_job(job: tuple[str, int, list[str]]) -> dict[str, float]:
        label, seed, overrides = job
        return run_one(args.config, out / folder[label] / f"seed-{seed}", seed, overrides, args.last, args.threads)

    with ThreadPoolExecutor(max_workers=args.jobs) as pool:
        finals = list(pool.map(run_job, jobs))
    scored = "last eval" if args.last == 1 else f"mean of each seed's last {args.last} evals"
    print(f"{args.config}, seeds {' '.join(map(str, args.seeds))}, {scored}: mean [min, max]")
    print(f"{'':18}" + "".join(f"{m:>28}" for m in METRICS) + "   seeds with every mode")
    modes_all = 8 if mixture == "ring" else 25
    for i, (label, _) in enumerate(variants):
        per_seed = finals[i * len(args.seeds) : (i + 1) * len(args.seeds)]
        every = sum(f["modes"] == modes_all for f in per_seed)
        print(row(label, per_seed) + f"   {every}/{len(per_seed)}")
    name, modes, quality, kl = PACGAN[mixture]
    print(f"{name + ' (paper)':18}{modes:>28.1f}{quality:>28.4f}{kl:>28.4f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
