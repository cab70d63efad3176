"""Bad input ends the run with one line naming the file and the key, and exit status 2."""

from __future__ import annotations

import functools
import json
import re
import subprocess
import sys

import pytest
import yaml
from helpers import ROOT, SCRIPT, check, env, launch, records, write_run

from trainer.commands import cli
from trainer.contract.config import load_config
from trainer.contract.errors import ConfigError
from trainer.contract.registry import load_task
from trainer.state.integrity import write_digests


def run_cli(capsys, args):
    code = cli.main(args)
    err = [line for line in capsys.readouterr().err.splitlines() if line.startswith("error")]
    return code, err


def edit(path, change):
    data = yaml.safe_load(path.read_text())
    change(data)
    path.write_text(yaml.safe_dump(data))


CASES = {
    "unknown key": (
        lambda d: d["training"].update(batch_sise=4),
        ["train.yaml", "unknown key 'training.batch_sise'", "did you mean 'training.batch_size'"],
    ),
    "wrong type": (
        lambda d: d["training"].update(batch_size="four"),
        ["train.yaml", "'training.batch_size' must be an integer", "'four'"],
    ),
    "batch size 0": (lambda d: d["training"].update(batch_size=0), ["'training.batch_size' must be at least 1"]),
    "simultaneous updates with two D steps": (
        lambda d: d["training"].update(updates="simultaneous", d_steps_per_g_step=2),
        ["train.yaml", "key 'training.updates' is simultaneous", "training.d_steps_per_g_step: 1"],
    ),
    "eval_every 0": (lambda d: d["training"].update(eval_every=0), ["'training.eval_every' must be at least 1"]),
    "bad literal": (
        lambda d: d["training"].update(loss="hinj"),
        ["'training.loss' must be", "did you mean 'hinge'"],
    ),
    "missing model config": (
        lambda d: d["model"].update(generator_config="nowhere/g.yaml"),
        ["nowhere/g.yaml: generator model config file not found"],
    ),
    "missing init file": (
        lambda d: d.update(init={"discriminator": "nowhere/d.safetensors"}),
        ["key 'init.discriminator'", "nowhere/d.safetensors", "does not exist"],
    ),
    "unknown task": (
        lambda d: d.update(task="gausian_mixture"),
        ["key 'task'", "did you mean 'gaussian_mixture'"],
    ),
    "task not importable": (lambda d: d.update(task="no_such_module:Task"), ["key 'task'", "no_such_module"]),
    "unknown task option": (
        lambda d: d["task_options"].update(pakcing=2),
        ["unknown key 'task_options.pakcing'", "did you mean 'task_options.packing'"],
    ),
    "packing does not divide batch": (
        lambda d: d["task_options"].update(packing=3),
        ["'task_options.packing' (3)", "training.batch_size (4)"],
    ),
    "bad scheduler": (
        lambda d: d["optim"]["generator"].update(scheduler="cosin"),
        ["'optim.generator.scheduler'", "did you mean 'cosine'"],
    ),
}


@pytest.mark.parametrize("case", CASES)
def test_bad_training_config(tmp_path, capsys, case):
    change, expected = CASES[case]
    config = write_run(tmp_path, {})
    edit(config, change)
    code, err = run_cli(capsys, ["--config", str(config), "--device", "cpu"])
    assert code == 2
    assert len(err) == 1, err
    for text in expected:
        assert text in err[0]
    assert not (tmp_path / "out").exists(), "nothing is written before the config is valid"


def test_bad_model_config_names_its_file(tmp_path, capsys):
    config = write_run(tmp_path, {})
    edit(tmp_path / "generator.yaml", lambda d: d.update(hidden_dimm=8))
    code, err = run_cli(capsys, ["--config", str(config)])
    assert code == 2 and len(err) == 1
    assert "generator.yaml: unknown key 'hidden_dimm'; did you mean 'hidden_dim'" in err[0]


@pytest.mark.parametrize(
    "override, expected",
    [
        ("training.nope=1", "--set training.nope: unknown key 'training.nope'"),
        ("trainig.seed=1", "did you mean 'training'"),
        ("training.seed=abc", "'training.seed' must be an integer"),
        ("training.seed.x=1", "'training.seed' has no sub-keys"),
        ("novalue", "expected dotted.key=value"),
    ],
)
def test_bad_override(tmp_path, capsys, override, expected):
    config = write_run(tmp_path, {})
    code, err = run_cli(capsys, ["--config", str(config), "--set", override])
    assert code == 2 and len(err) == 1 and expected in err[0], err


