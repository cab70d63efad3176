"""FSDP2 (accelerate's FSDP with fsdp_version 2) on CPU processes over gloo: the run is the DDP
run (losses, gradient norms, the generator's average, BatchNorm statistics and the exported
weights agree to float rounding), it resumes bit for bit from its sharded checkpoints, and the
sharded types the loop does not run are one line each."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys

import pytest
import torch
from helpers import ROOT, check, env, fork_launch, launch, pacgan_models, records, write_run
from safetensors.torch import load_file
from test_oracle_text import TINY_MODEL, write_oracle_run
from test_text import generates, write_text_run
from transformers import AutoConfig, AutoModelForCausalLM

from trainer.commands.text_example import write_text_example

STEPS, SAVED = 6, 3
COMPARED = ("d_loss", "g_loss", "grad_norm_d", "grad_norm_g")
EXPORTED = ("generator", "generator_raw", "discriminator")


def config(tmp_path, models: str):
    """A tiny ring run with what sharding touches: accumulation, clipping (a norm over shards),
    the generator's average, and with ``pacgan`` BatchNorm statistics shared after each step."""
    section = {"model": pacgan_models(tmp_path / "models")} if models == "pacgan" else {}
    return write_run(
        tmp_path,
        {
            **section,
            "training": {
                "max_steps": STEPS,
                "save_every": SAVED,
                "eval_every": SAVED,
                "keep_checkpoints": 5,
                "gradient_accumulation_steps": 2,
                "ema_decay": 0.8,
            },
            "optim": {
                "generator": {"max_grad_norm": 0.05, "scheduler": "linear"},
                "discriminator": {"max_grad_norm": 0.05},
            },
        },
    )


def run(path, accelerate_config: str, *extra: str, launcher=fork_launch):
    """A 2-process run with ``accelerate_configs/ACCELERATE_CONFIG``, its workers forked from the
    test's process (harness.forked) unless ``launcher`` is the real one: the numbers compared
    here do not depend on it, and each kind of sharded run has the real launcher in a test
    (test_fsdp2_at_two_processes_is_the_ddp_run, the bf16 rehearsal, the fault matrix)."""
    args = ["--config", str(path), "--device", "cpu", *extra]
    return check(launcher(args, 2, accelerate_config=accelerate_config))


def final_weights(out):
    return {role: load_file(out / "final" / role / "model.safetensors") for role in EXPORTED}


@pytest.mark.timeout(300)
# accelerate gives a final norm (PacGAN's last BatchNorm) a group of its own
@pytest.mark.parametrize(("models", "generator_groups"), [("mlp", 1), ("pacgan", 2)])
def test_fsdp2_at_two_processes_is_the_ddp_run(tmp_path, models, generator_groups):
    ddp, fsdp = tmp_path / "ddp", tmp_path / "fsdp"
    run(config(ddp, models), "8gpu.yaml")
    result = run(config(fsdp, models), "cpu_fsdp.yaml", launcher=launch)
    groups = f"the generator in {generator_groups} group(s), the discriminator in 1 group(s); each of the 2 ranks"
    assert f"FSDP2: {groups}" in result.stderr
    assert all(r["world_size"] == 2 for r in records(fsdp / "out"))
    # sharded: the models and the average in distributed checkpoints, no whole weights file
    written = {p.name for p in (fsdp / "out" / "checkpoints" / f"step-{SAVED:07d}").iterdir()}
    assert {"pytorch_model_fsdp_0", "pytorch_model_fsdp_1", "pytorch_model_fsdp_ema"} <= written
    assert not any(name.endswith("safetensors") for name in written), written
    ours, theirs = records(fsdp / "out", "train"), records(ddp / "out", "train")
    assert len(ours) == len(theirs) == STEPS
    for mine, reference in zip(ours, theirs, strict=True):
        for key in COMPARED:
            assert mine[key] == pytest.approx(reference[key], rel=1e-5), (mine["step"], key)
    assert [r["reverse_kl"] for r in records(fsdp / "out", "eval")] == pytest.approx(
        [r["reverse_kl"] for r in records(ddp / "out", "eval")], rel=1e-5
    )
    sharded, whole = final_weights(fsdp / "out"), final_weights(ddp / "out")
    for role in EXPORTED:
        assert sharded[role].keys() == whole[role].keys()
        for key, value in sharded[role].items():
            torch.testing.assert_close(value, whole[role][key], rtol=1e-5, atol=1e-6, msg=f"{role}.{key}")


