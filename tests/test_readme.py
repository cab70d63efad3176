"""The README and the pages of docs/ as a newcomer's path: every shell command they show is run
here (shrunk to a few steps by extra flags) or named with the test or script that runs it."""

from __future__ import annotations

import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
from helpers import ROOT, env, free_port, records

#: commands run elsewhere, and where
COVERED = {
    "python3 -m venv .venv && . .venv/bin/activate": ".ci/run",
    "pip install torch && pip install -e .": "a GPU machine's install (a CUDA build of torch, about 3 GB); .ci/run "
    "installs the CPU build and the package",
    "accelerate launch --config_file accelerate_configs/8gpu.yaml scripts/run_oracle.py --device cuda": "needs "
    "GPUs; the same launch on 2 CPU processes is run below",
    "python scripts/train_stage2.py --config examples/my_model.yaml --device cpu": "tests/test_docs.py trains "
    "examples/my_model.yaml on the offline text example",
    'pip install torch==2.13.0 && pip install -e ".[dev]"': ".ci/run",
    "python -m pytest -q -n 2 --dist worksteal": ".ci/run",
    "accelerate launch --config_file accelerate_configs/8gpu.yaml scripts/train_stage2.py "
    "--config configs/training/ring.yaml --device cuda": "needs GPUs; the same path on CPUs is run below",
    "accelerate launch --config_file accelerate_configs/8gpu.yaml scripts/doctor.py "
    "--config configs/training/ring.yaml --device cuda": "needs GPUs; tests/test_safety.py runs the doctor on CPUs",
    "python scripts/train_stage2.py --config configs/training/ring.yaml --device cpu "
    "--resume outputs/ring/checkpoints/step-0003000": "tests/test_resume.py resumes from a named checkpoint",
    "python benchmarks/bench_oracle.py ../shared/data/seqgan_oracle.safetensors [--full]": "a benchmark (5 minutes "
    "and more); tests/test_oracle_text.py runs it on a tiny oracle and tiny configs",
    "torchrun --standalone --nproc_per_node 8 --max-restarts 3 scripts/train_stage2.py "
    "--config configs/training/ring.yaml --device cuda --resume latest": "needs GPUs; scripts/fault_matrix.py "
    "(restart_torchrun, run by tests/test_faults.py) restarts the same command on CPUs",
    "accelerate launch --config_file accelerate_configs/8gpu.yaml --max_restarts 3 scripts/train_stage2.py "
    "--config configs/training/ring.yaml --device cuda --resume latest": "needs GPUs; scripts/fault_matrix.py "
    "(restart_accelerate, run by tests/test_faults.py) restarts the same command on CPUs",
    "torchrun --nnodes 1:2 --nproc_per_node 8 --rdzv_backend c10d --rdzv_endpoint HOST:29400 --rdzv_id JOB "
    "--max-restarts 3 scripts/train_stage2.py --config configs/training/ring.yaml --device cuda --resume latest": (
        "needs GPUs and nodes; scripts/fault_matrix.py (two_nodes_elastic_go_on, run by tests/test_faults.py) "
        "loses one of two simulated nodes under the same command on CPUs"
    ),
    "accelerate launch --config_file accelerate_configs/8gpu_fsdp.yaml scripts/train_stage2.py "
    "--config configs/training/text_stage2.yaml --device cuda": "needs GPUs; the cpu_fsdp.yaml rehearsal is run "
    "below, and tests/test_fsdp.py trains the text recipe's models under it",
    "python benchmarks/bench_fsdp.py": "a benchmark (11 minutes); tests/test_bench.py runs it at the tiny size",
    "bash benchmarks/check_floors.sh": "not in CI: it installs torch 2.6 (a 3 GB CUDA build); the README "
    "records its last result",
    'pip install -e ".[bench]"': ".ci/run installs the dev extra, which holds the bench extra's TRL",
    "python benchmarks/bench_text.py": "a benchmark (minutes); tests/test_bench.py runs it at the tiny size "
    "through scripts/gpu_check.sh",
    "bash scripts/gpu_check.sh": "needs a GPU; tests/test_bench.py runs it with DEVICE=cpu",
    'pip install -e ".[peft]"': ".ci/run installs the dev extra, which holds the peft extra's library",
    "python scripts/run_text.py --device cpu --stage2-config configs/training/text_stage2_spin.yaml": "the ddo "
    "command's path (test_readme_text_table); tests/test_text.py trains spin on texts",
    "python scripts/run_text.py --device cpu --seeds 0": "scripts/gpu_check.sh's part 3, which tests/test_bench.py "
    "runs with DEVICE=cpu and checks; test_readme_text_table runs its ddo form",
    "python benchmarks/bench_peft.py": "a benchmark (an hour on a 2-core CPU); tests/test_bench.py runs it at the "
    "tiny size",
    "python benchmarks/bench_peft.py --checkpointing": "a benchmark; tests/test_bench.py runs it at the tiny size",
    "torchrun --nnodes 2 --nproc_per_node 8 --rdzv_backend c10d --rdzv_endpoint HOST:29400 --rdzv_id JOB "
    "scripts/train_stage2.py --config configs/training/stage2.yaml --device cuda": "needs GPUs and nodes; the fault "
    "matrix's two_nodes rows (tests/test_faults.py) run two simulated nodes under these flags on CPUs",
    "sbatch examples/slurm/stage2.sbatch": "needs SLURM; tests/test_slurm.py runs the script with stand-ins for srun "
    "and scontrol",
    '--8<-- "examples/slurm/stage2.sbatch"': "the script's text, included in the page; tests/test_slurm.py runs it",
    "python -m trainer.commands.reference": "tests/test_docs.py makes each page and compares it with docs/reference/",
    "PYTHONPATH=examples/own_task accelerate launch --config_file accelerate_configs/8gpu.yaml --num_processes 2 "
    "--mixed_precision no scripts/train_stage2.py --config examples/own_task/two_peaks.yaml --device cpu": (
        "tests/test_custom_task.py"
    ),
}

