"""The recipe through the real launcher writes every output of the contract."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from accelerate.utils import DistributedType
from helpers import ROOT, check, env, free_port, launch, records, write_run
from safetensors.torch import load_file

from trainer.contract.config import load_config
from trainer.contract.errors import UserError
from trainer.distributed.world import check_supported, check_world


@pytest.mark.timeout(300)
def test_ring_recipe_two_processes_writes_the_contract(tmp_path):
    out = tmp_path / "ring"
    overrides = {
        "training.max_steps": 60,
        "training.eval_every": 20,
        "training.save_every": 20,
        "training.log_every": 10,
        "training.keep_checkpoints": 2,
        "training.log_with": "[tensorboard]",
        "data.eval_size": 500,
    }
    args = ["--config", "configs/training/ring.yaml", "--output-dir", str(out), "--device", "cpu"]
    for key, value in overrides.items():
        args += ["--set", f"{key}={value}"]
    check(launch(args, 2))

    resolved = load_config(out / "config.yaml")  # the resolved config runs as it is
    assert resolved.config.training.max_steps == 60 and resolved.config.output_dir == str(out)
    assert resolved.generator == yaml.safe_load((ROOT / "configs/model/mlp_generator.yaml").read_text())

    all_records = records(out)
    assert all(r["world_size"] == 2 for r in all_records)
    pairs = [(r["split"], r["step"]) for r in all_records]
    assert len(pairs) == len(set(pairs))
    assert [r["step"] for r in records(out, "train")] == [10, 20, 30, 40, 50, 60]
    evals = records(out, "eval")
    assert [r["step"] for r in evals] == [20, 40, 60]
    assert all(r["num_samples"] == 500 and {"modes", "high_quality", "reverse_kl"} <= r.keys() for r in evals)
    train = records(out, "train")[-1]
    for key in (
        "d_loss",
        "g_loss",
        "lr_d",
        "lr_g",
        "grad_norm_d",
        "grad_norm_g",
        "skipped_d",
        "skipped_g",
        "samples_per_s",
    ):
        assert train[key] is not None, key

    assert sorted(p.name for p in (out / "checkpoints").iterdir()) == ["step-0000040", "step-0000060"]
    checkpoint = out / "checkpoints" / "step-0000060"
    for name in (
        "model.safetensors",
        "model_1.safetensors",
        "optimizer.bin",
        "scheduler.bin",
        "trainer_state.json",
        "digests.json",
        "random_states_0.pkl",
        "random_states_1.pkl",
    ):
        assert (checkpoint / name).is_file(), name
    for kind in ("best", "final"):
        for role in ("generator", "discriminator"):
            assert sorted(p.name for p in (out / kind / role).iterdir()) == ["model.safetensors"]
    assert load_file(out / "final" / "discriminator" / "model.safetensors")["0.weight"].shape == (200, 4)  # packing 2
    assert sorted(p.name for p in (out / "samples").iterdir()) == [f"step-{s:07d}.png" for s in (20, 40, 60)]
    assert list((out / "tensorboard").rglob("events.out.tfevents.*"))


@pytest.mark.timeout(300)
def test_torchrun_gives_one_world_of_two(tmp_path):
    config = write_run(tmp_path, {"training": {"max_steps": 2}})
    check(launch(["--config", str(config), "--device", "auto"], 2, launcher="torchrun"))
    assert {r["world_size"] for r in records(tmp_path / "out")} == {2}
    assert records(tmp_path / "out", "eval")[-1]["num_samples"] == 10


def test_world_size_disagreeing_with_the_launcher_is_an_error(monkeypatch):
    class OneProcessWorld:
        num_processes = 1
        distributed_type = DistributedType.NO

    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("RANK", "1")
    with pytest.raises(UserError, match="rank 1: the launcher started 2 processes but this one sees a world of 1"):
        check_world(OneProcessWorld())


@pytest.mark.parametrize(
    ("kind", "named"),
    [
        (DistributedType.FSDP, "FSDP with fsdp_version 1"),
        (DistributedType.DEEPSPEED, "accelerate's distributed type DEEPSPEED"),
        (DistributedType.MEGATRON_LM, "accelerate's distributed type MEGATRON_LM"),
    ],
)
def test_sharded_types_but_fsdp2_are_refused_before_training(kind, named):
    class ShardedWorld:
        process_index = 3
        distributed_type = kind
        is_fsdp2 = False

    with pytest.raises(UserError, match=f"rank 3: {named} is not supported: .* use fsdp_version: 2") as info:
        check_supported(ShardedWorld())
    assert info.value.agreed
    for plain in (DistributedType.NO, DistributedType.MULTI_CPU, DistributedType.MULTI_GPU):
        ShardedWorld.distributed_type = plain
        check_supported(ShardedWorld())
    ShardedWorld.distributed_type, ShardedWorld.is_fsdp2 = DistributedType.FSDP, True
    check_supported(ShardedWorld())


def accelerate_launch(config_file: Path, args: list[str]) -> subprocess.CompletedProcess:
    """``accelerate launch --config_file CONFIG_FILE scripts/train_stage2.py ARGS`` as a user
    types it: no launcher flag beyond the config file (and a free port)."""
    cmd = [sys.executable, "-m", "accelerate.commands.launch", "--config_file", str(config_file)]
    cmd += ["--main_process_port", str(free_port()), str(ROOT / "scripts" / "train_stage2.py"), *args]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=240, env=env(), cwd=ROOT)


#: the shipped ring config at two steps
RING_TINY = ["--config", "configs/training/ring.yaml", "--device", "cpu", "--set", "training.max_steps=2",
             "--set", "training.eval_every=2", "--set", "data.eval_size=40"]  # fmt: skip


@pytest.mark.timeout(300)
def test_a_shipped_config_takes_the_launchers_precision(tmp_path):
    """ring.yaml leaves training.mixed_precision empty: under 8gpu.yaml (bf16) two CPU processes
    train in bf16 and say so; a --set wins over the launcher, and says that."""
    out = tmp_path / "bf16"
    result = check(launch([*RING_TINY, "--output-dir", str(out)], 2, precision=None))
    assert "precision: bf16 autocast, mixed_precision bf16 from the launcher" in result.stdout + result.stderr
    assert {r["world_size"] for r in records(out)} == {2}
    assert load_config(out / "config.yaml").config.training.mixed_precision == ""
    out = tmp_path / "fp32"
    result = check(launch([*RING_TINY, "--output-dir", str(out), "--set", "training.mixed_precision=no"], 2,
                          precision=None))  # fmt: skip
    assert "precision: fp32, mixed_precision no from --set training.mixed_precision" in result.stdout + result.stderr


@pytest.mark.timeout(300)
def test_the_cpu_config_starts_the_processes_it_names(tmp_path):
    out = tmp_path / "out"
    result = check(accelerate_launch(ROOT / "accelerate_configs" / "cpu.yaml", [*RING_TINY, "--output-dir", str(out)]))
    assert {r["world_size"] for r in records(out)} == {2}
    assert "precision: fp32, mixed_precision no from the launcher" in result.stdout + result.stderr


@pytest.mark.timeout(300)
def test_a_launch_of_fewer_processes_than_its_config_asks_is_refused(tmp_path):
    """A config with use_cpu: true takes accelerate's one-process launcher: one process starts
    where the config asks for 2; one line says so, before any training."""
    shipped = yaml.safe_load((ROOT / "accelerate_configs" / "cpu.yaml").read_text())
    config = tmp_path / "use_cpu.yaml"
    config.write_text(yaml.safe_dump({**shipped, "distributed_type": "MULTI_CPU", "use_cpu": True}))
    result = accelerate_launch(config, [*RING_TINY, "--output-dir", str(tmp_path / "out")])
    assert result.returncode != 0
    errors = [line for line in result.stderr.splitlines() if line.startswith("error")]
    assert len(errors) == 1 and "accelerate launch started 1 process of a config that asks for more" in errors[0]
    assert not (tmp_path / "out" / "metrics.jsonl").exists()
