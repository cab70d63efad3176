"""The Python API: in-process fit and evaluate, and launch() through notebook_launcher."""

from __future__ import annotations

import subprocess
import sys

import pytest
from helpers import ROOT, records, write_run

from trainer import Trainer, launch, load_config
from trainer.contract.errors import CheckpointError, UserError


def test_importing_the_package_loads_no_heavy_library():
    code = "import sys, trainer; print(sorted(m for m in ('torch', 'accelerate', 'transformers') if m in sys.modules))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=60)
    assert out.stdout.strip() == "[]", out.stderr


@pytest.mark.timeout(300)
def test_two_fits_in_one_process_then_evaluate_alone(tmp_path):
    config = write_run(tmp_path, {"training": {"max_steps": 4, "save_every": 4}})
    first = Trainer(load_config(config), device="cpu").fit()
    first_losses = [(r["d_loss"], r["g_loss"]) for r in records(tmp_path / "out", "train")]
    # A second run in the same process (a re-run notebook cell) starts clean; the first run's
    # checkpoints make it refuse the directory unless told to replace that run.
    with pytest.raises(CheckpointError, match="--overwrite"):
        Trainer(load_config(config), device="cpu").fit()
    metrics = Trainer(load_config(config), device="cpu", overwrite=True).fit()
    # nothing of the first run (random state, accelerate's) leaks into the second
    assert metrics == first
    assert [(r["d_loss"], r["g_loss"]) for r in records(tmp_path / "out", "train")] == first_losses
    assert metrics == {k: v for k, v in records(tmp_path / "out", "eval")[-1].items() if k in metrics}
    assert records(tmp_path / "out", "eval")[-1]["num_samples"] == 10
    written = (tmp_path / "out" / "metrics.jsonl").read_text()

    run = load_config(config)
    for source in (tmp_path / "out" / "final", tmp_path / "out" / "checkpoints" / "step-0000004"):
        again = Trainer(run, device="cpu").evaluate(source)
        assert again == metrics, source
    assert (tmp_path / "out" / "metrics.jsonl").read_text() == written  # evaluate() wrote nothing
    # The caller's config is left as it was: a later fit() does not start from final/.
    assert run.config.init.generator == "" and run.config.init.discriminator == ""
    with pytest.raises(CheckpointError, match="neither a checkpoint"):
        Trainer(run, device="cpu").evaluate(tmp_path)


@pytest.mark.timeout(300)
def test_launch_runs_a_config_in_two_processes(tmp_path):
    config = write_run(tmp_path, {"training": {"max_steps": 4}})
    last_eval = launch(str(config), num_processes=2, device="cpu", overrides={"training.eval_every": 4})
    assert last_eval["world_size"] == 2 and last_eval["step"] == 4
    assert last_eval["num_samples"] == 10
    assert {r["world_size"] for r in records(tmp_path / "out")} == {2}
    # The kernel is left clean: a one-process fit runs after it.
    Trainer(load_config(config, {"output_dir": str(tmp_path / "after")}), device="cpu").fit()
    assert {r["world_size"] for r in records(tmp_path / "after")} == {1}


def test_accelerates_private_reset_still_forgets_its_singletons():
    # trainer.distributed.world.reset_accelerate_state is the one call of accelerate's private
    # _reset_state, which a later run in the same process (a notebook) relies on
    from accelerate import Accelerator
    from accelerate.state import AcceleratorState, GradientState, PartialState

    from trainer.distributed.world import reset_accelerate_state

    Accelerator(cpu=True)
    assert AcceleratorState._shared_state and GradientState._shared_state and PartialState._shared_state
    reset_accelerate_state(partial=False)
    assert not AcceleratorState._shared_state and not GradientState._shared_state
    assert PartialState._shared_state  # the per-process state stays unless asked
    reset_accelerate_state(partial=True)
    assert not PartialState._shared_state
    Accelerator(cpu=True)  # and a new one builds after it
    reset_accelerate_state(partial=True)


@pytest.mark.timeout(120)
def test_the_python_api_shows_the_trainers_log_lines_once(tmp_path):
    # a notebook or a script that set no logging up: the lines show as on the command line
    config = write_run(tmp_path, {"training": {"max_steps": 2}})
    code = (
        "from trainer import Trainer, load_config\n"
        f"run = load_config({str(config)!r})\n"
        "Trainer(run, device='cpu').fit()\n"
        "Trainer(run, device='cpu', overwrite=True).fit()\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=100)
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stderr.count("INFO trainer: [RANK 0] eval at step 2:") == 2, out.stderr[-3000:]


def test_launch_after_cuda_was_used_in_the_kernel_says_what_to_do(tmp_path, monkeypatch):
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: True)
    with pytest.raises(UserError, match="restart the kernel and call launch"):
        launch(str(write_run(tmp_path, {})), num_processes=2, device="cuda")
    assert not (tmp_path / "out").exists()  # no process was started
