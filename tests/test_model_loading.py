"""Models read with transformers' from_pretrained: what is expected says one line of the
trainer's, what is not shows as a warning or an error naming the source."""

from __future__ import annotations

import logging

import pytest
from safetensors.torch import load_file, save_file
from transformers import AutoModelForCausalLM, AutoModelForSequenceClassification, GPT2Config, GPT2LMHeadModel

from trainer.contract.errors import CheckpointError
from trainer.tasks.transformers_models import from_pretrained

TINY = {"n_layer": 1, "n_embd": 8, "n_head": 2, "vocab_size": 20, "n_positions": 16}


@pytest.fixture
def causal_lm(tmp_path):
    path = tmp_path / "generator"
    GPT2LMHeadModel(GPT2Config(**TINY)).save_pretrained(path)
    return path


def load_discriminator(path):
    return from_pretrained(AutoModelForSequenceClassification, str(path), "discriminator", num_labels=1)


def test_a_classifier_from_a_causal_lm_says_its_new_head_in_one_line(causal_lm, caplog, capfd):
    caplog.set_level(logging.INFO)
    load_discriminator(causal_lm)
    lines = [r.getMessage() for r in caplog.records]
    assert lines == [f"discriminator: score head newly initialised; the rest from {causal_lm}"], lines
    captured = capfd.readouterr()
    assert "LOAD REPORT" not in captured.err + captured.out and "\x1b[" not in captured.err + captured.out


def test_a_model_read_whole_says_nothing(causal_lm, caplog):
    caplog.set_level(logging.INFO)
    from_pretrained(AutoModelForCausalLM, str(causal_lm), "generator")
    assert caplog.records == []


def test_a_missing_body_weight_is_a_warning_naming_it(causal_lm, caplog):
    weights = load_file(causal_lm / "model.safetensors")
    del weights["transformer.h.0.mlp.c_fc.weight"]
    save_file(weights, causal_lm / "model.safetensors", metadata={"format": "pt"})
    caplog.set_level(logging.INFO)
    from_pretrained(AutoModelForCausalLM, str(causal_lm), "generator")
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1, warnings
    assert warnings[0].startswith(f"generator: {causal_lm}: weights missing from the checkpoint, newly initialised")
    assert "transformer.h.0.mlp.c_fc.weight" in warnings[0]


def test_a_weight_of_another_shape_is_one_error_naming_the_source(causal_lm):
    weights = load_file(causal_lm / "model.safetensors")
    weights["transformer.h.0.mlp.c_fc.weight"] = weights["transformer.h.0.mlp.c_fc.weight"][:, :16].contiguous()
    save_file(weights, causal_lm / "model.safetensors", metadata={"format": "pt"})
    with pytest.raises(CheckpointError, match=f"{causal_lm}: cannot load the generator: .*c_fc.weight"):
        from_pretrained(AutoModelForCausalLM, str(causal_lm), "generator")
