"""The fault matrix: each fault against the real launcher at 1, 2 and 4 CPU processes.

Each scenario starts tiny training runs (the task of :mod:`harness.faultmatrix.inject` injects
the faults), applies the fault, and checks the outcome against its bound: every process gone,
the exit status, the seconds to the outcome, and what was left on disk. Nothing may hang:
every run has a hard timeout. ``scripts/fault_matrix.py`` prints the table;
tests/test_faults.py runs every scenario at 2 processes.
"""

from __future__ import annotations

import tempfile
from collections.abc import Callable
from pathlib import Path

from harness.faultmatrix import input_faults, node_faults, rank_faults, storage_faults
from harness.faultmatrix.runs import Outcome, launched_with

SCENARIOS: dict[str, Callable[[Path, int], Outcome]] = {
    "kill_one_rank": rank_faults.kill_one_rank,
    "freeze_one_rank": rank_faults.freeze_one_rank,
    "nan_on_one_rank": rank_faults.nan_on_one_rank,
    "init_missing": input_faults.bad_init("missing"),
    "init_truncated": input_faults.bad_init("truncated"),
    "init_pickle_with_code": input_faults.bad_init("pickle_with_code"),
    "kill_during_checkpoint": input_faults.kill_during_checkpoint,
    **{f"checkpoint_{kind}": input_faults.damaged_checkpoint(kind) for kind in input_faults.DAMAGE},
    "disk_full_at_first_checkpoint": storage_faults.full_at_first_checkpoint,
    "disk_too_full_for_next_checkpoint": storage_faults.too_full_for_the_next,
    "output_read_only": storage_faults.read_only,
    "output_removed": storage_faults.removed_while_training,
    "terminate_one_rank": rank_faults.terminate_one_rank,
    "terminate_while_peer_frozen": rank_faults.terminate_while_peer_frozen,
    "eval_smaller_than_world": input_faults.eval_size(1, "eval set of 1 sample"),
    "uneven_shards": input_faults.eval_size(7, "eval set of 7 (uneven shards)"),
    "empty_eval": input_faults.eval_size(0, "empty eval set"),
    "one_rank_collective": rank_faults.one_rank_collective,
    "fresh_start_into_old_run": input_faults.fresh_start_into_old_run,
    "resume_other_shape": input_faults.resume_other_shape,
    "error_on_main_process": rank_faults.error_on_main_process,
    "slow_main_write": rank_faults.slow_main_write,
    "output_not_shared": input_faults.output_not_shared,
    "restart_torchrun": rank_faults.restart_after_kill("torchrun"),
    "restart_accelerate": rank_faults.restart_after_kill("accelerate"),
    "two_nodes": node_faults.plain_run,
    "two_nodes_restart": node_faults.restart_after_lost_worker,
    "two_nodes_lose_first": node_faults.lost_node("first"),
    "two_nodes_lose_last": node_faults.lost_node("last"),
    "two_nodes_elastic_go_on": node_faults.go_on_without_a_node,
}


#: the scenarios of two simulated nodes: their ``processes`` counts the ranks of each node
NODE_SCENARIOS = tuple(name for name in SCENARIOS if name.startswith("two_nodes"))


#: the scenarios that also run with both models sharded (FSDP2, ``accelerate_configs/cpu_fsdp.yaml``)
FSDP_SCENARIOS = (
    *("kill_one_rank", "freeze_one_rank", "nan_on_one_rank", "error_on_main_process", "terminate_one_rank"),
    *("disk_full_at_first_checkpoint", "disk_too_full_for_next_checkpoint", "output_read_only", "output_removed"),
)


def run_scenario(name: str, processes: int, work: Path | None = None, accelerate_config: str = "8gpu.yaml") -> Outcome:
    """Run one scenario in a fresh directory (a temporary one unless ``work`` is given), its
    ``accelerate launch`` runs with ``accelerate_configs/ACCELERATE_CONFIG``."""
    with launched_with(accelerate_config):
        if work is not None:
            return SCENARIOS[name](work, processes)
        with tempfile.TemporaryDirectory() as tmp:
            return SCENARIOS[name](Path(tmp), processes)
