"""In a stage pipeline, what a later run is built from (which weights of the earlier run, the
checks of its config) is rank 0's on every rank, and a failure there stops every rank before
the run starts: two processes through accelerate's debug_launcher, with the trainer replaced
by a stand-in that records what each rank was asked to run."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from accelerate import debug_launcher
from helpers import write_run

from trainer.commands import stages
from trainer.contract.errors import UserError

#: where each rank records its runs (set in the launched function)
RESULTS: list[Path] = []


def rank() -> int:
    return torch.distributed.get_rank()


class RecordingTrainer:
    """Writes best/ and final/ as a run would, and records the run's init paths per rank."""

    def __init__(self, run, device, resume, overwrite) -> None:
        self.run, self.stopped = run, None

    def fit(self) -> dict:
        out = Path(self.run.config.output_dir)
        for name in ("best", "final"):
            for role in ("generator", "discriminator"):
                (out / name / role).mkdir(parents=True, exist_ok=True)
        record = {"output_dir": str(out), "init_generator": self.run.config.init.generator}
        with open(RESULTS[0] / f"runs-rank{rank()}.jsonl", "a") as file:
            file.write(json.dumps(record) + "\n")
        return {}


def rank1_weights(kind: str):
    """``stages._weights`` as rank 1 would see it: final/ for best/ (a stale view), or a path
    that does not exist."""
    real = stages._weights

    def weights(run_dir: Path, role: str) -> Path:
        if rank() != 1:
            return real(run_dir, role)
        return run_dir / "final" / role if kind == "final" else run_dir / "gone" / role

    return weights


def run_stage1(config: str, kind: str, result_dir: str) -> None:
    stages.Trainer = RecordingTrainer
    RESULTS.append(Path(result_dir))
    stages._weights = rank1_weights(kind)
    # debug_launcher forms the process group, as an earlier run of the pipeline would have
    outcome = "ok"
    try:
        stages.fit_stage1(config, device="cpu")
    except UserError as exc:
        outcome = f"{type(exc).__name__} agreed={exc.agreed}: {exc}"
    Path(result_dir, f"outcome-rank{rank()}.txt").write_text(outcome)


def runs(tmp_path: Path, rank: int) -> list[dict]:
    path = tmp_path / f"runs-rank{rank}.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.is_file() else []


@pytest.mark.timeout(120)
def test_a_later_run_takes_rank_0s_choice_of_weights(tmp_path):
    config = write_run(tmp_path, {})
    debug_launcher(run_stage1, (str(config), "final", str(tmp_path)), num_processes=2)
    assert [(tmp_path / f"outcome-rank{rank}.txt").read_text() for rank in (0, 1)] == ["ok", "ok"]
    best = str(tmp_path / "out" / "generator_mle" / "best" / "generator")
    for rank in (0, 1):
        assert [run["init_generator"] for run in runs(tmp_path, rank)] == ["", best], rank


@pytest.mark.timeout(120)
def test_a_later_run_that_fails_its_checks_on_one_rank_starts_on_no_rank(tmp_path):
    config = write_run(tmp_path, {})
    debug_launcher(run_stage1, (str(config), "gone", str(tmp_path)), num_processes=2)
    outcomes = [(tmp_path / f"outcome-rank{rank}.txt").read_text() for rank in (0, 1)]
    assert outcomes[1].startswith("ConfigError agreed=True: ") and "gone/generator" in outcomes[1], outcomes
    assert outcomes[0].startswith("UserError agreed=True: preparing the stage 1 discriminator run failed on rank(s) 1")
    assert "gone/generator" in outcomes[0]
    for rank in (0, 1):
        assert len(runs(tmp_path, rank)) == 1, rank  # only the generator's run started