@pytest.mark.timeout(400)
def test_fsdp2_of_two_gpt2_models_is_the_ddp_run(tmp_path):
    """Transformer blocks in groups of their own, tied embeddings, the discriminator frozen in
    the generator phase (a group still gathered would keep its old flag: found so), the average,
    and exports that from_pretrained loads."""
    path = write_oracle_run(tmp_path, {"training": {"ema_decay": 0.5}})
    outputs = {name: tmp_path / name for name in ("8gpu.yaml", "cpu_fsdp.yaml")}
    for name, out in outputs.items():
        result = run(path, name, "--output-dir", str(out))
    assert "FSDP2: the generator in 5 group(s), the discriminator in 4 group(s)" in result.stderr
    ours, theirs = records(outputs["cpu_fsdp.yaml"], "train"), records(outputs["8gpu.yaml"], "train")
    assert len(ours) == len(theirs) == 4
    for mine, reference in zip(ours, theirs, strict=True):
        for key in (*COMPARED, "reward", "nll_real"):
            assert mine[key] == pytest.approx(reference[key], rel=1e-5), (mine["step"], key)
    for role in EXPORTED:
        sharded, whole = (load_file(out / "final" / role / "model.safetensors") for out in outputs.values())
        for key, value in sharded.items():
            torch.testing.assert_close(value, whole[key], rtol=1e-5, atol=1e-6, msg=f"{role}.{key}")
    model = AutoModelForCausalLM.from_pretrained(outputs["cpu_fsdp.yaml"] / "final" / "generator")
    assert model.lm_head.weight is model.transformer.wte.weight  # the tie survives the export


@pytest.mark.timeout(300)
def test_the_gpu_config_rehearsed_on_cpu_is_the_ddp_run_in_bf16(tmp_path):
    """8gpu_fsdp.yaml as shipped at 2 CPU processes: its bf16 (the launcher's, as the run says:
    parameters gathered and gradients reduced in bf16 by accelerate's FSDP2 policy), and both
    models read from a save_pretrained directory by rank 0 alone (its weights broadcast to the
    others' shards), give the bf16 DDP run's losses to bf16's rounding."""
    pretrained = tmp_path / "pretrained"
    AutoModelForCausalLM.from_config(AutoConfig.for_model(**TINY_MODEL)).save_pretrained(pretrained)
    init = {"init": {"generator": str(pretrained), "discriminator": str(pretrained)}}
    path = write_oracle_run(tmp_path, {**init, "training": {"mixed_precision": "", "ema_decay": 0.5}})
    outputs = {name: tmp_path / name for name in ("8gpu.yaml", "8gpu_fsdp.yaml")}
    for name, out in outputs.items():
        args = ["--config", str(path), "--device", "cpu", "--output-dir", str(out)]
        result = check(launch(args, 2, accelerate_config=name, precision=None))
        assert "precision: bf16 autocast, mixed_precision bf16 from the launcher" in result.stderr
    assert "FSDP2: the generator in 5 group(s), the discriminator in 4 group(s)" in result.stderr
    ours, theirs = records(outputs["8gpu_fsdp.yaml"], "train"), records(outputs["8gpu.yaml"], "train")
    assert len(ours) == len(theirs) == 4 and all(r["world_size"] == 2 for r in ours)
    for mine, reference in zip(ours, theirs, strict=True):
        for key in ("d_loss", "g_loss"):  # measured: 1e-4 apart at most (reductions in another order)
            assert mine[key] == pytest.approx(reference[key], rel=1e-3), (mine["step"], key)
        for key in ("grad_norm_d", "grad_norm_g"):  # 3e-3
            assert mine[key] == pytest.approx(reference[key], rel=2e-2), (mine["step"], key)


