"""The generator's moving average: its arithmetic, what the eval scores and what is exported."""

from __future__ import annotations

import pytest
import torch
from helpers import records, write_run
from safetensors.torch import load_file

from trainer.contract.config import load_config
from trainer.state.ema import GeneratorEma
from trainer.training.loop import Trainer


@pytest.mark.parametrize("warmup", [False, True])
def test_the_average_follows_its_formula(warmup):
    model = torch.nn.Linear(1, 1, bias=False)
    ema = GeneratorEma(model, decay=0.9, start=2, warmup=warmup, device=torch.device("cpu"))
    expected, updates = 0.0, 0
    for step, value in enumerate([1.0, 2.0, 3.0, 4.0, 5.0], start=1):
        model.weight.data.fill_(value)
        ema.update(model, step)
        if step <= 2:  # before the start: a copy
            expected = value
        else:
            updates += 1
            decay = min(0.9, (1 + updates) / (10 + updates)) if warmup else 0.9
            expected = decay * expected + (1 - decay) * value
        assert float(ema.model.weight) == pytest.approx(expected, rel=1e-6), step
    assert not any(p.requires_grad for p in ema.averaged.parameters())


def test_buffers_that_are_not_floating_point_follow_the_model():
    # BatchNorm's step counter (int64) and a boolean mask (GPT-2's causal mask in transformers
    # 4.x): not averaged, copied; only floating-point state moves by 1 - decay
    model = torch.nn.Sequential(torch.nn.Linear(2, 2), torch.nn.BatchNorm1d(2))
    model.register_buffer("mask", torch.zeros(2, dtype=torch.bool))
    ema = GeneratorEma(model, decay=0.9, start=0, warmup=False, device=torch.device("cpu"))
    before = ema.model[1].running_mean.clone()
    model(torch.randn(8, 2))  # moves running_mean and counts one batch
    model.mask.fill_(True)
    ema.update(model, 1)
    assert int(ema.model[1].num_batches_tracked) == 1 and bool(ema.model.mask.all())
    expected = 0.9 * before + 0.1 * model[1].running_mean
    assert torch.allclose(ema.model[1].running_mean, expected)


@pytest.mark.timeout(120)
def test_the_eval_scores_the_average_and_both_generators_are_exported(tmp_path):
    training = {"ema_decay": 0.5, "max_steps": 4, "eval_every": 2, "best_metric": "reverse_kl"}
    config = write_run(tmp_path, {"task": "fixture_tasks:ScoredWeights", "training": training})
    Trainer(load_config(config), device="cpu").fit()
    evals = records(tmp_path / "out", "eval")
    assert all(r["generator"] == "ema" for r in evals)
    final = {
        name: load_file(tmp_path / "out" / "final" / name / "model.safetensors")
        for name in ("generator", "generator_raw")
    }
    assert final["generator"].keys() == final["generator_raw"].keys()
    sums = {name: float(sum(w.double().sum() for w in weights.values())) for name, weights in final.items()}
    assert evals[-1]["weight_sum"] == pytest.approx(sums["generator"], rel=1e-9)  # the average was scored
    assert abs(sums["generator"] - sums["generator_raw"]) > 1e-6
    assert (tmp_path / "out" / "best" / "generator_raw" / "model.safetensors").is_file()
    # evaluating final/ scores its generator/: the average, as the run's last eval did
    scored = Trainer(load_config(config), device="cpu").evaluate(tmp_path / "out" / "final")
    assert scored["weight_sum"] == pytest.approx(sums["generator"], rel=1e-9)


@pytest.mark.timeout(180)
def test_a_tied_transformers_generator_averages_saves_and_resumes_exactly(tmp_path):
    # GPT-2 ties its output embedding to its input embedding: the average keeps the tie, and
    # its checkpoint file stores the tied tensor once
    from test_oracle_text import write_oracle_run

    from trainer.commands.cli import main

    config = write_oracle_run(tmp_path, {"training": {"ema_decay": 0.7, "ema_warmup": True}})
    args = ["--config", str(config), "--device", "cpu"]
    assert main(args) == 0
    whole = load_file(tmp_path / "out" / "final" / "generator" / "model.safetensors")
    assert main([*args, "--resume", str(tmp_path / "out" / "checkpoints" / "step-0000002")]) == 0
    resumed = load_file(tmp_path / "out" / "final" / "generator" / "model.safetensors")
    assert resumed.keys() == whole.keys() and all(torch.equal(resumed[k], whole[k]) for k in whole)
    average = Trainer(load_config(config), device="cpu", resume="latest").start(training=False)
    with average:
        unwrapped = average.ema.model
        assert unwrapped.lm_head.weight is unwrapped.transformer.wte.weight


@pytest.mark.timeout(120)
def test_the_run_averages_after_every_generator_step(tmp_path):
    # the average of the run's own generator weights, step by step, by hand
    training = {"ema_decay": 0.6, "max_steps": 3, "eval_every": 3, "d_steps_per_g_step": 2}
    with Trainer(load_config(write_run(tmp_path, {"training": training})), device="cpu").start() as trainer:
        expected = {k: v.clone().double() for k, v in trainer.g.unwrapped.state_dict().items()}
        for _ in range(3):
            trainer.train_step()
            for key, value in trainer.g.unwrapped.state_dict().items():
                expected[key] = 0.6 * expected[key] + 0.4 * value.double()
        for key, value in trainer.ema.model.state_dict().items():
            assert torch.allclose(value.double(), expected[key], rtol=1e-5, atol=1e-7), key