#: the text recipe's example, run in order by test_readme_text_example
TEXT_EXAMPLE = "python scripts/make_text_example.py outputs/text_example"
TEXT_STAGE1 = "python scripts/train_stage1.py --config configs/training/text_stage1.yaml --device cpu"
TEXT_STAGE2 = (
    "accelerate launch --config_file accelerate_configs/8gpu.yaml --num_processes 2 --mixed_precision no "
    "scripts/train_stage2.py --config configs/training/text_stage2.yaml --device cpu"
)

TEXT_DDO = "python scripts/run_text.py --device cpu --stage2-config configs/training/text_stage2_ddo.yaml"
#: the text recipe at a tiny size: a few steps, a small eval
TEXT_TINY = [
    "--set=training.max_steps=2",
    "--set=training.eval_every=2",
    "--set=stage1.discriminator.training.max_steps=2",
    "--set=eval.batch_size=50",
    "--set=task_options.bleu_samples=20",
]

#: run on the stage-1 generator of test_readme_stage1_then_stage2_alone
FRONTIER = "python research/oracle_frontier.py outputs/oracle/stage1/best/generator"
ORACLE_DISCRIMINATOR = "python research/oracle_discriminator.py outputs/oracle/stage1/best"
RING_DEBUG = ["--debug"]
#: oracle_text at a tiny size: a few steps, a small corpus
ORACLE_TINY = [
    "--set=data.train_size=256",
    "--set=data.eval_size=40",
    "--set=training.max_steps=2",
    "--set=training.eval_every=2",
    "--set=stage1.generator.training.max_steps=2",
    "--set=stage1.discriminator.training.max_steps=2",
]

#: a PacGAN config at a few steps (the later --set wins)
PACGAN_TINY = [
    "--set=training.max_steps=4",
    "--set=training.eval_every=2",
    "--set=training.save_every=2",
    "--set=data.train_size=4000",
    "--set=eval.batch_size=500",
]

#: mixture_seeds at a tiny size: one seed, a few steps (its variant runs too)
MIXTURE_TINY = ["--seeds", "0", "--set", "training.max_steps=4", "--set", "training.eval_every=2"]

