"""Relative paths in a config file are read beside the file; the command line's are the working
directory's; a path found only in the working directory is taken from there with one line."""

from __future__ import annotations

import logging
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from helpers import ROOT, TINY_DISCRIMINATOR, launch_env

from harness.tiny import TINY_GENERATOR
from trainer.commands.cli import main
from trainer.contract.config import load_config
from trainer.contract.config.paths import resolve
from trainer.contract.errors import ConfigError

GENERATOR = TINY_GENERATOR


def write_project(root: Path) -> Path:
    """``root/configs/run.yaml`` naming its model configs, a data file and stage-1 weights by
    paths relative to ``root/configs``; returns the config's path."""
    (root / "models").mkdir(parents=True)
    (root / "models" / "g.yaml").write_text(yaml.safe_dump(GENERATOR))
    (root / "models" / "d.yaml").write_text(yaml.safe_dump(TINY_DISCRIMINATOR))
    (root / "data").mkdir()
    (root / "data" / "points.jsonl").write_text('{"x": 0.0, "y": 1.0}\n')
    config = {
        "output_dir": "outputs/run",
        "model": {"generator_config": "../models/g.yaml", "discriminator_config": "../models/d.yaml"},
        "data": {"path": "../data/points.jsonl"},
        "stage1": {"generator": {"data.path": "../data/points.jsonl"}},
    }
    (root / "configs").mkdir()
    path = root / "configs" / "run.yaml"
    path.write_text(yaml.safe_dump(config))
    return path


def test_paths_in_a_config_file_are_read_beside_it_from_any_directory(tmp_path, monkeypatch):
    config = write_project(tmp_path / "project")
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    run = load_config(config)
    assert Path(run.generator_source) == tmp_path / "project" / "models" / "g.yaml"
    assert run.generator == GENERATOR and run.discriminator == TINY_DISCRIMINATOR
    assert Path(run.config.data.path) == tmp_path / "project" / "data" / "points.jsonl"
    assert Path(run.config.stage1.generator["data.path"]) == tmp_path / "project" / "data" / "points.jsonl"
    assert run.config.output_dir == "outputs/run"  # a run writes where it is started
    # a relative --config too: the paths stay relative, beside it
    monkeypatch.chdir(tmp_path)
    assert load_config("project/configs/run.yaml").generator_source == os.path.join("project", "models", "g.yaml")


def test_the_command_line_s_paths_are_the_working_directory_s(tmp_path, monkeypatch):
    config = write_project(tmp_path / "project")
    monkeypatch.chdir(tmp_path / "project")
    run = load_config(config, ["data.path=data/points.jsonl"], generator_config="models/g.yaml")
    assert run.config.data.path == "data/points.jsonl" and run.generator_source == "models/g.yaml"
    # a dict has no file to be beside: its paths are the working directory's
    assert load_config({"model": {"generator_config": "models/g.yaml", "discriminator_config": "models/d.yaml"}})


def test_a_path_only_in_the_working_directory_is_taken_from_there_with_one_line(tmp_path, monkeypatch, caplog):
    config = write_project(tmp_path)
    data = yaml.safe_load(config.read_text())
    data["model"]["generator_config"] = "models/g.yaml"  # written for the project's root
    config.write_text(yaml.safe_dump(data))
    monkeypatch.chdir(tmp_path)
    with caplog.at_level(logging.WARNING):
        run = load_config(config)
    assert run.generator_source == "models/g.yaml"
    (line,) = [r.getMessage() for r in caplog.records if "not beside the config" in r.getMessage()]
    assert line.startswith(f"{config}: key 'model.generator_config': 'models/g.yaml'") and "working directory" in line


def test_a_missing_path_is_named_as_read_beside_the_config(tmp_path, monkeypatch):
    config = write_project(tmp_path / "project")
    data = yaml.safe_load(config.read_text())
    data["init"] = {"generator": "stage1/best/generator"}
    config.write_text(yaml.safe_dump(data))
    monkeypatch.chdir(tmp_path)
    beside = os.path.join("project", "configs", "stage1", "best", "generator")
    with pytest.raises(ConfigError, match=f"key 'init.generator' names '{beside}', which does not exist"):
        load_config("project/configs/run.yaml")


def test_names_that_are_not_paths_stay_names(tmp_path):
    config = tmp_path / "configs" / "c.yaml"
    assert resolve("gpt2", "model.generator_config", config) == "gpt2"  # a model id
    assert resolve("org/model", "model.generator_config", config) == "org/model"
    assert resolve("generator", "model.discriminator_config", config) == "generator"  # the body
    assert resolve("imdb", "data.dataset", config) == "imdb"
    assert resolve("gen.yaml", "model.generator_config", config) == str(tmp_path / "configs" / "gen.yaml")
    assert resolve("/abs/g.yaml", "model.generator_config", config) == "/abs/g.yaml"


def test_a_config_named_on_the_command_line_that_is_missing_is_named(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    # the checkout's default path, given explicitly: its own line, not the one for a missing --config
    assert main(["--config", "configs/training/stage2.yaml"]) == 2
    assert capsys.readouterr().err.strip().splitlines()[-1] == (
        "error (rank 0): configs/training/stage2.yaml: training config file not found"
    )


def test_the_shipped_configs_read_their_files_from_any_directory(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    run = load_config(ROOT / "configs" / "training" / "ring.yaml")
    assert Path(run.generator_source) == ROOT / "configs" / "model" / "mlp_generator.yaml"
    stage2 = yaml.safe_load((ROOT / "configs" / "training" / "stage2.yaml").read_text())
    # stage 1's outputs, which a run from the checkout's root writes under outputs/
    assert stage2["init"]["generator"] == "../../outputs/oracle/stage1/best/generator"


@pytest.mark.timeout(120)
def test_the_console_script_runs_outside_the_checkout(tmp_path):
    command = [str(Path(sys.executable).with_name("trainer-stage2"))]
    short = ["--set", "training.max_steps=2", "--set", "training.eval_every=2", "--set", "training.save_every=2"]
    config = ROOT / "configs" / "training" / "ring.yaml"
    args = ["--config", str(config), "--device", "cpu", *short, "--set", "task_options.plot=false"]
    env = launch_env()
    done = subprocess.run([*command, *args], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=100)
    assert done.returncode == 0, done.stderr[-3000:]
    assert (tmp_path / "outputs" / "ring" / "final" / "generator").is_dir()  # where it was started
    missing = subprocess.run(command, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=60)
    assert missing.returncode == 2
    assert missing.stderr.strip().splitlines()[-1] == (
        "error (rank 0): no --config given, and the default configs/training/stage2.yaml is not in the working "
        "directory (the trainer's checkout has it): pass --config FILE"
    )
