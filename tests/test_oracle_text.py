"""The oracle_text recipe: the oracle, stage 1 -> stage 2 end to end, eval gathering, resume."""

from __future__ import annotations

import json
import math
import re
from pathlib import Path
from typing import Any

import pytest
import torch
import yaml
from helpers import ROOT, check, deep_merge, launch, records, tensorboard_text
from safetensors.torch import load_file

from trainer.commands.cli import main
from trainer.commands.frontier import FRONTIER_TEMPERATURES, Curve, Point, judge, verdict_line
from trainer.commands.oracle_report import ORACLE_RESULTS
from trainer.tasks.oracle import OracleLSTM

REFERENCE_ORACLE = ROOT.parent / "shared" / "data" / "seqgan_oracle.safetensors"
STAGE1 = ROOT / "scripts" / "train_stage1.py"
STAGE2 = ROOT / "scripts" / "train_stage2.py"
VOCAB, LENGTH, EVAL_SIZE = 50, 8, 37

TINY_MODEL = {
    "model_type": "gpt2",
    "vocab_size": VOCAB + 1,
    "n_positions": 16,
    "n_embd": 16,
    "n_layer": 1,
    "n_head": 2,
    "resid_pdrop": 0.0,
    "embd_pdrop": 0.0,
    "attn_pdrop": 0.0,
}


def write_oracle_run(tmp: Path, config: dict[str, Any] | None = None, name: str = "train.yaml") -> Path:
    """A tiny oracle_text run: vocabulary 50, length 8, one-layer GPT-2 models."""
    tmp.mkdir(parents=True, exist_ok=True)
    (tmp / "generator.yaml").write_text(yaml.safe_dump(TINY_MODEL))
    (tmp / "discriminator.yaml").write_text(yaml.safe_dump(TINY_MODEL))
    base: dict[str, Any] = {
        "task": "oracle_text",
        "output_dir": str(tmp / "out"),
        "model": {
            "generator_config": str(tmp / "generator.yaml"),
            "discriminator_config": str(tmp / "discriminator.yaml"),
        },
        "task_options": {
            "vocab_size": VOCAB,
            "seq_len": LENGTH,
            "oracle_embed_dim": 8,
            "oracle_hidden_dim": 8,
            "mle_weight": 0.5,
        },
        "training": {
            "max_steps": 4,
            "batch_size": 8,
            "eval_every": 2,
            "save_every": 2,
            "log_every": 1,
            "seed": 5,
            "mixed_precision": "no",
            "log_with": ["none"],
        },
        "optim": {"generator": {"lr": 1e-3}, "discriminator": {"lr": 1e-3}},
        "eval": {"batch_size": 8, "prefix_len": 2},
        "data": {"train_size": 128, "eval_size": EVAL_SIZE, "cache_dir": str(tmp / "cache")},
        "stage1": {
            "generator": {"training.best_metric": "nll_test"},
            "discriminator": {"training.best_metric": "d_accuracy", "training.best_mode": "max"},
        },
    }
    path = tmp / name
    path.write_text(yaml.safe_dump(deep_merge(base, config or {})))
    return path


@torch.no_grad()
def mean_entropy(oracle: OracleLSTM, sequences: torch.Tensor) -> float:
    """The mean entropy of the oracle's next-token distributions along ``sequences``: for its own
    samples, an estimate of its entropy rate independent of their log-probabilities."""
    total = sum(float(-(log_p.exp() * log_p).sum().double()) for log_p in oracle._walk(sequences))
    return total / sequences.numel()


@pytest.mark.timeout(120)
def test_oracle_scores_its_own_samples_near_its_entropy():
    oracle = OracleLSTM.seeded(0)
    samples = oracle.sample(500, 20, torch.Generator().manual_seed(1))
    nll = float(-oracle.token_log_probs(samples).double().mean())
    entropy = mean_entropy(oracle, samples)
    uniform = math.log(5000)
    assert abs(nll - entropy) < 0.15, (nll, entropy)
    assert nll < uniform - 2, (nll, uniform)  # a uniform model scores log(5000) = 8.52
    random_tokens = torch.randint(0, 5000, (200, 20), generator=torch.Generator().manual_seed(2))
    assert float(-oracle.token_log_probs(random_tokens).mean()) > uniform - 1


