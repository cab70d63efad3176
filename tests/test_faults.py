"""Every scenario of the fault matrix (harness/faultmatrix) at 2 processes (two simulated nodes
of 1 process each for the node scenarios): no hang, each outcome within its bound."""

from __future__ import annotations

import pytest

from harness.faultmatrix import FSDP_SCENARIOS, NODE_SCENARIOS, SCENARIOS, run_scenario
from harness.faultmatrix.storage_faults import SKIPPED


@pytest.mark.timeout(400)
@pytest.mark.parametrize("name", list(SCENARIOS))
def test_fault_scenario_at_two_processes(tmp_path, name):
    per_run = 1 if name in NODE_SCENARIOS else 2
    row = run_scenario(name, per_run, tmp_path)
    if row.outcome.startswith(SKIPPED):  # a row that needs what this machine lacks (root for a tmpfs)
        pytest.skip(row.outcome)
    assert row.processes == per_run
    assert row.ok, f"{row.scenario}: {row.outcome} after {row.seconds:.1f} s; on disk: {row.on_disk}"


@pytest.mark.timeout(400)
@pytest.mark.parametrize("name", FSDP_SCENARIOS)
def test_fault_scenario_with_both_models_sharded(tmp_path, name):
    row = run_scenario(name, 2, tmp_path, accelerate_config="cpu_fsdp.yaml")
    assert row.ok, f"{row.scenario} under FSDP2: {row.outcome} after {row.seconds:.1f} s; on disk: {row.on_disk}"