@pytest.mark.timeout(300)
def test_an_fsdp2_run_resumes_bit_for_bit(tmp_path):
    path = config(tmp_path, "pacgan")
    out = tmp_path / "out"
    run(path, "cpu_fsdp.yaml")
    again = tmp_path / "again"
    shutil.copytree(out, again)
    (again / "metrics.jsonl").unlink()
    for later in again.glob("checkpoints/step-*"):
        if later.name != f"step-{SAVED:07d}":
            shutil.rmtree(later)
    result = run(path, "cpu_fsdp.yaml", "--output-dir", str(again), "--resume", "latest")
    assert f"resumed from {again / 'checkpoints' / f'step-{SAVED:07d}'} at step {SAVED}" in result.stderr
    whole = {r["step"]: r for r in records(out, "train")}
    for record in records(again, "train"):
        assert {k: record[k] for k in COMPARED} == {k: whole[record["step"]][k] for k in COMPARED}
    resumed, uninterrupted = final_weights(again), final_weights(out)
    for role in EXPORTED:
        for key, value in resumed[role].items():
            assert torch.equal(value, uninterrupted[role][key]), f"{role}.{key}"


@pytest.mark.timeout(120)
def test_fsdp1_is_one_line_on_every_rank(tmp_path):
    fsdp1 = tmp_path / "fsdp1.yaml"
    shipped = (ROOT / "accelerate_configs" / "cpu_fsdp.yaml").read_text()
    fsdp1.write_text(shipped.replace("fsdp_version: 2", "fsdp_version: 1"))
    result = launch(["--config", str(config(tmp_path, "mlp")), "--device", "cpu"], 2, accelerate_config=str(fsdp1))
    assert result.returncode != 0
    lines = [line for line in result.stderr.splitlines() if line.startswith("error (rank")]
    assert sorted(line.split(")")[0] for line in lines) == ["error (rank 0", "error (rank 1"], result.stderr[-3000:]
    assert all("FSDP with fsdp_version 1 is not supported" in line and "8gpu_fsdp.yaml" in line for line in lines)
    assert not (tmp_path / "out" / "metrics.jsonl").exists()


@pytest.mark.timeout(200)
def test_sampling_from_a_sharded_generator_runs_as_many_forwards_on_every_rank(tmp_path):
    """transformers' generate keeps every rank forwarding until all ranks' texts ended for a
    model torch's fully_shard marks (``synced_gpus``); without it a rank whose texts all ended
    stops gathering shards that another still needs (a gloo error, found so)."""
    paths = write_text_example(tmp_path / "example", "gpt2", vocab_size=300, eval_texts=4)
    config = write_text_run(tmp_path, paths)
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2"]
    cmd += [str(ROOT / "tests" / "sharded_generation.py"), str(config)]
    result = subprocess.run(cmd, capture_output=True, text=True, timeout=120, env=env(), cwd=ROOT)
    assert result.returncode == 0, result.stderr[-3000:]
    assert json.loads(result.stdout) == [
        {"lengths": [1, 1, 1, 1], "as_unsharded": True, "ranks": [0, 1]},
        {"lengths": [12, 12, 12, 12], "as_unsharded": True, "ranks": [0, 1]},
    ]


@pytest.mark.timeout(120)
def test_lora_under_fsdp2_is_one_line_on_every_rank(tmp_path):
    paths = write_text_example(tmp_path / "example", "gpt2", vocab_size=300, eval_texts=4)
    config = write_text_run(tmp_path, paths, {"model": {"discriminator_peft": {"r": 4}}})
    result = launch(["--config", str(config), "--device", "cpu"], 2, accelerate_config="cpu_fsdp.yaml")
    assert result.returncode != 0
    lines = [line for line in result.stderr.splitlines() if line.startswith("error (rank")]
    assert sorted(line.split(")")[0] for line in lines) == ["error (rank 0", "error (rank 1"], result.stderr[-3000:]
    assert all("key 'model.discriminator_peft': LoRA adapters do not run under FSDP2 yet" in line for line in lines)