def test_invalid_yaml(tmp_path, capsys):
    config = write_run(tmp_path, {})
    config.write_text("training:\n  batch_size: [1,\n")
    code, err = run_cli(capsys, ["--config", str(config)])
    assert code == 2 and len(err) == 1 and "train.yaml: not valid YAML" in err[0]


def test_overrides_are_typed(tmp_path):
    from trainer.contract.config import load_config

    config = write_run(tmp_path, {})
    run = load_config(
        config,
        [
            "training.max_steps=7",
            "optim.generator.betas=[0.0, 0.9]",
            "training.mixed_precision=no",
            "optim.generator.lr=1e-4",  # YAML 1.1 leaves this a string; a number field takes it
        ],
    )
    assert run.config.optim.generator.lr == 1e-4
    assert run.config.training.max_steps == 7
    assert run.config.optim.generator.betas == [0.0, 0.9]
    assert run.config.training.mixed_precision == "no"


@pytest.mark.timeout(120)
def test_config_error_in_a_subprocess_has_no_traceback(tmp_path):
    config = write_run(tmp_path, {})
    edit(config, lambda d: d["training"].update(batch_size=0))
    result = subprocess.run(
        [sys.executable, str(SCRIPT), "--config", str(config)],
        capture_output=True,
        text=True,
        timeout=100,
        env=env(),
        cwd=ROOT,
    )
    assert result.returncode == 2
    assert "Traceback" not in result.stderr
    assert result.stderr.strip().splitlines()[-1].startswith("error (rank 0):")


def write_points(path, rows):
    path.write_text("".join(f'{{"x": {x}, "y": {y}}}\n' for x, y in rows))


@pytest.mark.timeout(300)
def test_bad_data_row_fails_every_rank(tmp_path):
    rows = [(1.0, 0.0)] * 20
    rows[12] = (1.0, '"north"')
    write_points(tmp_path / "points.jsonl", rows)
    config = write_run(tmp_path, {"data": {"path": str(tmp_path / "points.jsonl")}})
    result = launch(["--config", str(config), "--device", "cpu"], 2, timeout=200)
    assert result.returncode != 0
    lines = {rank: [x for x in result.stderr.splitlines() if x.startswith(f"error (rank {rank})")] for rank in (0, 1)}
    assert all(len(found) == 1 for found in lines.values()), result.stderr[-4000:]
    # The main process reads first (it may write a cache the others read); the others stop
    # with it, naming the rank whose line says why.
    assert "points.jsonl: row 13: column 'y' is 'north', not a finite number" in lines[0][0]
    assert "reading the models and data (main process) failed on rank(s) 0" in lines[1][0]


@pytest.mark.timeout(120)
@pytest.mark.parametrize("suffix", ["jsonl", "csv"])
def test_points_from_a_local_file(tmp_path, suffix):
    path = tmp_path / f"points.{suffix}"
    rows = [(1.0, 0.0), (0.0, 1.0), (-1.0, 0.0), (0.0, -1.0)] * 4
    if suffix == "csv":
        path.write_text("x,y\n" + "".join(f"{x},{y}\n" for x, y in rows))
    else:
        write_points(path, rows)
    config = write_run(tmp_path, {"data": {"path": str(path)}, "training": {"max_steps": 2}})
    # the training set is the file's rows, in order (the eval set is generated from the seed)
    points = load_task(load_config(config)).train_dataset().columns["points"]
    assert points.tolist() == [list(row) for row in rows]
    check(launch(["--config", str(config), "--device", "cpu"], 1))
    assert records(tmp_path / "out", "eval")[-1]["num_samples"] == 10


@pytest.mark.timeout(120)
def test_unreadable_init_weights(tmp_path, capsys):
    (tmp_path / "g.safetensors").write_bytes(b"not a safetensors file")
    config = write_run(tmp_path, {"init": {"generator": str(tmp_path / "g.safetensors")}})
    code, err = run_cli(capsys, ["--config", str(config), "--device", "cpu"])
    assert code == 2 and len(err) == 1
    assert "g.safetensors: cannot read generator weights" in err[0]


