"""LoRA adapters (model.peft, model.discriminator_peft): only the adapters train, the KL
reference is the generator with its adapter off (no second copy), checkpoints hold the
adapters alone and resume bit for bit, exports hold the merged model and the adapter."""

from __future__ import annotations

import json
import shutil

import pytest
import torch
from helpers import ROOT, check, fork_launch, launch, records
from safetensors.torch import load_file
from test_text import bad, check_evals, generates, write_text_run

from trainer.commands.cli import main
from trainer.commands.text_example import write_text_example
from trainer.contract.config import load_config
from trainer.training.loop import Trainer

pytest.importorskip("peft")

STAGE1 = ROOT / "scripts" / "train_stage1.py"
LORA = {"r": 4, "lora_alpha": 8, "lora_dropout": 0.0}


@pytest.fixture(scope="module")
def example(tmp_path_factory):
    root = tmp_path_factory.mktemp("peft_example")
    return {arch: write_text_example(root, arch, vocab_size=300, eval_texts=23) for arch in ("gpt2", "llama")}


def adapter_keys(path):
    return sorted(load_file(str(path)))


def resumable_copy(out, resumed, config):
    """A copy of run ``out`` at ``resumed`` without its last checkpoint and its final weights,
    and its config; returns the config's path."""
    shutil.copytree(out, resumed)
    for name in ("checkpoints/step-0000004", "final"):
        shutil.rmtree(resumed / name)
    path = resumed.parent / "train.yaml"
    path.write_text(config.read_text().replace(str(out), str(resumed)))
    return path


def assert_same_adapters(out, resumed):
    for role in ("generator", "discriminator"):
        name = f"final/{role}-adapter/adapter_model.safetensors"
        uninterrupted, again = load_file(str(out / name)), load_file(str(resumed / name))
        assert uninterrupted.keys() == again.keys()
        assert all(torch.equal(uninterrupted[k], again[k]) for k in uninterrupted), role


@pytest.mark.timeout(600)
@pytest.mark.parametrize("architecture", ["gpt2", "llama"])
def test_stage1_in_one_process_then_stage2_in_two_with_adapters(tmp_path, example, architecture):
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    paths = example[architecture]
    run = launch if architecture == "gpt2" else fork_launch  # one row on the real launcher (harness.forked)
    stage1 = write_text_run(tmp_path / "stage1", paths, {"model": {"peft": LORA}})
    check(run(["--config", str(stage1), "--device", "cpu"], 1, script=STAGE1, timeout=300))
    best = tmp_path / "stage1" / "out" / "best"
    # the generator's run: best/generator is the merged model, best/generator-adapter the
    # adapter on the example's model; the discriminator's run adds none to the frozen generator
    mle = tmp_path / "stage1" / "out" / "generator_mle" / "best"
    assert json.loads((mle / "generator" / "config.json").read_text())["model_type"] == architecture
    adapter = json.loads((mle / "generator-adapter" / "adapter_config.json").read_text())
    assert adapter["r"] == 4 and adapter["base_model_name_or_path"] == str(paths["model"])
    assert not (best / "generator-adapter").exists()
    base = AutoModelForCausalLM.from_pretrained(str(paths["model"]))
    with_adapter = PeftModel.from_pretrained(base, str(mle / "generator-adapter"))
    merged = AutoModelForCausalLM.from_pretrained(str(mle / "generator"))
    ids = torch.tensor([[1, 5, 9, 12, 7]])
    with torch.no_grad():
        assert torch.allclose(with_adapter(input_ids=ids).logits, merged(input_ids=ids).logits, atol=1e-5)

    # stage 2 in 2 processes: a new adapter on the stage-1 generator, one on the discriminator
    overrides = {
        "model": {
            "generator_config": str(best / "generator"),
            "discriminator_config": str(best / "discriminator"),
            "peft": LORA,
            "discriminator_peft": LORA,
        },
        "task_options": {"kl_coef": 0.1, "mle_weight": 0.5},
    }
    stage2 = write_text_run(tmp_path / "stage2", paths, overrides)
    check(run(["--config", str(stage2), "--device", "cpu"], 2, timeout=300))
    out = tmp_path / "stage2" / "out"
    check_evals(out, 2)
    kl = [r["kl"] for r in records(out, "train")]
    assert kl[0] < 1e-6 and all(value > 10 * max(kl[0], 1e-9) for value in kl[1:]), kl
    # checkpoints hold the adapters alone (and the discriminator's head, trained whole)
    for name in ("model.safetensors", "model_1.safetensors"):
        keys = adapter_keys(out / "checkpoints" / "step-0000004" / name)
        assert keys and all("lora_" in k or "score" in k for k in keys), keys[:5]
    assert any("score" in k for k in adapter_keys(out / "checkpoints" / "step-0000004" / "model_1.safetensors"))
    assert generates(out / "final" / "generator").startswith("Return the")
    for role in ("generator", "discriminator"):
        assert (out / "final" / f"{role}-adapter" / "adapter_model.safetensors").is_file()
        assert (out / "final" / role / "model.safetensors").is_file()

    # resumed from step 2 in 2 processes: the same adapters, bit for bit
    config = resumable_copy(out, tmp_path / "resumed" / "out", stage2)
    check(run(["--config", str(config), "--device", "cpu", "--resume", "latest"], 2, timeout=300))
    assert_same_adapters(out, tmp_path / "resumed" / "out")


