"""Run each fault against the real launcher at 1, 2 and 4 CPU processes; print a table.

    python scripts/fault_matrix.py [--processes 1 2 4] [--scenarios NAME ...] [--repeat N]
        [--accelerate-config cpu_fsdp.yaml]

The scenarios and their bounds are in harness/faultmatrix/. In the scenarios of two simulated
nodes (two_nodes*), --processes counts the processes of each node.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from harness.faultmatrix import SCENARIOS, run_scenario  # noqa: E402


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--processes", type=int, nargs="+", default=[1, 2, 4])
    p.add_argument("--scenarios", nargs="+", default=list(SCENARIOS), choices=list(SCENARIOS))
    p.add_argument("--repeat", type=int, default=1, help="run each row this many times (intermittent faults)")
    p.add_argument(
        "--accelerate-config",
        default="8gpu.yaml",
        help="the config in accelerate_configs/ of the runs' accelerate launch (cpu_fsdp.yaml: FSDP2)",
    )
    args = p.parse_args()
    print("| scenario | processes | within bound | outcome | seconds | left on disk |")
    print("|---|---|---|---|---|---|")
    failures = 0
    rows = [(name, processes) for name in args.scenarios for processes in args.processes]
    for name, processes in [row for row in rows for _ in range(args.repeat)]:
        row = run_scenario(name, processes, accelerate_config=args.accelerate_config)
        failures += not row.ok
        print(
            f"| {row.scenario} | {row.processes} | {'yes' if row.ok else 'NO'} | {row.outcome} | "
            f"{row.seconds:.1f} | {row.on_disk} |",
            flush=True,
        )
    sys.exit(1 if failures else 0)


if __name__ == "__main__":
    main()
