"""Every scenario of scripts/fault_matrix.py at 2 processes: no hang, each outcome within its bound."""

from __future__ import annotations

import sys

import pytest
from helpers import ROOT

sys.path.insert(0, str(ROOT / "scripts"))
import fault_matrix  # noqa: E402


@pytest.mark.timeout(400)
@pytest.mark.parametrize("name", list(fault_matrix.SCENARIOS))
def test_fault_scenario_at_two_processes(tmp_path, name):
    row = fault_matrix.run_scenario(name, 2, tmp_path)
    assert row.processes == 2
    assert row.ok, f"{row.scenario}: {row.outcome} after {row.seconds:.1f} s; on disk: {row.on_disk}"