@pytest.mark.timeout(300)
def test_a_resumed_run_in_one_process_ends_with_the_same_adapters(tmp_path, example):
    overrides = {"model": {"peft": LORA, "discriminator_peft": LORA}, "task_options": {"kl_coef": 0.1}}
    config = write_text_run(tmp_path / "whole", example["llama"], overrides)
    assert main(["--config", str(config), "--device", "cpu"]) == 0
    out, resumed = tmp_path / "whole" / "out", tmp_path / "resumed" / "out"
    again = resumable_copy(out, resumed, config)
    assert main(["--config", str(again), "--device", "cpu", "--resume", "latest"]) == 0
    assert_same_adapters(out, resumed)
    assert [r["g_loss"] for r in records(out, "train")][2:] == [r["g_loss"] for r in records(resumed, "train")][2:]


def started(config_path) -> Trainer:
    return Trainer(load_config(str(config_path)), device="cpu").start()


@pytest.mark.timeout(300)
def test_the_kl_reference_is_the_generator_with_its_adapter_off(tmp_path, example):
    from transformers import AutoModelForCausalLM

    paths = example["gpt2"]
    config = write_text_run(
        tmp_path, paths, {"model": {"peft": LORA}, "task_options": {"kl_coef": 0.1}, "training": {"log_with": ["none"]}}
    )
    stage1 = AutoModelForCausalLM.from_pretrained(str(paths["model"])).eval()
    with started(config) as trainer:
        task, generator = trainer.task, trainer.g.unwrapped
        sequences = torch.randint(3, 200, (4, 10))
        for _ in range(3):
            trainer.step()
        with torch.no_grad():
            expected = task.token_log_probs(stage1, sequences)
            assert torch.allclose(task.token_log_probs(task.reference, sequences), expected, atol=1e-5)
            # the adapter has moved the generator itself away from it
            assert not torch.allclose(task.token_log_probs(generator, sequences), expected, atol=1e-4)
        # no second copy: the reference holds no weights, the run's models those of one
        # generator (base and adapter) and one discriminator
        assert sum(p.numel() for p in task.reference.parameters()) == 0
        base = sum(p.numel() for p in stage1.parameters())
        trained = {n: p for n, p in generator.named_parameters() if p.requires_grad}
        assert trained and all("lora_" in n for n in trained)
        assert sum(p.numel() for p in generator.parameters()) == base + sum(p.numel() for p in trained.values())


@pytest.mark.timeout(300)
def test_adapters_train_with_gradient_checkpointing_in_bfloat16(tmp_path, example):
    config = write_text_run(
        tmp_path,
        example["llama"],
        {
            "model": {"peft": LORA, "gradient_checkpointing": True, "dtype": "bfloat16"},
            "training": {"max_steps": 2, "log_with": ["none"]},
        },
    )
    with started(config) as trainer:
        lora_b = {n: p.detach().clone() for n, p in trainer.g.unwrapped.named_parameters() if "lora_B" in n}
        trainer.step()
        moved = [
            n for n, p in trainer.g.unwrapped.named_parameters() if "lora_B" in n and not torch.equal(p, lora_b[n])
        ]
    assert lora_b and moved == list(lora_b)  # every adapter got a gradient through the recomputed blocks


@pytest.mark.timeout(300)
def test_adapter_settings_that_cannot_work_are_one_line_each(tmp_path, example, capsys):
    line = bad(tmp_path / "key", example["gpt2"], {"model": {"peft": {"rank": 4}}}, capsys)
    assert "key 'model.peft': not a LoRA config" in line and "rank" in line
    line = bad(tmp_path / "ema", example["gpt2"], {"model": {"peft": LORA}, "training": {"ema_decay": 0.99}}, capsys)
    assert "key 'training.ema_decay' with model.peft" in line
    rounds = {
        "model": {"peft": LORA},
        "task_options": {"generator_objective": "ddo", "round_steps": 2},
        "training": {"d_steps_per_g_step": 0},
    }
    line = bad(tmp_path / "rounds", example["gpt2"], rounds, capsys)
    assert "key 'task_options.round_steps': with model.peft" in line
    line = bad(tmp_path / "dir", example["gpt2"], {"model": {"peft": str(tmp_path)}}, capsys)
    assert f"key 'model.peft' names {str(tmp_path)!r}, which holds no adapter_config.json" in line


@pytest.mark.timeout(300)
def test_a_saved_adapter_s_config_is_reused_and_the_adapter_alone_exported(tmp_path, example):
    first = write_text_run(tmp_path / "first", example["gpt2"], {"model": {"peft": {**LORA, "r": 2}}})
    assert main(["--config", str(first), "--device", "cpu"]) == 0
    saved = tmp_path / "first" / "out" / "final" / "generator-adapter"
    again = write_text_run(
        tmp_path / "again", example["gpt2"], {"model": {"peft": str(saved), "peft_merge_on_export": False}}
    )
    assert main(["--config", str(again), "--device", "cpu"]) == 0
    final = tmp_path / "again" / "out" / "final"
    assert json.loads((final / "generator" / "adapter_config.json").read_text())["r"] == 2
    assert not (final / "generator-adapter").exists() and not (final / "generator" / "model.safetensors").exists()
    assert generates(final / "generator").startswith("Return the")  # transformers loads an adapter onto its base


def test_without_peft_installed_the_key_is_named(monkeypatch):
    import sys

    from trainer.contract.errors import ConfigError
    from trainer.state.adapters import with_adapter

    monkeypatch.setitem(sys.modules, "peft", None)  # import peft raises ImportError
    with pytest.raises(ConfigError, match="run.yaml: key 'model.peft' needs the peft library: pip install"):
        with_adapter(torch.nn.Linear(2, 2), {"r": 2}, "generator", "model.peft", "run.yaml")
