"""Every scenario of the fault matrix (trainer/faultmatrix) at 2 processes: no hang, each
outcome within its bound."""

from __future__ import annotations

import pytest

from trainer.faultmatrix import SCENARIOS, run_scenario


@pytest.mark.timeout(400)
@pytest.mark.parametrize("name", list(SCENARIOS))
def test_fault_scenario_at_two_processes(tmp_path, name):
    row = run_scenario(name, 2, tmp_path)
    assert row.processes == 2
    assert row.ok, f"{row.scenario}: {row.outcome} after {row.seconds:.1f} s; on disk: {row.on_disk}"