@pytest.mark.timeout(400)
def test_a_sharded_reference_moves_with_its_rounds_as_under_ddp(tmp_path):
    """ddo's reference (the starting generator, moved to the generator every 2 steps) is sharded
    as the generator is, and a checkpoint holds its shards; the exported generator is one that
    ``pipeline()`` runs, as the DDP run's."""
    paths = write_text_example(tmp_path / "example", "gpt2", vocab_size=300, eval_texts=5)
    options = {"generator_objective": "ddo", "beta": 0.5, "round_steps": 2, "prompt_len": 2}
    path = write_text_run(tmp_path, paths, {"task_options": options, "training": {"d_steps_per_g_step": 0}})
    outputs = {name: tmp_path / name for name in ("8gpu.yaml", "cpu_fsdp.yaml")}
    for name, out in outputs.items():
        run(path, name, "--output-dir", str(out))
    ours, theirs = records(outputs["cpu_fsdp.yaml"], "train"), records(outputs["8gpu.yaml"], "train")
    assert len(ours) == len(theirs) == 4
    for mine, reference in zip(ours, theirs, strict=True):
        for key in ("g_loss", "log_ratio_fake", "log_ratio_real"):
            assert mine[key] == pytest.approx(reference[key], rel=1e-5, abs=1e-7), (mine["step"], key)
    assert (outputs["cpu_fsdp.yaml"] / "checkpoints" / "step-0000004" / "pytorch_model_fsdp_reference").is_dir()
    texts = []
    for out in outputs.values():
        torch.manual_seed(0)
        texts.append(generates(out / "final" / "generator"))
    assert texts[0] == texts[1] and texts[0].startswith("Return the"), texts


@pytest.mark.timeout(120)
def test_one_non_finite_element_of_one_shard_skips_the_step_on_every_rank():
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2"]
    cmd += [str(ROOT / "tests" / "sharded_nonfinite.py")]
    result = subprocess.run(cmd, capture_output=True, text=True, timeout=100, env=env(), cwd=ROOT)
    assert result.returncode == 0, result.stderr[-3000:]
    assert json.loads(result.stdout) == [{"before": True, "after": False}, {"before": True, "after": False}]


@pytest.mark.timeout(300)
def test_a_sharded_checkpoint_resumes_on_four_processes(tmp_path):
    """The distributed checkpoint reshards: 2 processes' shards continue at 4, the accumulation
    halved (the same global batch), to the uninterrupted run's weights."""
    path = config(tmp_path, "mlp")
    out, again = tmp_path / "out", tmp_path / "again"
    run(path, "cpu_fsdp.yaml")
    shutil.copytree(out, again)
    (again / "metrics.jsonl").unlink()
    for later in again.glob("checkpoints/step-*"):
        if later.name != f"step-{SAVED:07d}":
            shutil.rmtree(later)
    args = ["--config", str(path), "--device", "cpu", "--output-dir", str(again), "--resume", "latest"]
    result = check(fork_launch(args, 4, accelerate_config="cpu_fsdp.yaml"))
    assert "this run has 4: training.gradient_accumulation_steps 2 -> 1" in result.stderr
    assert "each of the 4 ranks holds a shard" in result.stderr
    assert [r["world_size"] for r in records(again)] == [4] * len(records(again))
    resumed, uninterrupted = final_weights(again), final_weights(out)
    for role in EXPORTED:
        for key, value in resumed[role].items():
            torch.testing.assert_close(value, uninterrupted[role][key], rtol=1e-5, atol=1e-6, msg=f"{role}.{key}")
