"""PacGAN's 2-D models as gaussian_mixture options: the BatchNorm generator (Linear without
bias, BatchNorm, ReLU), the maxout discriminator, the N(0, 0.02) init; BatchNorm's running
statistics are rank 0's on every rank at the end of each step."""

from __future__ import annotations

import itertools

import pytest
import torch
import yaml
from helpers import PACGAN_DISCRIMINATOR, ROOT, fork_launch, hand_refreshed, launch, pacgan_models, records, write_run
from torch import nn

from trainer.commands.cli import main
from trainer.contract.config import load_config
from trainer.contract.registry import load_task
from trainer.tasks.gaussian_mixture import Maxout, mlp
from trainer.training.batch_norm import refresh_seed


def pacgan_run(tmp_path, config=None):
    return write_run(tmp_path, {"model": pacgan_models(tmp_path), **(config or {})})


def test_the_batch_norm_generator_is_linear_without_bias_then_batch_norm_then_relu():
    model = mlp(2, 16, 2, 2, batch_norm=True)
    kinds = [type(m) for m in model]
    assert kinds == [nn.Linear, nn.BatchNorm1d, nn.ReLU, nn.Linear, nn.BatchNorm1d, nn.ReLU, nn.Linear]
    assert model[0].bias is None and model[3].bias is None and model[6].bias is not None
    assert model[1].eps == 1e-4 and model[1].momentum == 0.05


def test_a_maxout_unit_is_the_largest_of_its_pieces():
    layer = Maxout(2, 3, pieces=4)
    x = torch.randn(5, 2)
    pieces = (x @ layer.linear.weight.T + layer.linear.bias).reshape(5, 3, 4)
    assert torch.equal(layer(x), pieces.max(-1).values)
    model = mlp(4, 8, 3, 1, maxout_pieces=5)
    assert [type(m) for m in model] == [Maxout, Maxout, Maxout, nn.Linear]
    assert model[0].linear.out_features == 40 and model(torch.randn(7, 4)).shape == (7, 1)


def test_weights_drawn_with_the_init_std_and_biases_zero():
    torch.manual_seed(0)
    model = mlp(2, 400, 2, 2, batch_norm=False, init_std=0.02)
    weights = torch.cat([m.weight.detach().flatten() for m in model if isinstance(m, nn.Linear)])
    assert abs(float(weights.std()) - 0.02) < 0.001 and abs(float(weights.mean())) < 0.001
    assert all(float(m.bias.detach().abs().max()) == 0 for m in model if isinstance(m, nn.Linear))


@pytest.mark.parametrize("per_place", [True, False])
def test_packs_generated_per_place_take_each_place_from_its_own_forward(tmp_path, per_place):
    # PacGAN's code fills each of a pack's m places by its own generator forward of batch/m
    # latents: in training, BatchNorm normalises each place's samples by their own statistics
    options = {"mixture": "grid", "packing": 4, "generate_per_place": per_place}
    run = load_config(pacgan_run(tmp_path, {"task_options": options, "training": {"batch_size": 32}}))
    task = load_task(run)
    standardise = nn.BatchNorm1d(2, affine=False)  # a generator whose output is its batch standardised
    fake = task.generate(standardise, 32, torch.Generator().manual_seed(0))
    places = fake.reshape(8, 4, 2)  # as the discriminator sees them: 8 packs of 4 places
    centred = [bool(places[:, place].mean(0).abs().max() < 1e-5) for place in range(4)]
    assert centred == [per_place] * 4
    assert float(fake.mean(0).abs().max()) < 1e-5  # the whole batch is centred either way


@pytest.mark.timeout(120)
def test_one_maxout_piece_is_one_line(tmp_path, capsys):
    config = pacgan_run(tmp_path)
    bad = {**PACGAN_DISCRIMINATOR, "maxout_pieces": 1}
    (tmp_path / "pacgan_discriminator.yaml").write_text(yaml.safe_dump(bad))
    assert main(["--config", str(config), "--device", "cpu"]) == 2
    lines = [line for line in capsys.readouterr().err.splitlines() if line.startswith("error (rank")]
    assert len(lines) == 1 and "pacgan_discriminator.yaml: key 'maxout_pieces' must be 0" in lines[0], lines


@pytest.mark.timeout(300)
@pytest.mark.parametrize("refresh", [0, 3])
def test_the_ranks_running_statistics_agree_after_every_step(tmp_path, refresh):
    # Each rank's batch differs, so its own running statistics would too; the average
    # (training.ema_decay, with buffers) follows them, and so do those refreshed at each eval.
    training = {"max_steps": 5, "ema_decay": 0.5, "eval_every": 2}
    config = pacgan_run(tmp_path, {"training": training, "eval": {"batch_norm_refresh": refresh}})
    result = launch([str(config), str(tmp_path)], 2, script=ROOT / "tests" / "batch_norm_ranks.py")
    assert result.returncode == 0, result.stderr[-3000:]
    ranks = [torch.load(tmp_path / f"rank{r}.pt") for r in (0, 1)]
    assert [r["world_size"] for r in ranks] == [2, 2] and len(ranks[0]["steps"]) == 5
    names = set(ranks[0]["steps"][0])
    assert {"1.running_mean", "1.running_var", "ema.1.running_mean"} <= names, names
    for step, (zero, one) in enumerate(zip(ranks[0]["steps"], ranks[1]["steps"], strict=True)):
        for name in names:
            assert torch.equal(zero[name], one[name]), f"step {step + 1}: {name} differs between the ranks"
    assert not torch.equal(ranks[0]["steps"][0]["1.running_mean"], ranks[0]["steps"][-1]["1.running_mean"])
    if refresh:  # the last eval (step 5) refreshed the average it scores, on both ranks
        task = load_task(load_config(config))
        average = task.build_generator()
        average.load_state_dict(ranks[0]["average"])
        expected = hand_refreshed(average, task, refresh, 4, refresh_seed(3, 5))
        for rank, (name, value) in itertools.product(ranks, expected.items()):
            torch.testing.assert_close(rank["steps"][-1][f"ema.{name}"], value, rtol=1e-5, atol=1e-6, msg=name)


@pytest.mark.timeout(300)
@pytest.mark.parametrize(
    ("mixture", "options"),
    [("grid", []), ("ring", []), ("grid", ["task_options.generate_per_place=true"])],
    ids=["grid", "ring", "grid-per-place"],
)
def test_the_shipped_pacgan_configs_train_in_two_processes(tmp_path, mixture, options):
    """configs/training/{grid,ring}_pacgan.yaml at a few steps: the paper's models, packing and
    optimizer, 100 packs per step (and each pack's places from their own forwards)."""
    config = ROOT / "configs" / "training" / f"{mixture}_pacgan.yaml"
    packing = yaml.safe_load(config.read_text())["task_options"]["packing"]
    tiny = ["training.max_steps=4", "training.eval_every=2", "training.save_every=2", "data.train_size=2000"]
    tiny += ["eval.batch_size=500", f"output_dir={tmp_path / 'out'}", *options]
    args = ["--config", str(config), "--device", "cpu", *[f"--set={item}" for item in tiny]]
    run = launch if (mixture, options) == ("ring", []) else fork_launch  # one row on the real launcher (harness.forked)
    result = run(args, 2)
    assert result.returncode == 0, result.stderr[-3000:]
    evals = records(tmp_path / "out", "eval")
    assert [r["step"] for r in evals] == [2, 4] and all(r["world_size"] == 2 for r in evals)
    assert yaml.safe_load((tmp_path / "out" / "config.yaml").read_text())["training"]["batch_size"] == 100 * packing
