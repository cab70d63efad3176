"""The oracle recipe's training sequences beyond its sampled set (task_options.train_sequences):
drawn from the oracle, the same for every objective, a row of its own for every rank and step of
an endless stream, and resumed exactly."""

from __future__ import annotations

import shutil
import subprocess
import sys
from types import SimpleNamespace

import pytest
import torch
import yaml
from helpers import ROOT, check, fork_launch, launch, records
from safetensors.torch import load_file
from test_oracle_text import LENGTH, VOCAB, write_oracle_run

from trainer.contract.config import TrainingSection, load_config
from trainer.contract.registry import load_task
from trainer.contract.task import EndlessRows
from trainer.tasks.oracle import OracleLSTM
from trainer.training.sample_order import BatchStream

TRAIN_SIZE = 128  # write_oracle_run's data.train_size


def task_for(tmp_path, objective: str = "adversarial", **options):
    config = write_oracle_run(tmp_path, {"task_options": options, "training": {"objective": objective}})
    return load_task(load_config(config))


def test_sample_with_draws_the_tokens_sample_draws_from_the_same_uniforms():
    oracle = OracleLSTM.seeded(0, VOCAB, 8, 8)
    drawn = oracle.sample(6, LENGTH, torch.Generator().manual_seed(4))
    rng = torch.Generator().manual_seed(4)
    uniforms = torch.stack([torch.rand(6, generator=rng) for _ in range(LENGTH)], dim=1)  # sample's order
    assert torch.equal(oracle.sample_with(uniforms), drawn)


def test_rows_past_the_sampled_set_are_drawn_once_and_the_same_for_every_objective(tmp_path):
    task = task_for(tmp_path, train_sequences=300)
    rows = task.train_dataset()[:]["input_ids"]
    assert rows.shape == (300, LENGTH) and int(rows.max()) < VOCAB  # never the start token
    assert torch.equal(rows[:TRAIN_SIZE], task._sequences("train"))  # the sampled set first
    later = rows[TRAIN_SIZE:]
    assert len({tuple(row) for row in later.tolist()}) > 0.9 * len(later)  # drawn, not copies
    assert len(list((tmp_path / "cache").glob("*-rows300"))) == 1  # cached: later runs read them
    fewer = task_for(tmp_path, train_sequences=100).train_dataset()[:]["input_ids"]
    assert torch.equal(fewer, rows[:100]) and not list((tmp_path / "cache").glob("*-rows100"))  # the set's own
    # what the maximum-likelihood baseline trains on (stage 2's config with objective mle)
    baseline = task_for(tmp_path, "mle", train_sequences=300)
    assert torch.equal(baseline.train_dataset()[:]["input_ids"], rows)
    # the oracle scores them as its own samples (the sampled set's NLL, within noise)
    nll = [float(-task.oracle.token_log_probs(part).mean()) for part in (rows[:TRAIN_SIZE], later)]
    assert abs(nll[0] - nll[1]) < 0.25, nll


def stream_rows(dataset: EndlessRows, world: int, batches: int, start: int = 0) -> dict[int, list[torch.Tensor]]:
    """Each rank's micro-batches of ``dataset`` as the run's stream fetches them at ``world``
    processes (from global micro-batch ``start``), by rank."""
    taken = {}
    for rank in range(world):
        accelerator = SimpleNamespace(process_index=rank, num_processes=world, device=torch.device("cpu"))
        stream = BatchStream(accelerator, dataset, TrainingSection(batch_size=4), lambda items: items)
        stream.load_state_dict({"micro_batches": start})
        taken[rank] = [stream.next()["input_ids"] for _ in range(batches)]
    return taken


def test_an_endless_stream_gives_every_rank_and_step_sequences_of_its_own_at_any_world(tmp_path):
    dataset = task_for(tmp_path, train_sequences=-1).train_dataset()
    assert isinstance(dataset, EndlessRows)
    alone = stream_rows(dataset, 1, 80)[0]  # 80 micro-batches of 4: past the sampled set's 128
    rows = torch.cat(alone)
    assert torch.equal(rows[:TRAIN_SIZE], task_for(tmp_path).train_dataset()[:]["input_ids"])
    assert len({tuple(row) for row in rows[TRAIN_SIZE:].tolist()}) > 0.9 * (len(rows) - TRAIN_SIZE)
    # at 2 processes, rank r takes global micro-batches r, r + 2, ...: the same batches as alone
    pair = stream_rows(dataset, 2, 40)
    assert all(torch.equal(pair[r][k], alone[2 * k + r]) for r in (0, 1) for k in range(40))
    # a resumed stream (at micro-batch 60) goes on with the rows the uninterrupted one takes
    resumed = stream_rows(dataset, 2, 10, start=60)
    assert all(torch.equal(resumed[r][k], alone[60 + 2 * k + r]) for r in (0, 1) for k in range(10))


