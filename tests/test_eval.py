"""Eval counts every sample exactly once across 2 processes, whatever the eval-set size."""

from __future__ import annotations

import pytest
from helpers import check, fork_launch, launch, records, write_run


@pytest.mark.timeout(300)
@pytest.mark.parametrize("eval_size", [7, 1, 16])
def test_eval_counts_each_sample_once(tmp_path, eval_size):
    # 2 processes x eval batch 4: 7 leaves a ragged last batch, 1 is smaller than the world,
    # 16 is a multiple of world x batch.
    config = write_run(
        tmp_path,
        {
            "task": "fixture_tasks:IndexedEval",
            "training": {"max_steps": 2, "eval_every": 1, "save_every": 100},
            "data": {"eval_size": eval_size},
        },
    )
    run = launch if eval_size == 7 else fork_launch  # one row on the real launcher (harness.forked)
    check(run(["--config", str(config), "--device", "cpu"], 2))
    evals = records(tmp_path / "out", "eval")
    assert [r["step"] for r in evals] == [1, 2]
    for record in evals:
        assert record["world_size"] == 2
        assert record["num_samples"] == eval_size
        assert record["distinct"] == eval_size
        assert record["index_sum"] == eval_size * (eval_size - 1) // 2
        assert record["rows_match"]
    # Rows from rank 0 are 3 long, rows from rank 1 are 4 long and were padded to match.
    assert evals[0]["row_lengths"] == ([3] if eval_size == 1 else [3, 4])


@pytest.mark.timeout(120)
def test_a_long_eval_shows_a_bar_counting_its_batches(tmp_path, monkeypatch):
    from trainer.contract.config import load_config
    from trainer.training import evaluation
    from trainer.training.loop import Trainer

    class RecordingBar:
        def __init__(self, **kwargs):
            self.kwargs, self.updates, self.closed = kwargs, 0, False
            bars.append(self)

        def update(self, count=1):
            self.updates += count

        def close(self):
            self.closed = True

    bars: list[RecordingBar] = []
    monkeypatch.setattr(evaluation, "tqdm", RecordingBar)
    config = write_run(tmp_path, {"training": {"max_steps": 2, "eval_every": 2}, "data": {"eval_size": 10}})
    Trainer(load_config(config), device="cpu").fit()
    (bar,) = bars  # one eval, on the main process (the only one here)
    assert bar.kwargs["desc"] == "eval" and bar.kwargs["delay"] == evaluation.EVAL_BAR_DELAY_S > 0
    assert bar.kwargs["disable"] is None  # the main process: shown on a terminal or in a notebook
    assert bar.kwargs["total"] == bar.updates == 3 and bar.closed  # 10 samples in batches of 4
