"""Draw the train and eval curves of a run's metrics.jsonl into one PNG.

    python scripts/plot_metrics.py OUTPUT_DIR [--out FILE.png] [--train KEY ...] [--eval KEY ...]

By default: the train losses (keys ending in _loss) and every numeric eval metric, one panel
each, against the optimizer step. Needs matplotlib (pip install -e ".[plots]").
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path
from typing import Any

#: bookkeeping fields, not curves
NOT_CURVES = {"step", "split", "world_size", "num_samples"}


def read_records(path: Path) -> list[dict[str, Any]]:
    """The records of a metrics.jsonl; a broken line is an error naming its line number."""
    records = []
    for number, line in enumerate(path.read_text().splitlines(), start=1):
        if not line.strip():
            continue
        try:
            records.append(json.loads(line))
        except json.JSONDecodeError as exc:
            raise SystemExit(f"error: {path}: line {number}: not JSON ({exc.msg})") from None
    return records


def curves(records: list[dict[str, Any]], split: str, keys: list[str] | None) -> dict[str, tuple[list, list]]:
    """(steps, values) of each numeric key of ``split`` (or of ``keys``)."""
    chosen = [r for r in records if r.get("split") == split]
    if keys is None:
        found = {k for r in chosen for k, v in r.items() if isinstance(v, (int, float)) and not isinstance(v, bool)}
        found -= NOT_CURVES
        keys = sorted(k for k in found if split == "eval" or k.endswith("_loss"))
    out = {}
    for key in keys:
        points = [(r["step"], r[key]) for r in chosen if isinstance(r.get(key), (int, float))]
        points = [(s, v) for s, v in points if math.isfinite(v)]
        if points:
            out[f"{split}/{key}"] = ([s for s, _ in points], [v for _, v in points])
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="plot_metrics", description=__doc__.split("\n\n")[0])
    p.add_argument("output_dir", type=Path)
    p.add_argument("--out", type=Path, help="the PNG to write (default: OUTPUT_DIR/metrics.png)")
    p.add_argument("--train", nargs="+", metavar="KEY", help="train keys to draw (default: the losses)")
    p.add_argument("--eval", nargs="+", metavar="KEY", help="eval keys to draw (default: all)")
    args = p.parse_args(argv)
    path = args.output_dir / "metrics.jsonl"
    if not path.is_file():
        print(f"error: {path}: no metrics.jsonl (is {args.output_dir} a run's output directory?)", file=sys.stderr)
        return 2
    records = read_records(path)
    panels = {**curves(records, "train", args.train), **curves(records, "eval", args.eval)}
    if not panels:
        print(f"error: {path}: no numeric values to draw", file=sys.stderr)
        return 2
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print('error: plot_metrics needs matplotlib: pip install -e ".[plots]"', file=sys.stderr)
        return 2
    columns = min(3, len(panels))
    rows = math.ceil(len(panels) / columns)
    fig, axes = plt.subplots(rows, columns, figsize=(4.5 * columns, 3.2 * rows), squeeze=False)
    for ax, (name, (steps, values)) in zip(axes.flat, panels.items(), strict=False):  # spare axes hidden below
        ax.plot(steps, values, marker="." if len(steps) < 50 else None)
        ax.set_title(name)
        ax.set_xlabel("step")
        ax.grid(alpha=0.3)
    for ax in list(axes.flat)[len(panels) :]:
        ax.set_visible(False)
    fig.tight_layout()
    out = args.out or args.output_dir / "metrics.png"
    fig.savefig(out, dpi=100)
    plt.close(fig)
    print(f"wrote {out} ({len(panels)} panels: {', '.join(panels)})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
