"""``eval.batch_norm_refresh``: before each eval, the generator's BatchNorm statistics are
recomputed at its current weights from freshly generated batches (PacGAN's code refreshes
them after every epoch, before its metrics), on every rank alike."""

from __future__ import annotations

import pytest
import torch
from helpers import hand_refreshed, pacgan_models, records, write_run
from safetensors.torch import load_file
from torch import nn

from trainer.commands.cli import main
from trainer.contract.config import load_config
from trainer.contract.registry import load_task
from trainer.tasks.gaussian_mixture import mlp
from trainer.training.batch_norm import refresh_seed, refresh_statistics


def grid_task(tmp_path, extra=None):
    options = {"mixture": "grid", "packing": 2, "generate_per_place": True, "plot": False}
    config = {"model": pacgan_models(tmp_path), "task_options": options, "training": {"batch_size": 8}}
    return write_run(tmp_path, {**config, **(extra or {})})


def test_the_statistics_are_the_plain_average_over_the_generated_batches(tmp_path):
    task = load_task(load_config(grid_task(tmp_path)))
    torch.manual_seed(0)
    # a dropout layer draws from the global generator: the refresh must leave it as it was
    model = nn.Sequential(*mlp(2, 16, 2, 2, batch_norm=True, init_std=0.02), nn.Dropout(0.5)).eval()
    for _ in range(3):  # running statistics far from the refreshed ones
        model.train()(torch.randn(8, 2) * 5 + 3)
    model.eval()
    counts = [int(m.num_batches_tracked) for m in model if isinstance(m, nn.BatchNorm1d)]
    expected = hand_refreshed(model, task, batches=3, batch_size=8, seed=11)
    assert len(expected) == 4  # two layers, each with its mean and variance
    global_state = torch.get_rng_state()

    refresh_statistics(task, model, batches=3, batch_size=8, rng=torch.Generator().manual_seed(11))

    state = model.state_dict()
    for name, value in expected.items():
        torch.testing.assert_close(state[name], value, rtol=1e-5, atol=1e-6, msg=name)
    layers = [m for m in model if isinstance(m, nn.BatchNorm1d)]
    assert [layer.momentum for layer in layers] == [0.05, 0.05]
    assert [int(layer.num_batches_tracked) for layer in layers] == counts  # training's count
    assert not model.training
    assert torch.equal(torch.get_rng_state(), global_state)


@pytest.mark.timeout(120)
def test_each_eval_and_the_export_use_the_statistics_refreshed_at_their_step(tmp_path):
    refresh = {"eval": {"batch_size": 10, "batch_norm_refresh": 3}, "data": {"eval_size": 10}}
    config = grid_task(tmp_path, {**refresh, "training": {"batch_size": 8, "max_steps": 4}})
    assert main(["--config", str(config), "--device", "cpu"]) == 0
    run = load_config(config)
    task = load_task(run)
    exported = load_file(tmp_path / "out" / "final" / "generator" / "model.safetensors")
    generator = task.build_generator()
    generator.load_state_dict(exported)
    expected = hand_refreshed(generator, task, batches=3, batch_size=8, seed=refresh_seed(3, 4))
    for name, value in expected.items():
        torch.testing.assert_close(exported[name], value, rtol=1e-5, atol=1e-6, msg=name)
    # the last eval scored exactly that generator
    eval_set = task.eval_dataset()
    with torch.no_grad():
        outputs = task.eval_outputs(generator.eval(), None, eval_set[list(range(len(eval_set)))])
    last = records(tmp_path / "out", "eval")[-1]
    assert last["step"] == 4
    for name, value in task.eval_metrics(outputs).items():
        assert last[name] == pytest.approx(value), name


@pytest.mark.timeout(120)
@pytest.mark.parametrize(
    ("setting", "generator", "message"),
    [
        (-1, "pacgan", "key 'eval.batch_norm_refresh' must be 0 or more"),
        (2, "plain", "key 'eval.batch_norm_refresh' is 2, but the generator has no BatchNorm layer"),
    ],
)
def test_a_refresh_that_cannot_run_is_one_line(tmp_path, capsys, setting, generator, message):
    extra = {"eval": {"batch_norm_refresh": setting}}
    config = grid_task(tmp_path, extra) if generator == "pacgan" else write_run(tmp_path, extra)
    assert main(["--config", str(config), "--device", "cpu"]) == 2
    lines = [line for line in capsys.readouterr().err.splitlines() if line.startswith("error (rank")]
    assert len(lines) == 1 and message in lines[0], lines


@pytest.mark.timeout(120)
def test_training_is_the_same_with_and_without_the_refresh(tmp_path):
    # Training forwards normalise by their own batch and the refresh leaves every random
    # generator as it was: only the statistics the evals use differ.
    finals = {}
    for refresh in (0, 3):
        extra = {"eval": {"batch_norm_refresh": refresh}, "training": {"batch_size": 8, "max_steps": 6}}
        config = grid_task(tmp_path / str(refresh), extra)
        assert main(["--config", str(config), "--device", "cpu"]) == 0
        finals[refresh] = load_file(tmp_path / str(refresh) / "out" / "final" / "generator" / "model.safetensors")
        train = [
            {k: v for k, v in r.items() if "per_s" not in k and k != "peak_memory_mb"}
            for r in records(tmp_path / str(refresh) / "out", "train")
        ]
        finals[f"train {refresh}"] = train
    assert finals["train 0"] == finals["train 3"]
    statistics = {name for name in finals[0] if "running" in name}
    assert statistics and all(not torch.equal(finals[0][n], finals[3][n]) for n in statistics)
    for name in finals[0].keys() - statistics:
        assert torch.equal(finals[0][name], finals[3][name]), name
