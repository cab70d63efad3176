"""The text recipe: your own pretrained causal LM (GPT-2 and Llama architectures) against a
classifier on your own texts, stage 1 in 1 process and stage 2 in 2, and its bad inputs."""

from __future__ import annotations

import importlib.util
import json
import math
import sys
from pathlib import Path
from typing import Any

import pytest
import torch
import yaml
from helpers import ROOT, check, deep_merge, fork_launch, launch, records, tensorboard_text

from trainer.commands.cli import main
from trainer.commands.text_example import write_text_example

STAGE1 = ROOT / "scripts" / "train_stage1.py"
EVAL_TEXTS = 23  # not a multiple of the eval batch or of 2 processes: the count must be exact


@pytest.fixture(scope="module")
def example(tmp_path_factory) -> dict[str, dict[str, Path]]:
    """The offline example (stdlib docstrings, a BPE tokenizer) with a tiny GPT-2 and a tiny Llama."""
    root = tmp_path_factory.mktemp("text_example")
    return {arch: write_text_example(root, arch, vocab_size=300, eval_texts=EVAL_TEXTS) for arch in ("gpt2", "llama")}


def write_text_run(tmp: Path, paths: dict[str, Path], config: dict[str, Any] | None = None) -> Path:
    base: dict[str, Any] = {
        "task": "text",
        "output_dir": str(tmp / "out"),
        # as the shipped text configs: without dropout, so that the KL to the reference (scored
        # in eval mode) starts at 0 (the example's models have transformers' default 0.1)
        "model": {
            "generator_config": str(paths["model"]),
            "discriminator_config": "generator",
            "disable_dropout": True,
        },
        "data": {"train_files": str(paths["train"]), "eval_files": str(paths["eval"]), "cache_dir": str(tmp / "cache")},
        "task_options": {"max_length": 24, "max_new_tokens": 12, "write_samples": 3},
        "training": {"max_steps": 4, "batch_size": 4, "eval_every": 2, "save_every": 2, "log_every": 1, "seed": 3},
        "optim": {"generator": {"lr": 1e-3}, "discriminator": {"lr": 1e-3}},
        "eval": {"batch_size": 5},
        "stage1": {
            "generator": {"training.best_metric": "nll_test"},
            "discriminator": {
                "training.max_steps": 2,
                "training.best_metric": "d_accuracy",
                "training.best_mode": "max",
            },
        },
    }
    path = tmp / "train.yaml"
    tmp.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump(deep_merge(base, config or {})))
    return path


def generates(directory: Path) -> str:
    """What ``pipeline("text-generation")`` makes of an exported generator."""
    from transformers import pipeline

    return pipeline("text-generation", model=str(directory))("Return the", max_new_tokens=5)[0]["generated_text"]


def check_evals(out: Path, processes: int) -> list[dict[str, Any]]:
    evals = records(out, "eval")
    for record in evals:
        assert record["world_size"] == processes
        assert record["num_samples"] == EVAL_TEXTS
        assert 0 < record["nll_test"] < 20 and 0 <= record["d_accuracy"] <= 1
        assert 1 <= record["mean_length"] <= 12 and 0 < record["distinct2"] <= 1
        assert 0 <= record["bleu4"] <= 1 and 0 <= record["self_bleu4"] <= 1
    return evals