@pytest.mark.timeout(300)
def test_a_run_on_an_endless_stream_resumes_bit_for_bit_in_two_processes(tmp_path):
    config = write_oracle_run(
        tmp_path, {"task_options": {"train_sequences": -1}, "training": {"max_steps": 4, "save_every": 2}}
    )
    out = tmp_path / "out"
    check(launch(["--config", str(config), "--device", "cpu"], 2))
    assert {r["world_size"] for r in records(out, "train")} == {2}
    first = {role: load_file(out / "final" / role / "model.safetensors") for role in ("generator", "discriminator")}
    shutil.rmtree(out / "final")
    (out / "metrics.jsonl").unlink()
    resume = ["--resume", str(out / "checkpoints" / "step-0000002")]
    check(fork_launch(["--config", str(config), "--device", "cpu", *resume], 2))  # harness.forked
    for role, tensors in first.items():
        again = load_file(out / "final" / role / "model.safetensors")
        assert all(torch.equal(again[key], tensors[key]) for key in tensors), f"the {role} differs after the resume"


@pytest.mark.timeout(300)
def test_the_data_limit_experiment_trains_each_setting_against_its_own_frontier(tmp_path):
    """research/data_limit.py at a tiny size: one stage 1, then per setting the baseline and each
    objective's seed on that many rows, a table row each and a plot; a second call reads the
    finished runs and resumes an interrupted one."""
    tiny = ["data.train_size=256", "data.eval_size=40", "training.max_steps=2", "training.eval_every=2"]
    tiny += ["stage1.generator.training.max_steps=2", "stage1.discriminator.training.max_steps=2"]
    tiny += [f"data.cache_dir={tmp_path / 'cache'}"]
    command = [sys.executable, str(ROOT / "research" / "data_limit.py"), "--device", "cpu", "--rows", "300", "-1"]
    command += ["--objectives", "reinforce", "ddo", "--seeds", "0", "--frontier", "1", "0.8"]
    command += ["--output-dir", str(tmp_path / "out"), *[f"--set={item}" for item in tiny]]
    done = subprocess.run(command, capture_output=True, text=True, timeout=280, cwd=ROOT)
    assert done.returncode == 0, done.stderr[-3000:]
    rows = [line for line in done.stdout.splitlines() if line.startswith("| 300 |") or line.startswith("| endless |")]
    assert len(rows) == 4 and all(" of 1 | " in line for line in rows), done.stdout[-2000:]
    assert [line.split(" | ")[1] for line in rows] == ["reinforce", "ddo", "reinforce", "ddo"]
    for name, wanted in (("rows-300", 300), ("rows-endless", -1)):
        for run in ("stage2-mle", "reinforce/seed-0", "ddo/seed-0"):
            config = yaml.safe_load((tmp_path / "out" / name / run / "config.yaml").read_text())
            assert config["task_options"]["train_sequences"] == wanted, (name, run)
        assert (tmp_path / "out" / name / "frontier.png").is_file()
    # run again after one run was interrupted after its last checkpoint (its final/ not written):
    # that run resumes from the checkpoint, the finished ones are read
    interrupted = tmp_path / "out" / "rows-300" / "reinforce" / "seed-0"
    shutil.rmtree(interrupted / "final")
    again = subprocess.run(command, capture_output=True, text=True, timeout=280, cwd=ROOT)
    assert again.returncode == 0, again.stderr[-3000:]
    resumed = [line for line in again.stderr.splitlines() if "resumed from" in line]
    assert len(resumed) == 1 and str(interrupted) in resumed[0], resumed
    assert (interrupted / "final").is_dir()
    assert [line for line in again.stdout.splitlines() if line.startswith(("| 300 |", "| endless |"))] == rows