@pytest.mark.timeout(300)
@pytest.mark.skipif(not REFERENCE_ORACLE.is_file(), reason="the SeqGAN oracle file is not present")
def test_reference_oracle_scores_its_samples_at_5_75():
    oracle = OracleLSTM.from_file(REFERENCE_ORACLE)
    samples = oracle.sample(2000, 20, torch.Generator().manual_seed(0))
    nll = float(-oracle.token_log_probs(samples).double().mean())
    assert abs(nll - 5.75) < 0.05, nll


@pytest.mark.timeout(600)
@pytest.mark.parametrize("processes", [1, 2])
def test_stage1_then_stage2(tmp_path, processes):
    stage1 = write_oracle_run(tmp_path, {"output_dir": str(tmp_path / "stage1")}, "stage1.yaml")
    check(launch(["--config", str(stage1), "--device", "cpu"], processes, script=STAGE1, timeout=300))
    for role in ("generator", "discriminator"):
        assert (tmp_path / "stage1" / "best" / role / "config.json").is_file()
    mle = records(tmp_path / "stage1" / "generator_mle", "train")
    assert mle and all("g_loss" in r and "d_loss" not in r for r in mle)
    d_only = records(tmp_path / "stage1", "train")
    assert d_only and all("d_loss" in r and "g_loss" not in r for r in d_only)

    init = {role: str(tmp_path / "stage1" / "best" / role) for role in ("generator", "discriminator")}
    stage2 = write_oracle_run(tmp_path, {"output_dir": str(tmp_path / "stage2"), "init": init}, "stage2.yaml")
    check(launch(["--config", str(stage2), "--device", "cpu"], processes, script=STAGE2, timeout=300))
    evals = records(tmp_path / "stage2", "eval")
    assert [r["step"] for r in evals] == [2, 4]
    for record in evals:
        assert record["world_size"] == processes
        assert record["num_samples"] == EVAL_SIZE
        assert 0 < record["nll_oracle"] < 3 * math.log(VOCAB)
        assert 0 < record["nll_test"] < 3 * math.log(VOCAB)
        assert 0 <= record["d_accuracy"] <= 1
    train = records(tmp_path / "stage2", "train")
    assert all({"reward", "policy_loss", "nll_real"} <= set(r) for r in train)


@pytest.mark.timeout(300)
def test_generated_sequences_of_different_lengths_are_gathered_exactly(tmp_path):
    config = write_oracle_run(tmp_path, {"task": "fixture_tasks:RankLengthOracle", "training": {"max_steps": 2}})
    check(launch(["--config", str(config), "--device", "cpu"], 2, timeout=200))
    for record in records(tmp_path / "out", "eval"):
        assert record["world_size"] == 2
        assert record["num_samples"] == record["generated_rows"] == EVAL_SIZE
        prefix_len = 2
        assert record["generated_width"] == LENGTH - prefix_len  # rank 0's full length
        assert record["shortest"] == LENGTH - prefix_len - 1  # rank 1's, padded
    # The main process read (and cached) the data before the other rank began to.
    reads = {r: json.loads((tmp_path / "out" / f"read-rank{r}.json").read_text()) for r in (0, 1)}
    assert reads[0]["end"] <= reads[1]["start"], reads


@pytest.mark.timeout(300)
def test_saved_generator_loads_with_the_same_logits_and_resume_is_exact(tmp_path, caplog):
    """Also: the tied output embedding is saved once without accelerate's alarming notice, and
    is still tied after a resume."""
    from transformers import AutoModelForCausalLM

    from trainer.contract.config import load_config
    from trainer.training.loop import Trainer

    config = write_oracle_run(tmp_path, {"training": {"max_steps": 4, "save_every": 2, "best_metric": "nll_oracle"}})
    trainer = Trainer(load_config(config), device="cpu")
    trainer.fit()
    out = tmp_path / "out"
    loaded = AutoModelForCausalLM.from_pretrained(out / "final" / "generator").eval()
    trained = trainer.g.unwrapped.eval()
    tokens = torch.randint(0, VOCAB + 1, (3, LENGTH))
    with torch.no_grad():
        assert torch.equal(loaded(input_ids=tokens).logits, trained(input_ids=tokens).logits)
    assert (out / "best" / "generator" / "config.json").is_file()

    first = {r: load_file(out / "final" / r / "model.safetensors") for r in ("generator", "discriminator")}
    (out / "metrics.jsonl").unlink()
    resumed = Trainer(load_config(config), device="cpu", resume=str(out / "checkpoints" / "step-0000002"))
    resumed.fit()
    for role, tensors in first.items():
        again = load_file(out / "final" / role / "model.safetensors")
        assert again.keys() == tensors.keys()
        for key in tensors:
            assert torch.equal(again[key], tensors[key]), f"{role}.{key} differs after resume"
    generator = resumed.g.unwrapped
    assert generator.lm_head.weight is generator.transformer.wte.weight
    assert not [r.getMessage() for r in caplog.records if "shared tensor" in r.getMessage()]


