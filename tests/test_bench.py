"""The loop benchmark runs end to end (a few steps) in 1 and 2 processes and prints its table."""

from __future__ import annotations

import re
import subprocess
import sys

import pytest
from helpers import ROOT


@pytest.mark.timeout(400)
def test_bench_loop_prints_a_row_per_process_count():
    done = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "bench_loop.py"), "--rounds=3", "--block=2", "--alone-steps=4"],
        capture_output=True,
        text=True,
        timeout=380,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    rows = re.findall(r"^\| (\d) \| ([\d.]+) \| ([\d.]+) \| ([\d.]+) \| (\d+) \| (\d+) \|$", done.stdout, re.M)
    assert [row[0] for row in rows] == ["1", "2"], done.stdout
    for _, plain, trainer, ratio, plain_mb, trainer_mb in rows:
        assert float(plain) > 0 and float(trainer) > 0 and float(ratio) > 0
        assert int(plain_mb) > 0 and int(trainer_mb) > 0