#: commands run here: the extra arguments that shrink them (an output directory is added)
RUN = {
    'python research/mixture_seeds.py configs/training/ring.yaml --variant "no EMA:training.ema_decay=0" --jobs 2': (
        MIXTURE_TINY
    ),
    'python research/mixture_seeds.py configs/training/grid.yaml --variant "no EMA:training.ema_decay=0" --jobs 2': (
        MIXTURE_TINY
    ),
    "python research/mixture_seeds.py configs/training/ring_pacgan.yaml --set training.max_steps=20000 "
    "--output-dir outputs/pacgan_short/ring": [*MIXTURE_TINY, "--set", "data.train_size=4000"],
    "python research/mixture_seeds.py configs/training/grid_pacgan.yaml --set training.max_steps=40000 --jobs 2 "
    "--output-dir outputs/pacgan_short/grid": [*MIXTURE_TINY, "--set", "data.train_size=4000"],
    "python scripts/run_oracle.py --device cpu": ORACLE_TINY,
    "python scripts/run_oracle.py --device cpu --stage2-config configs/training/stage2_ddo.yaml": ORACLE_TINY,
    "python scripts/run_oracle.py --device cpu --stage2-config configs/training/stage2_spin.yaml": ORACLE_TINY,
    "accelerate launch --config_file accelerate_configs/8gpu.yaml --num_processes 2 --mixed_precision no "
    "scripts/run_oracle.py --device cpu": ORACLE_TINY,
    "python scripts/train_stage2.py --config configs/training/ring.yaml --device cpu": RING_DEBUG,
    "python scripts/train_stage2.py --config configs/training/ring_pacgan.yaml --device cpu "
    "--set training.max_steps=20000": PACGAN_TINY,
    "python scripts/train_stage2.py --config configs/training/ring.yaml --device cpu --debug": [],
    "torchrun --standalone --nproc_per_node 2 scripts/train_stage2.py --config configs/training/ring.yaml "
    "--device cpu": RING_DEBUG,
    "accelerate launch --config_file accelerate_configs/8gpu.yaml --num_processes 2 --mixed_precision no "
    "scripts/train_stage2.py --config configs/training/ring.yaml --device cpu": RING_DEBUG,
    "accelerate launch --config_file accelerate_configs/cpu_fsdp.yaml scripts/train_stage2.py "
    "--config configs/training/ring.yaml --device cpu": RING_DEBUG,
}


#: the README and every page of the docs site
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]


def readme_commands() -> list[str]:
    """The shell commands of the bash blocks of the README and the pages, continuation lines
    joined, comments dropped."""
    commands = []
    text = "\n".join(page.read_text() for page in PAGES)
    for block in re.findall(r"```bash\n(.*?)```", text, re.S):
        for line in block.replace("\\\n", " ").splitlines():
            line = re.sub(r"\s+", " ", line.split(" # ")[0]).strip()
            if line and not line.startswith("#"):
                commands.append(line)
    return commands


def test_every_readme_command_is_run_or_covered():
    commands = set(readme_commands())
    dependent = {
        "python scripts/train_stage1.py --device cpu",
        "python scripts/train_stage2.py --device cpu",
        "python scripts/train_stage2.py --config configs/training/ring.yaml --device cpu --resume latest",
        "python -m pdb scripts/train_stage2.py --config configs/training/ring.yaml --device cpu --debug",
        FRONTIER,
        ORACLE_DISCRIMINATOR,
        TEXT_EXAMPLE,
        TEXT_STAGE1,
        TEXT_STAGE2,
        TEXT_DDO,
    }
    unknown = commands - set(COVERED) - set(RUN) - dependent
    assert not unknown, f"commands of the README or docs/ neither run nor covered by a test: {sorted(unknown)}"
    assert dependent <= commands


def test_ci_runs_the_readme_s_test_command():
    # CI runs what the README tells a newcomer to run, word for word
    test_command = "python -m pytest -q -n 2 --dist worksteal"
    assert test_command in readme_commands()
    assert test_command in (ROOT / ".ci" / "run").read_text().splitlines()


def argv(command: str) -> list[str]:
    """The command with this interpreter for python, torchrun and accelerate."""
    words = shlex.split(command)
    if words[0] == "python":
        return [sys.executable, *words[1:]]
    if words[0] == "torchrun":
        return [sys.executable, "-m", "torch.distributed.run", *words[1:]]
    if words[:2] == ["accelerate", "launch"]:
        return [sys.executable, "-m", "accelerate.commands.launch", "--main_process_port", str(free_port()), *words[2:]]
    raise AssertionError(f"cannot run {command!r}")


def run(command: str, *extra: str, stdin: str | None = None) -> subprocess.CompletedProcess:
    result = subprocess.run(
        [*argv(command), *extra], cwd=ROOT, env=env(), capture_output=True, text=True, timeout=400, input=stdin
    )
    assert result.returncode == 0, f"{command}\n{result.stdout[-2000:]}\n{result.stderr[-4000:]}"
    return result


