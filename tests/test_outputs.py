"""What users look at: tensorboard scalars, the metric plot, and a --debug run."""

from __future__ import annotations

import math
import subprocess
import sys

import pytest
import torch
import yaml
from helpers import ROOT, records, write_run

from trainer import Trainer, load_config
from trainer.commands.cli import main


@pytest.mark.timeout(300)
def test_tensorboard_holds_the_scalars_of_metrics_jsonl(tmp_path):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    config = write_run(tmp_path, {"training": {"log_with": ["tensorboard"]}})
    Trainer(load_config(config), device="cpu").fit()
    runs = [p.parent for p in (tmp_path / "out" / "tensorboard").rglob("events.out.tfevents.*")]
    project = tmp_path / "out" / "tensorboard" / "out"  # the project is the output directory's name
    assert project in runs and all(project in run.parents or run == project for run in runs), runs
    runs = [project]
    events = EventAccumulator(str(runs[0]))
    events.Reload()
    tags = set(events.Tags()["scalars"])
    compared = 0
    for record in records(tmp_path / "out"):
        for key, value in record.items():
            if key in ("step", "split", "world_size") or not isinstance(value, (int, float)) or isinstance(value, bool):
                continue
            tag = f"{record['split']}/{key}"
            assert tag in tags, tag
            logged = {e.step: e.value for e in events.Scalars(tag)}
            assert math.isclose(logged[record["step"]], value, rel_tol=1e-6, abs_tol=1e-6), (tag, record["step"])
            compared += 1
    assert compared > 20


@pytest.mark.timeout(120)
def test_plot_metrics_draws_the_curves(tmp_path):
    config = write_run(tmp_path, {})
    Trainer(load_config(config), device="cpu").fit()
    script = ROOT / "scripts" / "plot_metrics.py"
    out = subprocess.run(
        [sys.executable, str(script), str(tmp_path / "out")], capture_output=True, text=True, timeout=60
    )
    assert out.returncode == 0, out.stderr
    assert "train/d_loss" in out.stdout and "eval/modes" in out.stdout
    assert (tmp_path / "out" / "metrics.png").stat().st_size > 10_000
    missing = subprocess.run([sys.executable, str(script), str(tmp_path)], capture_output=True, text=True, timeout=60)
    assert missing.returncode == 2 and "no metrics.jsonl" in missing.stderr


@pytest.mark.timeout(120)
def test_debug_runs_a_few_steps_in_this_process_without_watchdog(tmp_path):
    config = write_run(tmp_path, {"training": {"max_steps": 1000, "eval_every": 500}})
    try:
        assert main(["--config", str(config), "--device", "cpu", "--debug"]) == 0
        assert torch.is_anomaly_enabled()
    finally:
        torch.autograd.set_detect_anomaly(False)
    assert not torch.distributed.is_initialized()
    debug_dir = tmp_path / "out-debug"
    assert [r["step"] for r in records(debug_dir, "eval")] == [2, 4]
    assert sorted(p.name for p in (debug_dir / "checkpoints").iterdir()) == ["step-0000002", "step-0000004"]
    resolved = yaml.safe_load((debug_dir / "config.yaml").read_text())
    assert resolved["distributed"]["watchdog_s"] == 0 and resolved["training"]["num_workers"] == 0
    assert not (tmp_path / "out").exists()


@pytest.mark.timeout(120)
def test_trackers_start_with_the_project_run_name_and_init_kwargs(tmp_path, monkeypatch):
    from accelerate import Accelerator

    started = []
    init_trackers = Accelerator.init_trackers

    def recording(self, project_name, config=None, init_kwargs=None):
        started.append((project_name, init_kwargs))
        return init_trackers(self, project_name, config, init_kwargs)

    monkeypatch.setattr(Accelerator, "init_trackers", recording)
    training = {
        "log_with": ["tensorboard"],
        "project_name": "rings",
        "run_name": "trial-3",
        "tracker_init_kwargs": {"tensorboard": {"flush_secs": 1}, "wandb": {"entity": "team"}},
        "max_steps": 2,
    }
    Trainer(load_config(write_run(tmp_path, {"training": training})), device="cpu").fit()
    assert started == [("rings", {"tensorboard": {"flush_secs": 1}, "wandb": {"entity": "team"}})]
    assert list((tmp_path / "out" / "tensorboard" / "rings").glob("events.out.tfevents.*"))

    from trainer.training.metrics import tracker_settings

    run = load_config(write_run(tmp_path, {"training": training}))
    project, kwargs = tracker_settings(run.config, ["wandb", "mlflow", "tensorboard"])
    assert kwargs == {
        "tensorboard": {"flush_secs": 1},
        "wandb": {"entity": "team", "name": "trial-3"},
        "mlflow": {"run_name": "trial-3"},
    }