def test_bad_stage1_override_names_its_key(tmp_path, capsys):
    config = write_run(tmp_path, {"stage1": {"generator": {"training.max_step": 5}}})
    code, err = run_cli(capsys, ["--config", str(config)])
    assert code == 2 and len(err) == 1
    assert "key 'stage1.generator.training.max_step'" in err[0] and "did you mean 'training.max_steps'" in err[0]


@pytest.mark.timeout(120)
@pytest.mark.parametrize(
    ("lose", "named"), [(("data",), "has no data"), (("generator", "skipped"), "has no generator.skipped")]
)
def test_a_checkpoint_record_without_a_part_names_it(tmp_path, capsys, lose, named):
    config = write_run(tmp_path, {"training": {"max_steps": 2, "save_every": 2}})
    assert run_cli(capsys, ["--config", str(config), "--device", "cpu"])[0] == 0
    state = tmp_path / "out" / "checkpoints" / "step-0000002" / "trainer_state.json"
    record = json.loads(state.read_text())
    del functools.reduce(dict.__getitem__, lose[:-1], record)[lose[-1]]
    state.write_text(json.dumps(record))
    write_digests(state.parent)  # a record written that way, not one changed since
    code, err = run_cli(capsys, ["--config", str(config), "--device", "cpu", "--resume", "latest"])
    assert code == 2 and len(err) == 1, err
    assert f"step-0000002: cannot resume from this checkpoint: trainer_state.json {named}" in err[0]


def test_a_stage1_part_s_settings_in_their_order_of_precedence():
    from trainer.contract.config import overridden_by_command_line, stage1_part_overrides

    section = {"training": {"max_steps": 9, "best_metric": "nll_test"}, "optim.generator.lr": 0.1}
    common = {"training.max_steps": 5, "optim.generator.lr": 0.2, "stage1.generator.optim.generator.lr": 0.3}
    defaults = {"training.best_metric": "x", "training.seed": 7, "training.max_steps": 1}
    fixed = {"training.objective": "mle"}
    merged = stage1_part_overrides("generator", section, common, defaults, fixed)
    assert merged["training.seed"] == 7  # the part's default, set nowhere else
    assert merged["training.best_metric"] == "nll_test"  # the section beats the default
    assert merged["training.max_steps"] == 5  # --set beats the section
    assert merged["optim.generator.lr"] == 0.3  # --set stage1.generator.KEY beats --set KEY
    assert merged["training.objective"] == "mle"
    assert (
        stage1_part_overrides("generator", section, {**common, "training.objective": "x"}, {}, fixed)[
            "training.objective"
        ]
        == "mle"
    )  # what the part must be beats everything
    # reported: the section's max_steps replaced by --set; not its lr, which the user set for the part
    assert overridden_by_command_line("generator", section, common) == {"training.max_steps": (9, 5)}
    assert overridden_by_command_line("discriminator", section, common) == {
        "training.max_steps": (9, 5),
        "optim.generator.lr": (0.1, 0.2),
    }


def test_a_stage1_section_value_replaced_by_the_command_line_is_logged_with_both_values(caplog):
    import logging

    from trainer.commands.stages import _report_overridden

    caplog.set_level(logging.INFO, logger="trainer")
    _report_overridden("stage1.generator", {"training.max_steps": (9, 5)})
    lines = [r.getMessage() for r in caplog.records]
    assert lines == ["stage1.generator: the command line's training.max_steps=5 replaces the config's 9"]


@pytest.mark.parametrize(
    ("override", "expected"),
    [
        ("task_options.top_p=0", "key 'task_options.top_p' must be in (0, 1]"),
        ("task_options.kl_coef=-1", "key 'task_options.kl_coef' must be 0 or more"),
        ("task_options.beta=0", "beta must be positive"),
        ("task_options.seq_len=0", "key 'task_options.seq_len' must be at least 1"),
    ],
)
def test_a_task_s_options_check_themselves(override, expected):
    config = ROOT / "configs" / "training" / "stage1.yaml"
    with pytest.raises(ConfigError, match=re.escape(f"{config}: {expected}") if "key" in expected else expected):
        load_task(load_config(config, [override]))