@pytest.mark.timeout(450)
@pytest.mark.parametrize("command", list(RUN))
def test_readme_command_runs(tmp_path, command):
    extra = [*RUN[command], "--output-dir", str(tmp_path / "out")]
    if "oracle" in command:
        extra.append(f"--set=data.cache_dir={tmp_path / 'cache'}")
    result = run(command, *extra)
    if "run_oracle" in command:
        assert "stage 2" in result.stdout
        processes = 2 if "launch" in command else 1
        assert {r["world_size"] for r in records(tmp_path / "out" / "stage2")} == {processes}
        assert (tmp_path / "out" / "stage2" / "final" / "generator" / "config.json").is_file()
        assert result.stdout.strip().splitlines()[-2].startswith("beyond the frontier: ")
        assert result.stdout.strip().splitlines()[-1].startswith("what this means: ")
        # the first screen: the trainer's lines, no library table and no terminal escape code
        assert "\x1b[" not in result.stdout + result.stderr and "LOAD REPORT" not in result.stderr
        assert "discriminator: score head newly initialised; the rest from " in result.stderr
        if "--stage2-config" in command:  # ddo or spin: no discriminator phase
            train = records(tmp_path / "out" / "stage2", "train")
            assert all("log_ratio_real" in r and "d_loss" not in r for r in train)
    elif "mixture_seeds" in command:
        variants = ["as_configured", "no_EMA"] if "--variant" in command else ["as_configured"]
        rows = [line.split()[0] for line in result.stdout.splitlines()[2:]]
        paper = "PacGAN2" if "ring" in command else "PacGAN4"
        assert rows == [variant.split("_")[0] for variant in variants] + [paper], result.stdout
        for variant in variants:
            assert {r["world_size"] for r in records(tmp_path / "out" / variant / "seed-0")} == {1}
    else:
        processes = 2 if ("torchrun" in command or "launch" in command) else 1
        assert {r["world_size"] for r in records(tmp_path / "out")} == {processes}


@pytest.mark.timeout(450)
def test_readme_stage1_then_stage2_alone(tmp_path):
    cache = f"--set=data.cache_dir={tmp_path / 'cache'}"
    run("python scripts/train_stage1.py --device cpu", *ORACLE_TINY, cache, "--output-dir", str(tmp_path / "stage1"))
    assert (tmp_path / "stage1" / "best" / "discriminator" / "config.json").is_file()
    init = [f"--set=init.{role}={tmp_path / 'stage1' / 'best' / role}" for role in ("generator", "discriminator")]
    run("python scripts/train_stage2.py --device cpu", *ORACLE_TINY, cache, *init, "--output-dir", str(tmp_path / "s2"))
    assert records(tmp_path / "s2", "eval")[-1]["num_samples"] == 40
    frontier = run(FRONTIER.replace("outputs/oracle/stage1", str(tmp_path / "stage1")), *ORACLE_TINY, cache)
    rows = frontier.stdout.strip().splitlines()
    assert rows[0].split()[:3] == ["temperature", "nll_oracle", "nll_test"]
    assert [row.split()[0] for row in rows[1:]] == ["1.00", "0.95", "0.90", "0.85", "0.80"]
    pair = ORACLE_DISCRIMINATOR.replace("outputs/oracle/stage1", str(tmp_path / "stage1"))
    rows = run(pair, "--samples", "40", "--chunk", "20").stdout.strip().splitlines()
    assert rows[0].startswith("40 sequences") and rows[-1].startswith("partial corr") and len(rows) == 5


@pytest.mark.timeout(300)
def test_readme_resume_latest_continues(tmp_path):
    out = ["--output-dir", str(tmp_path / "out")]
    ring = "python scripts/train_stage2.py --config configs/training/ring.yaml --device cpu"
    run(ring, "--debug", *out)
    result = run(f"{ring} --resume latest", "--debug", "--set=training.max_steps=6", *out)
    assert "resumed from" in result.stderr and "at step 4" in result.stderr
    assert [r["step"] for r in records(tmp_path / "out", "eval")] == [2, 4, 6]