@pytest.mark.timeout(600)
@pytest.mark.parametrize("architecture", ["gpt2", "llama"])
def test_stage1_in_one_process_then_stage2_in_two(tmp_path, example, architecture):
    paths = example[architecture]
    if architecture == "gpt2":
        # A stock GPT-2 config.json carries keys a fresh config does not (n_ctx): accepted as
        # transformers accepts them.
        assert "n_ctx" in json.loads((paths["model"] / "config.json").read_text())
    stage1 = write_text_run(tmp_path / "stage1", paths)
    run = launch if architecture == "gpt2" else fork_launch  # one row on the real launcher (harness.forked)
    check(run(["--config", str(stage1), "--device", "cpu"], 1, script=STAGE1, timeout=300))
    out1 = tmp_path / "stage1" / "out"
    mle = records(out1 / "generator_mle", "train")
    assert mle and all("g_loss" in r and "d_loss" not in r for r in mle)
    check_evals(out1, 1)
    for role in ("generator", "discriminator"):
        assert (out1 / "best" / role / "tokenizer.json").is_file(), role
    assert (out1 / "best" / "generator" / "generation_config.json").is_file()

    stage2 = write_text_run(
        tmp_path / "stage2",
        paths,
        {
            "model": {
                "generator_config": str(out1 / "best" / "generator"),
                "discriminator_config": str(out1 / "best" / "discriminator"),
            },
            "task_options": {"kl_coef": 0.1, "mle_weight": 0.5},
        },
    )
    ran = check(run(["--config", str(stage2), "--device", "cpu"], 2, timeout=300))
    # transformers' bar for each model read (from stage 1's export), on every rank: off
    assert "Loading weights" not in ran.stderr, ran.stderr[-2000:]
    out2 = tmp_path / "stage2" / "out"
    assert [r["step"] for r in check_evals(out2, 2)] == [2, 4]
    train = records(out2, "train")
    assert all({"reward", "policy_loss", "kl", "nll_real"} <= set(r) for r in train)
    # The reference is the generator the run starts from: no KL before its first update (up
    # to float rounding: the generator's forward also holds the real texts), some after it.
    kl = [r["kl"] for r in train]
    assert kl[0] < 1e-5 and all(value > 10 * kl[0] for value in kl[1:]), kl
    samples = (out2 / "samples" / "step-0000004.txt").read_text().splitlines()
    assert len(samples) == 3
    if importlib.util.find_spec("tensorboard"):  # the default tracker, when installed
        assert tensorboard_text(out2, "samples")[-1] == "\n\n".join(samples)
    assert json.loads((out2 / "final" / "generator" / "config.json").read_text())["model_type"] == architecture
    assert generates(out2 / "final" / "generator").startswith("Return the")


@pytest.mark.timeout(400)
@pytest.mark.parametrize("objective", ["ddo", "spin"])
def test_likelihood_ratio_objectives_train_in_two_processes(tmp_path, example, objective):
    """ddo and spin on texts that continue a prompt: the example's GPT-2 is the reference (the
    generator the run starts from); a round every 2 steps moves it to the generator."""
    options = {"generator_objective": objective, "beta": 0.5, "round_steps": 2, "prompt_len": 2}
    config = write_text_run(tmp_path, example["gpt2"], {"task_options": options, "training": {"d_steps_per_g_step": 0}})
    run = launch if objective == "ddo" else fork_launch  # one row on the real launcher (harness.forked)
    check(run(["--config", str(config), "--device", "cpu"], 2, timeout=300))
    out = tmp_path / "out"
    evals = records(out, "eval")  # texts are the prompt and up to 12 tokens: check_evals's 12 is not theirs
    assert [(r["step"], r["world_size"], r["num_samples"]) for r in evals] == [(2, 2, EVAL_TEXTS), (4, 2, EVAL_TEXTS)]
    train = {r["step"]: r for r in records(out, "train")}
    assert all("log_ratio_real" in r and "d_loss" not in r for r in train.values())
    # The generator is the reference at step 1 and again at step 3 (the round after step 2).
    for step in (1, 3):
        assert abs(train[step]["log_ratio_fake"]) < 1e-4 and abs(train[step]["log_ratio_real"]) < 1e-4, train[step]
    assert abs(train[2]["log_ratio_real"]) > 1e-3
    assert (out / "checkpoints" / "step-0000004" / "reference.safetensors").is_file()