@pytest.mark.timeout(120)
def test_samples_reach_the_trackers_as_text_each_eval(tmp_path):
    config = write_oracle_run(tmp_path, {"training": {"log_with": ["tensorboard"]}})
    assert main(["--config", str(config), "--device", "cpu"]) == 0
    logged = tensorboard_text(tmp_path / "out", "samples")
    written = [(tmp_path / "out" / "samples" / f"step-{step:07d}.txt").read_text() for step in (2, 4)]
    assert logged == ["\n\n".join(text.splitlines()) for text in written]


@pytest.mark.timeout(120)
def test_the_data_cache_is_written_once_and_read_back(tmp_path, monkeypatch):
    from trainer.contract.config import load_config
    from trainer.contract.registry import load_task

    config = write_oracle_run(tmp_path)
    first = load_task(load_config(config)).train_dataset().columns["input_ids"]
    entries = sorted(p.name for p in (tmp_path / "cache").iterdir())
    assert len(entries) == 1 and not entries[0].startswith(".partial")

    def no_sampling(*args, **kwargs):
        raise AssertionError("the cached data was sampled again")

    monkeypatch.setattr(OracleLSTM, "sample", no_sampling)
    again = load_task(load_config(config)).train_dataset().columns["input_ids"]
    assert torch.equal(first, again)
    assert first.shape == (128, LENGTH) and int(first.max()) < VOCAB