@pytest.mark.timeout(300)
def test_readme_pdb_command_runs_under_the_debugger(tmp_path):
    command = "python -m pdb scripts/train_stage2.py --config configs/training/ring.yaml --device cpu --debug"
    result = run(command, "--output-dir", str(tmp_path / "out"), stdin="continue\nquit\n")
    assert "The program exited via sys.exit(). Exit status: 0" in result.stdout, result.stdout[-2000:]
    assert Path(tmp_path / "out" / "final" / "generator").is_dir()


@pytest.mark.timeout(450)
def test_readme_text_example(tmp_path):
    """The text recipe's three commands in order, in a directory of their own, a few steps each."""
    example = tmp_path / "text_example"
    run(TEXT_EXAMPLE.replace("outputs/text_example", str(example)))
    data = [
        f"--set=data.train_files={example / 'texts.jsonl'}",
        f"--set=data.eval_files={example / 'eval.jsonl'}",
        f"--set=data.cache_dir={tmp_path / 'cache'}",
        "--set=training.max_steps=2",
        "--set=training.eval_every=2",
        "--set=eval.batch_size=50",
    ]
    stage1 = tmp_path / "stage1"
    first = run(
        TEXT_STAGE1,
        *data,
        f"--set=model.generator_config={example / 'gpt2'}",
        "--set=stage1.discriminator.training.max_steps=2",
        "--output-dir",
        str(stage1),
    )
    # generate() drops the all-ones mask it is given and warns when the start token doubles as
    # the padding id, as this tokenizer's (and GPT-2's) does: noise the run keeps out of its log
    assert "attention_mask" not in first.stderr
    models = [f"--set=model.{role}_config={stage1 / 'best' / role}" for role in ("generator", "discriminator")]
    run(TEXT_STAGE2, *data, *models, "--output-dir", str(tmp_path / "stage2"))
    evals = records(tmp_path / "stage2", "eval")
    assert evals[-1]["world_size"] == 2 and evals[-1]["num_samples"] == 200


@pytest.mark.timeout(450)
def test_readme_text_table(tmp_path):
    # the ddo form of the table's command; its plain form (the shipped config) is part 3 of
    # scripts/gpu_check.sh, which tests/test_bench.py runs with DEVICE=cpu
    cache = f"--set=data.cache_dir={tmp_path / 'cache'}"
    result = run(TEXT_DDO, "--seeds", "0", *TEXT_TINY, cache, "--output-dir", str(tmp_path))
    # stage 2 ran the command's config (its loss parts), the baseline maximum likelihood only
    assert all("log_ratio_real" in record for record in records(tmp_path / "seed-0" / "stage2", "train"))
    assert all(
        set(record) & {"g_loss", "reward"} == {"g_loss"}
        for record in records(tmp_path / "seed-0" / "stage2-mle", "train")
    )
    rows = result.stdout.splitlines()
    assert rows[0] == "seeds 0: mean [min, max]" and rows[1].split() == ["nll_test", "bleu4", "self_bleu4"]
    assert [row[:7] for row in rows[2:4]] == ["stage 1", "stage 2"]
    assert "seed 0, stage2, step-0000002.txt:" in result.stdout
    # The frontier: stage 1 and the maximum-likelihood baseline at each of the default
    # temperatures, the verdict.
    from trainer.commands.frontier import FRONTIER_TEMPERATURES

    temperatures = list(FRONTIER_TEMPERATURES)
    curves = result.stdout.split("seed 0, the frontier:\n")[1].splitlines()
    assert curves[0].split() == ["generator", "temperature", "bleu4", "self_bleu4"]
    stage1_rows, mle_rows = curves[1 : 1 + len(temperatures)], curves[1 + len(temperatures) : 1 + 2 * len(temperatures)]
    assert all(row.startswith("stage 1 ") and "maximum" not in row for row in stage1_rows), curves
    assert all(row.startswith("stage 1 + maximum likelihood") for row in mle_rows), curves
    assert [float(row.split()[-3]) for row in stage1_rows] == temperatures, curves
    assert curves[1 + 2 * len(temperatures)].startswith("seed 0: frontier: stage 2 bleu4 ")
    assert (tmp_path / "seed-0" / "stage2-mle" / "final" / "generator" / "config.json").is_file()
    assert rows[-3] == f"plots: {tmp_path / 'frontier-seed-0.png'}"
    assert rows[-2] in ("beyond the frontier: 0 of 1 seeds", "beyond the frontier: 1 of 1 seeds")
    assert rows[-1].startswith("what this means: ") and rows[-1].endswith('the `text` recipe"')