@pytest.mark.timeout(300)
def test_eval_fraction_holds_out_texts_by_the_seed(tmp_path, example):
    config = write_text_run(
        tmp_path,
        example["gpt2"],
        {"data": {"eval_files": "", "eval_fraction": 0.01}, "training": {"max_steps": 2, "mixed_precision": "bf16"}},
    )
    assert main(["--config", str(config), "--device", "cpu"]) == 0
    texts = len(example["gpt2"]["train"].read_text().splitlines())
    held_out = records(tmp_path / "out", "eval")[-1]["num_samples"]
    assert held_out == -(-texts // 100)  # datasets rounds the test share up


def bad(tmp_path: Path, paths: dict[str, Path], config: dict[str, Any], capsys) -> str:
    path = write_text_run(tmp_path, paths, config)
    assert main(["--config", str(path), "--device", "cpu"]) == 2
    lines = [line for line in capsys.readouterr().err.splitlines() if line.startswith("error (rank")]
    assert len(lines) == 1, lines
    return lines[0]


@pytest.mark.timeout(300)
def test_bad_text_inputs_are_one_line_each(tmp_path, example, capsys):
    paths = example["gpt2"]
    csv = tmp_path / "texts.csv"
    csv.write_text("body,label\nsome text,1\n")
    line = bad(tmp_path / "column", paths, {"data": {"train_files": str(csv)}}, capsys)
    assert f"{csv}: no column 'text'" in line and "it has body, label" in line
    empty = tmp_path / "empty.jsonl"
    empty.write_text("")
    line = bad(tmp_path / "empty", paths, {"data": {"train_files": str(empty)}}, capsys)
    assert str(empty) in line
    broken = tmp_path / "broken.jsonl"
    broken.write_text('{"text": "fine"}\n{"text": \n')
    line = bad(tmp_path / "broken", paths, {"data": {"train_files": str(broken)}}, capsys)
    assert f"{broken}: cannot read as json" in line
    line = bad(tmp_path / "id", paths, {"model": {"generator_config": "no-such-org/no-such-model"}}, capsys)
    assert "no-such-org/no-such-model: the generator model config is neither a file" in line
    line = bad(tmp_path / "files", paths, {"data": {"train_files": ""}}, capsys)
    assert "key 'data.train_files' is empty" in line


@pytest.mark.timeout(300)
def test_padding_is_excluded_from_the_losses_and_the_eval(tmp_path, example):
    """The NLL of a padded batch equals the mean over each text's own tokens, computed on each
    text alone (no padding anywhere), in training (mle_loss) and in eval (nll_test)."""
    from trainer.contract.config import load_config
    from trainer.contract.registry import load_task

    task = load_task(load_config(write_text_run(tmp_path, example["gpt2"], {"task_options": {"max_length": 64}})))
    generator = task.build_generator().eval()
    dataset = task.eval_dataset()
    items = [dataset[i] for i in range(4)]
    lengths = [len(item["input_ids"]) for item in items]
    assert len(set(lengths)) > 1 and all(item["input_ids"][-1] == task.eos_id for item in items)
    batch = task.collate(items)
    assert batch["input_ids"].shape[1] == max(lengths)
    with torch.no_grad():
        alone = [task.token_log_probs(generator, torch.tensor([item["input_ids"]]))[0] for item in items]
        loss, _ = task.mle_loss(generator, batch)
        outputs = task.eval_outputs(generator, task.build_discriminator().eval(), batch)
    expected = -torch.cat(alone).mean()
    assert float(loss) == pytest.approx(float(expected), rel=1e-5)
    for row, log_p in enumerate(alone):
        assert float(outputs["nll_test"][row]) == pytest.approx(float(-log_p.mean()), rel=1e-5)
    assert task.valid_mask(torch.tensor([[5, task.eos_id, task.pad_id, task.pad_id]])).tolist() == [[1, 1, 0, 0]]


def test_bleu_and_distinct_bigrams_against_hand_computed_values(tmp_path, example):
    from trainer.contract.config import load_config
    from trainer.contract.registry import load_task
    from trainer.tasks.sequence_metrics import mean_bleu

    sentence = "return the value of the named attribute".split()
    assert mean_bleu([sentence], lambda _: [sentence]) == pytest.approx(1.0)
    # one of two hypotheses matches a reference exactly; the other shares no word with any
    other = "zebra quartz".split()
    assert mean_bleu([sentence, other], lambda _: [sentence]) == pytest.approx(0.5, abs=1e-3)
    # Self-BLEU: two identical texts rate each other 1; a lone text has no references
    assert mean_bleu([sentence, sentence], lambda i: [[sentence, sentence][1 - i]]) == pytest.approx(1.0)
    assert mean_bleu([sentence], lambda i: []) == 0.0

    task = load_task(load_config(write_text_run(tmp_path, example["gpt2"])))
    eos = task.eos_id
    generated = torch.tensor([[5, 6, 7, 8, eos, -1], [5, 6, 7, eos, -1, -1]])
    outputs = {
        "nll_test": torch.tensor([1.0, 3.0]),
        "d_real": torch.tensor([1.0, -1.0]),
        "d_fake": torch.tensor([-1.0, -1.0]),
        "length": torch.tensor([5.0, 4.0]),
        "generated": generated,
    }
    metrics = task.eval_metrics(outputs)
    # bigrams: (5,6) (6,7) (7,8) (8,eos) and (5,6) (6,7) (7,eos): 5 distinct of 7
    assert metrics["distinct2"] == pytest.approx(5 / 7)
    assert metrics["nll_test"] == 2.0 and metrics["mean_length"] == 4.5 and metrics["d_accuracy"] == 0.75


@pytest.mark.timeout(300)
def test_bfloat16_weights_with_gradient_checkpointing(tmp_path, example):
    """model.dtype bfloat16 and model.gradient_checkpointing: a run trains, and exports bfloat16."""
    from safetensors import safe_open

    model = {"dtype": "bfloat16", "gradient_checkpointing": True}
    config = write_text_run(tmp_path, example["llama"], {"model": model, "training": {"max_steps": 2}})
    assert main(["--config", str(config), "--device", "cpu"]) == 0
    train = records(tmp_path / "out", "train")
    assert all(math.isfinite(r["g_loss"]) and math.isfinite(r["d_loss"]) for r in train)
    with safe_open(str(tmp_path / "out" / "final" / "generator" / "model.safetensors"), "pt") as weights:
        assert {weights.get_tensor(key).dtype for key in weights.keys()} == {torch.bfloat16}


@pytest.mark.timeout(300)
def test_prompted_generation_continues_real_texts_and_trains_only_what_it_chose(tmp_path, example):
    from trainer.contract.config import load_config
    from trainer.contract.registry import load_task
    from trainer.contract.task import Penalties

    options = {"prompt_len": 3, "mle_weight": 0.5}
    config = write_text_run(tmp_path, example["gpt2"], {"task_options": options, "training": {"max_steps": 2}})
    task = load_task(load_config(config))
    generator, discriminator = task.build_generator(), task.build_discriminator()
    dataset = task.train_dataset()
    assert min(len(row) for row in dataset["input_ids"]) > 3
    batch = task.collate([dataset[i] for i in range(4)])
    rng = torch.Generator().manual_seed(0)
    with torch.no_grad():
        fake = task.generate(generator, 4, rng, batch)
        advantage, _ = task._advantages(fake, discriminator)
    assert torch.equal(fake[:, :3], batch["input_ids"][:, :3])
    assert advantage[:, :3].abs().sum() == 0 and advantage[:, 3:].abs().sum() > 0
    # the discriminator's fake examples are the generated positions only
    loss, parts = task.discriminator_loss(discriminator, batch["input_ids"], fake, rng, Penalties())
    scores = task.prefix_scores(discriminator, torch.cat(task_pad(task, batch["input_ids"], fake)))
    fake_scores = scores[4:][task.generated_mask(task_pad(task, batch["input_ids"], fake)[1]).bool()]
    assert float(parts["d_fake"]) == pytest.approx(float(fake_scores.mean()), rel=1e-5)

    assert main(["--config", str(config), "--device", "cpu"]) == 0
    samples = (tmp_path / "out" / "samples" / "step-0000002.txt").read_text().splitlines()
    prompts = task.decode([row[:3] for row in task.eval_dataset()["input_ids"][:3]])
    assert all(sample.startswith(prompt) for sample, prompt in zip(samples, prompts, strict=True))


def task_pad(task, real, fake):
    from trainer.tasks.sequence_objectives import pad_right

    return pad_right([real, fake], task.pad_id)


def test_every_local_format_reads_the_same_texts(tmp_path):
    """text (a text per line), json, jsonl, csv and parquet, with a column of another name."""
    import datasets

    from trainer.tasks.text_data import read_texts

    texts = ["first text, with a comma", "second text", 'third "quoted" text']
    (tmp_path / "texts.txt").write_text("".join(t + "\n" for t in texts))
    (tmp_path / "texts.jsonl").write_text("".join(json.dumps({"body": t, "id": i}) + "\n" for i, t in enumerate(texts)))
    (tmp_path / "texts.json").write_text(json.dumps([{"body": t} for t in texts]))
    table = datasets.Dataset.from_dict({"body": texts, "id": [0, 1, 2]})
    table.to_csv(str(tmp_path / "texts.csv"), index=False)
    table.to_parquet(str(tmp_path / "texts.parquet"))
    for suffix in ("txt", "jsonl", "json", "csv", "parquet"):
        read = read_texts([str(tmp_path / f"texts.{suffix}")], "body", tmp_path / "cache")
        assert read.column_names == ["text"] and read["text"] == texts, suffix
    both = read_texts([str(tmp_path / "texts.txt"), str(tmp_path / "texts.csv")], "body", tmp_path / "cache")
    assert both["text"] == texts + texts


def test_prefix_returns_do_not_pay_for_length():
    """A token's return is the discounted mean of the ratings of the prefixes it starts: a
    sequence that ends early, rated as well at every prefix as a longer one, earns as much at
    every position (a discounted sum paid length, and texts grew to the token limit)."""
    from trainer.tasks.sequence_objectives import prefix_returns

    ratings = torch.tensor([[1.0, 0.0, 1.0, 0.0], [0.6, 0.6, 0.6, 0.6], [0.6, 0.6, 0.0, 0.0]])
    mask = torch.tensor([[1.0, 1.0, 1.0, 1.0], [1.0, 1.0, 1.0, 1.0], [1.0, 1.0, 0.0, 0.0]])
    returns = prefix_returns(ratings * mask, mask, discount=0.5)
    weights = [1 + 0.5 + 0.25 + 0.125, 1 + 0.5 + 0.25, 1 + 0.5, 1]
    assert returns[0].tolist() == pytest.approx([1.25 / weights[0], 0.5 / weights[1], 1 / weights[2], 0.0])
    assert returns[1].tolist() == pytest.approx([0.6] * 4)
    assert returns[2, :2].tolist() == pytest.approx([0.6, 0.6]) and returns[2, 2:].abs().sum() == 0
    # fixed-length sequences (no mask): the discounted sum, as before
    assert prefix_returns(ratings[:1], None, discount=0.5)[0, 0] == pytest.approx(1.25)


def test_the_example_is_the_same_every_time_it_is_written(tmp_path):
    """The README's figures start from the example's untrained model: its weights come from the
    seed, not from whatever the random state was."""
    torch.manual_seed(1)
    first = write_text_example(tmp_path / "a", vocab_size=300, eval_texts=5)
    torch.manual_seed(2)
    second = write_text_example(tmp_path / "b", vocab_size=300, eval_texts=5)
    for name in ("model.safetensors", "tokenizer.json", "config.json"):
        assert (first["model"] / name).read_bytes() == (second["model"] / name).read_bytes(), name
    assert first["train"].read_bytes() == second["train"].read_bytes()


def test_reinforce_advantages_by_hand():
    from trainer.tasks.sequence_objectives import reinforce_advantages

    # whole sequences rated 0 and ln 3: rewards 0.5 and 0.75 against their mean 0.625
    advantage, reward = reinforce_advantages(torch.tensor([0.0, math.log(3)]), None, 0.9, normalize=False)
    assert torch.allclose(advantage, torch.tensor([[-0.125], [0.125]])) and float(reward) == pytest.approx(0.625)
    advantage, _ = reinforce_advantages(torch.tensor([0.0, math.log(3)]), None, 0.9, normalize=True)
    assert torch.allclose(advantage, torch.tensor([[-1.0], [1.0]]) / math.sqrt(2), atol=1e-5)  # std 0.125 * sqrt(2)
    # every prefix rated, the first sequence ended after 2 tokens: its third position is padding,
    # which has no advantage and no part in the third position's baseline (the second's 0.75)
    ratings = torch.tensor([[0.0, 0.0, 5.0], [math.log(3)] * 3])
    mask = torch.tensor([[1.0, 1.0, 0.0], [1.0, 1.0, 1.0]])
    advantage, reward = reinforce_advantages(ratings, mask, 0.5, normalize=False)
    assert torch.allclose(advantage, torch.tensor([[-0.125, -0.125, 0.0], [0.125, 0.125, 0.0]]))
    assert float(reward) == pytest.approx((0.5 * 2 + 0.75 * 3) / 5)


def test_the_kl_estimate_by_hand():
    from trainer.tasks.sequence_objectives import kl_estimate

    # a token the generator gives 0.5 and the reference 0.25: r = log(0.25 / 0.5), exp(r) - r - 1
    estimate = kl_estimate(torch.tensor([math.log(0.5), math.log(0.3)]), torch.tensor([math.log(0.25), math.log(0.3)]))
    assert torch.allclose(estimate, torch.tensor([0.5 + math.log(2) - 1, 0.0]))


def test_run_text_s_frontier_needs_temperature_1(tmp_path, capsys):
    # the table's stage-1 row is stage 1 at temperature 1, read off its frontier: a frontier
    # without it is refused before anything runs
    sys.path.insert(0, str(ROOT / "scripts"))
    import run_text

    with pytest.raises(SystemExit) as stop:
        run_text.main(["--frontier", "1.1", "0.9", "--output-dir", str(tmp_path / "out")])
    assert stop.value.code == 2
    assert "--frontier 1.1 0.9: the temperatures must include 1" in capsys.readouterr().err
    assert not (tmp_path / "out").exists()
    with pytest.raises(SystemExit):
        run_text.main(["--frontier", "1", "-0.5"])
    assert "-0.5 is not a positive number" in capsys.readouterr().err