@pytest.mark.timeout(120)
@pytest.mark.parametrize(
    ("model", "message"),
    [
        ({"vocab_size": 40}, "key 'vocab_size' is 40; it must be task_options.vocab_size + 1 = 51"),
        ({"n_embed": 16}, "unknown key 'n_embed' for a gpt2 config; did you mean 'n_embd'?"),
        ({"model_type": "gtp2"}, "key 'model_type' is 'gtp2', not a transformers model type (e.g. gpt2); did you mean"),
    ],
)
def test_bad_model_configs_name_file_and_key(tmp_path, capsys, model, message):
    config = write_oracle_run(tmp_path)
    (tmp_path / "generator.yaml").write_text(yaml.safe_dump({**TINY_MODEL, **model}))
    assert main(["--config", str(config), "--device", "cpu"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1
    assert str(tmp_path / "generator.yaml") in err[0] and message in err[0], err[0]


@pytest.mark.timeout(120)
def test_prefix_rewards_refuse_a_classifier_without_a_per_position_head(tmp_path, capsys):
    bert = {"model_type": "bert", "vocab_size": VOCAB + 1, "hidden_size": 16, "num_hidden_layers": 1}
    bert |= {"num_attention_heads": 2, "intermediate_size": 32, "max_position_embeddings": 16}
    config = write_oracle_run(tmp_path)
    (tmp_path / "discriminator.yaml").write_text(yaml.safe_dump(bert))
    assert main(["--config", str(config), "--device", "cpu"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "a BertForSequenceClassification has no per-position 'score' head" in err[0], err
    assert "set task_options.reward: sequence" in err[0]


@pytest.mark.timeout(120)
def test_a_non_positive_eval_temperature_names_the_key(tmp_path, capsys):
    config = write_oracle_run(tmp_path, {"task_options": {"eval_temperature": 0.0}})
    assert main(["--config", str(config), "--device", "cpu"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "key 'task_options.eval_temperature' must be positive" in err[0], err


def frontier_lines(stdout: str) -> tuple[list[Curve], list[str]]:
    """The curves a main job printed, and its lines from the seeds' verdicts to the end."""
    after = stdout.split("the frontier (the generators at these temperatures, no further training):\n")[1]
    table, _, verdicts = after.partition("\n\n")
    points: dict[str, list[Point]] = {}
    for line in table.splitlines()[1:]:
        *name, temperature, oracle, test = line.split()
        points.setdefault(" ".join(name), []).append(Point(float(temperature), float(test), float(oracle)))
    return [Curve(name, tuple(p)) for name, p in points.items()], verdicts.strip().splitlines()


@pytest.mark.timeout(400)
def test_main_job_runs_both_stages_and_prints_the_table_and_the_frontier(tmp_path):
    stage1 = write_oracle_run(tmp_path, {"training": {"max_steps": 2}}, "stage1.yaml")
    stage2 = write_oracle_run(tmp_path, {"training": {"max_steps": 2}}, "stage2.yaml")
    args = ["--stage1-config", str(stage1), "--stage2-config", str(stage2), "--output-dir", str(tmp_path / "job")]
    args += ["--stage2-seeds", "2", "--frontier", "1.2", "1", "0.8"]
    result = check(launch([*args, "--device", "cpu"], 1, script=ROOT / "scripts" / "run_oracle.py", timeout=300))
    out = result.stdout.strip().splitlines()
    header = next(i for i, line in enumerate(out) if line.split() == ["nll_oracle", "nll_test", "d_accuracy"])
    lines = out[header : header + 6]
    assert lines[1].startswith("stage 1") and lines[2].startswith("stage 2")
    assert lines[2].endswith("mean of seeds 5 6")  # write_oracle_run's seed is 5
    assert lines[3].startswith("  seed 5") and lines[4].startswith("  seed 6") and lines[5].startswith("change")
    seeds = [float(line.split()[2]) for line in lines[3:5]]
    assert float(lines[2].split()[2]) == pytest.approx(sum(seeds) / 2, abs=1e-4)  # the mean of nll_oracle
    for run in ("stage2", "stage2-seed-6"):
        for role in ("generator", "discriminator"):
            assert (tmp_path / "job" / run / "final" / role / "config.json").is_file()
    assert yaml.safe_load((tmp_path / "job" / "stage2-seed-6" / "config.yaml").read_text())["training"]["seed"] == 6
    stage2_config = yaml.safe_load((tmp_path / "job" / "stage2" / "config.yaml").read_text())
    assert stage2_config["init"]["generator"] == str(tmp_path / "job" / "stage1" / "best" / "generator")

    # The maximum-likelihood baseline: stage 2's run (steps, batch, start) by maximum likelihood.
    mle_config = yaml.safe_load((tmp_path / "job" / "stage2-mle" / "config.yaml").read_text())
    assert mle_config["training"]["objective"] == "mle"
    for key in ("max_steps", "batch_size", "seed"):
        assert mle_config["training"][key] == stage2_config["training"][key]
    assert mle_config["init"]["generator"] == stage2_config["init"]["generator"]
    mle_train = records(tmp_path / "job" / "stage2-mle", "train")
    assert mle_train[-1]["step"] == 2 and all("d_loss" not in r for r in mle_train)

    # Each seed against the frontier of both curves; the verdicts are the printed curves'.
    curves, verdicts = frontier_lines(result.stdout)
    assert [c.name for c in curves] == ["stage 1", "stage 1 + maximum likelihood"]
    assert all([p.temperature for p in c.points] == [1.2, 1.0, 0.8] for c in curves)
    # At temperature 1 the stage-1 curve is stage 1's own eval (the table's stage-1 row).
    assert curves[0].points[1].quality == pytest.approx(float(lines[1].split()[2]), abs=1e-4)
    beyond = 0
    for seed, line, metrics in zip((5, 6), verdicts, lines[3:5], strict=False):
        quality, diversity = float(metrics.split()[2]), float(metrics.split()[3])
        verdict = judge(curves, Point(1.0, diversity, quality))
        expected = verdict_line(verdict, "nll_oracle", "nll_test")
        assert line.startswith(f"seed {seed}: frontier: stage 2 nll_oracle ")
        # the table's metrics have 4 decimals, the printed verdict was judged on the full values
        printed, recomputed = (re.search(r"frontier at [\d.]+: ([\d.]+); beyond: (\w+)$", x) for x in (line, expected))
        assert float(printed.group(1)) == pytest.approx(float(recomputed.group(1)), abs=2e-4), (line, expected)
        assert printed.group(2) == recomputed.group(2), (line, expected)
        beyond += verdict.beyond
    assert verdicts[2] == f"plot: {tmp_path / 'job' / 'frontier.png'}"
    assert (tmp_path / "job" / "frontier.png").read_bytes()[:4] == b"\x89PNG"
    assert verdicts[-2] == f"beyond the frontier: {beyond} of 2 seeds"
    assert verdicts[-1].startswith("what this means: ") and verdicts[-1].endswith(f"tried: {ORACLE_RESULTS}")


@pytest.mark.timeout(300)
def test_temperature_frontier_matches_the_eval_and_samples_at_its_temperature(tmp_path):
    import subprocess
    import sys

    from trainer.contract.config import load_config
    from trainer.contract.registry import load_task
    from trainer.tasks.sampling import inverse_cdf_sample
    from trainer.training.loop import Trainer

    config = write_oracle_run(tmp_path, {"training": {"max_steps": 2}})
    Trainer(load_config(config), device="cpu").fit()
    last_eval = records(tmp_path / "out", "eval")[-1]
    generator_dir = str(tmp_path / "out" / "final" / "generator")

    script = ROOT / "research" / "oracle_frontier.py"
    args = [sys.executable, str(script), generator_dir, "--config", str(config), "--temperatures", "1", "0.5"]
    result = subprocess.run(args, capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert result.returncode == 0, result.stderr
    rows = [line.split() for line in result.stdout.strip().splitlines()[1:]]
    assert [row[0] for row in rows] == ["1.00", "0.50"]
    # At temperature 1 the frontier is the run's own final eval of the same weights.
    assert float(rows[0][1]) == pytest.approx(last_eval["nll_oracle"], abs=1e-4)
    assert float(rows[0][2]) == pytest.approx(last_eval["nll_test"], abs=1e-4)

    # At 0.5 every generated token is drawn from softmax(logits / 0.5): checked on the first one.
    task = load_task(load_config(config, generator_config=generator_dir))
    generator = task.build_generator().eval()
    batch = task.eval_dataset().__getitems__(list(range(8)))
    prefix_len = 2
    with torch.no_grad():
        outputs = task.generator_eval(generator, batch, 0.5)
        prompt = torch.cat([torch.full((8, 1), VOCAB), batch["real"][:, :prefix_len]], dim=1)
        logits = generator(input_ids=prompt).logits[:, -1] / 0.5
        logits[:, VOCAB] = -float("inf")
        expected = inverse_cdf_sample(logits, batch["uniforms"][:, prefix_len])
        assert torch.equal(outputs["sequences"][:, prefix_len], expected)
        # nll_test at 0.5: the NLL of the real sequences under softmax(logits / 0.5).
        inputs = torch.cat([torch.full((8, 1), VOCAB), batch["real"][:, :-1]], dim=1)
        all_logits = generator(input_ids=inputs).logits / 0.5
        all_logits[..., VOCAB] = -float("inf")
        nll = -all_logits.log_softmax(-1).gather(2, batch["real"].unsqueeze(2)).squeeze(2).mean(1)
        assert torch.allclose(outputs["nll_test"], nll, atol=1e-5)
        # A run's eval with task_options.eval_temperature 0.5 scores the same.
        colder = load_task(load_config(config, {"task_options.eval_temperature": 0.5}, generator_config=generator_dir))
        evaluated = colder.eval_outputs(generator, colder.build_discriminator().eval(), batch)
        assert torch.equal(evaluated["nll_test"], outputs["nll_test"])
        assert torch.equal(evaluated["generated"], outputs["sequences"][:, prefix_len:])

    bad = subprocess.run([*args[:-2], "0"], capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert bad.returncode == 2 and "argument --temperatures: 0 is not a positive number" in bad.stderr, bad.stderr


@pytest.mark.timeout(400)
def test_bench_prints_both_stages_the_published_values_and_the_frontier_goal(tmp_path):
    from safetensors.torch import save_file

    oracle_file = tmp_path / "oracle.safetensors"
    save_file(dict(OracleLSTM.seeded(3, VOCAB, 8, 8).named_buffers()), str(oracle_file))
    stage1 = write_oracle_run(tmp_path, {"training": {"max_steps": 2}}, "stage1.yaml")
    stage2 = write_oracle_run(tmp_path, {"training": {"max_steps": 2}}, "stage2.yaml")
    configs = ["--stage1-config", str(stage1), "--stage2-config", str(stage2), "--stage2-seeds", "1"]
    args = [str(oracle_file), *configs, "--output-dir", str(tmp_path / "bench"), "--device", "cpu"]
    result = launch(args, 1, timeout=300, script=ROOT / "benchmarks" / "bench_oracle.py")
    assert "published nll_oracle" in result.stdout
    curves, verdicts = frontier_lines(result.stdout)
    assert [p.temperature for p in curves[0].points] == list(FRONTIER_TEMPERATURES)  # run_oracle's default
    met = verdicts[-2] == "beyond the frontier: 1 of 1 seeds"
    assert result.returncode == (0 if met else 1), result.stderr[-3000:]  # --goal


@pytest.mark.timeout(120)
@pytest.mark.parametrize(
    ("objective", "name"),
    [("mle", "stage 1: generator"), ("discriminator", "stage 1: discriminator"), ("adversarial", "stage 2")],
)
def test_the_progress_bar_names_the_stage(tmp_path, monkeypatch, objective, name):
    from tqdm.auto import tqdm

    from trainer.contract.config import load_config
    from trainer.training import loop, outputs

    bars = []

    def recording_bar(*args, **kwargs):
        bars.append(kwargs["desc"])
        return tqdm(*args, **{**kwargs, "disable": True})

    monkeypatch.setattr(outputs, "tqdm", recording_bar)
    config = write_oracle_run(tmp_path, {"training": {"objective": objective, "max_steps": 1}})
    loop.Trainer(load_config(config), device="cpu").fit()
    assert bars == [name]


@pytest.mark.timeout(180)
def test_the_command_line_beats_the_config_files_stage_sections(tmp_path, caplog):
    from trainer.commands.cli import main_stage1

    sections = {"generator": {"training.max_steps": 6}, "discriminator": {"training.max_steps": 6}}
    config = write_oracle_run(tmp_path, {"stage1": sections, "training": {"eval_every": 1}})
    # a stage section set on the command line is more specific than a general key there
    flags = ["--set", "training.max_steps=2", "--set", "stage1.discriminator.training.max_steps=3"]
    with caplog.at_level("INFO", logger="trainer"):
        assert main_stage1(["--config", str(config), "--device", "cpu", *flags]) == 0
    assert [r["step"] for r in records(tmp_path / "out" / "generator_mle", "eval")] == [1, 2]
    assert [r["step"] for r in records(tmp_path / "out", "eval")] == [1, 2, 3]
    said = [r.getMessage() for r in caplog.records if "stage1." in r.getMessage()]
    assert len(said) == 1 and "stage1.generator" in said[0] and "training.max_steps=2" in said[0], said


@pytest.mark.timeout(180)
def test_stage1_reads_each_config_file_once(tmp_path, monkeypatch):
    from trainer.commands.cli import main_stage1

    config = write_oracle_run(tmp_path, {"training": {"max_steps": 1, "eval_every": 1}})
    reads: dict[str, int] = {}
    read_text = Path.read_text

    def counting(path, *args, **kwargs):
        if path.suffix == ".yaml":
            reads[path.name] = reads.get(path.name, 0) + 1
        return read_text(path, *args, **kwargs)

    monkeypatch.setattr(Path, "read_text", counting)
    assert main_stage1(["--config", str(config), "--device", "cpu"]) == 0
    assert reads == {"train.yaml": 1, "generator.yaml": 1, "discriminator.yaml": 1}


@pytest.mark.timeout(120)
def test_a_config_dict_runs_like_its_file(tmp_path):
    from trainer.contract.config import load_config
    from trainer.training.loop import Trainer

    path = write_oracle_run(tmp_path, {"training": {"max_steps": 1, "eval_every": 1, "save_every": 1}})
    as_dict = yaml.safe_load(path.read_text())
    from_file = Trainer(load_config(path, {"output_dir": str(tmp_path / "file")}), device="cpu").fit()
    from_dict = Trainer(load_config(as_dict, {"output_dir": str(tmp_path / "dict")}), device="cpu").fit()
    assert from_dict == from_file and from_file["num_samples"] == EVAL_SIZE


@pytest.mark.timeout(120)
def test_d_oracle_corr_and_distinct2_by_hand(tmp_path):
    """d_oracle_corr: Pearson's r of the discriminator's rating of each generated sequence with
    its log-likelihood under the oracle (minus its nll_oracle); distinct2: distinct bigrams of
    the generated sequences over all; by hand on three sequences."""
    from trainer.contract.config import load_config
    from trainer.contract.registry import load_task

    task = load_task(load_config(write_oracle_run(tmp_path)))
    nll_oracle, d_fake = [3.0, 1.0, 2.0], [0.5, 2.0, -1.0]
    outputs = {
        "nll_oracle": torch.tensor(nll_oracle),
        "nll_test": torch.tensor([1.0, 1.0, 1.0]),
        "d_real": torch.tensor([9.0, -9.0, 4.0]),
        "d_fake": torch.tensor(d_fake),
        # bigrams (7, 7) x3, (7, 8), (8, 9), (9, 8), (8, 9): 4 distinct of 7
        "generated": torch.tensor([[7, 7, 7, 7], [7, 8, 9, 8], [8, 9, -1, -1]]),
    }
    quality = [-v for v in nll_oracle]
    mean_q, mean_d = sum(quality) / 3, sum(d_fake) / 3
    covariance = sum((q - mean_q) * (d - mean_d) for q, d in zip(quality, d_fake, strict=True))
    spread = math.sqrt(sum((q - mean_q) ** 2 for q in quality) * sum((d - mean_d) ** 2 for d in d_fake))
    metrics = task.eval_metrics(outputs)
    assert metrics["d_oracle_corr"] == pytest.approx(covariance / spread)  # 0.2774, not 0 nor +-1
    assert metrics["d_accuracy"] == pytest.approx(3 / 6)
    assert metrics["distinct2"] == pytest.approx(4 / 7)  # padding (-1) makes no bigram
    outputs["d_fake"] = torch.zeros(3)  # a rating that never changes tells nothing
    assert math.isnan(task.eval_metrics(outputs)["d_oracle_corr"])


def test_partial_correlation_is_the_correlation_of_what_the_given_variable_leaves():
    from trainer.commands.oracle_report import partial_correlation
    from trainer.tasks.sequence_metrics import pearson

    torch.manual_seed(0)
    given = torch.randn(200, dtype=torch.float64)
    x, y = given + torch.randn(200, dtype=torch.float64), 2 * given + torch.randn(200, dtype=torch.float64)

    def residual(v: torch.Tensor) -> torch.Tensor:  # v less its least-squares line on `given`
        design = torch.stack([torch.ones_like(given), given], dim=1)
        return v - design @ torch.linalg.lstsq(design, v.unsqueeze(1)).solution.squeeze(1)

    expected = pearson(residual(x), residual(y))
    assert abs(expected) < 0.2 < pearson(x, y)  # the shared part is what makes x and y correlate
    assert partial_correlation(x, y, given) == pytest.approx(expected, abs=1e-12)


@pytest.mark.timeout(300)
def test_oracle_discriminator_prints_each_correlation_over_all_samples_and_each_chunk(tmp_path):
    import subprocess
    import sys

    from trainer.contract.config import load_config
    from trainer.training.loop import Trainer

    config = write_oracle_run(tmp_path, {"training": {"max_steps": 2}})
    Trainer(load_config(config), device="cpu").fit()
    script = ROOT / "research" / "oracle_discriminator.py"
    args = [sys.executable, str(script), str(tmp_path / "out" / "final"), "--config", str(config)]
    done = subprocess.run([*args, "--samples", "60", "--chunk", "20"], capture_output=True, text=True, timeout=240)
    assert done.returncode == 0, done.stderr
    rows = done.stdout.splitlines()
    assert rows[0].startswith("60 sequences of the generator") and len(rows) == 5
    for row in rows[1:]:
        values = [float(v) for v in row.split(")")[-1].split()]
        assert len(values) == 4 and all(-1 <= v <= 1 for v in values)  # all 60, then 3 chunks of 20
    d_oracle, g_oracle, d_g, partial = (float(row.split(")")[-1].split()[0]) for row in rows[1:])
    assert rows[2].startswith("corr(generator's log-likelihood, oracle") and rows[4].startswith("partial corr")
    # the last row is what the first three make of it (they print 3 decimals)
    assert partial == pytest.approx((d_oracle - d_g * g_oracle) / math.sqrt((1 - d_g**2) * (1 - g_oracle**2)), abs=0.01)
    bad = subprocess.run([*args, "--samples", "10", "--chunk", "20"], capture_output=True, text=True, timeout=240)
    assert bad.returncode == 2 and "--chunk 20" in bad.stderr and len(bad.stderr.strip().splitlines()) == 1
