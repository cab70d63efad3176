"""The loop benchmark runs end to end (a few steps) in 1 and 2 processes and prints its table."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from helpers import ROOT, records

SIDES = ("trainer", "trl")


@pytest.mark.timeout(400)
def test_bench_loop_prints_a_row_per_process_count():
    done = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "bench_loop.py"), "--rounds=3", "--block=2", "--alone-steps=4"],
        capture_output=True,
        text=True,
        timeout=380,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    rows = re.findall(r"^\| (\d) \| ([\d.]+) \| ([\d.]+) \| ([\d.]+) \| (\d+) \| (\d+) \|$", done.stdout, re.M)
    assert [row[0] for row in rows] == ["1", "2"], done.stdout
    for _, plain, trainer, ratio, plain_mb, trainer_mb in rows:
        assert float(plain) > 0 and float(trainer) > 0 and float(ratio) > 0
        # each loop ran rounds x block steps (the script exits otherwise); a process that has
        # imported torch and trained holds more than 100 MB: the peaks are the runs' own
        assert int(plain_mb) > 100 and int(trainer_mb) > 100


@pytest.mark.timeout(300)
def test_bench_fsdp_counts_each_rank_s_shards():
    done = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "bench_fsdp.py"), "--size", "tiny", "--processes", "1", "2"],
        capture_output=True,
        text=True,
        timeout=280,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    rows = re.findall(r"^\| (\d) \| (\w+) \|((?: [\d.]+ \|){6})$", done.stdout, re.M)
    assert [(processes, kind) for processes, kind, _ in rows] == [("1", "whole"), ("2", "DDP"), ("2", "FSDP2")]
    figures = {kind: [float(x) for x in numbers.strip(" |").split(" | ")] for _, kind, numbers in rows}
    assert figures["DDP"][:4] == figures["whole"][:4]  # DDP holds every parameter on every rank
    # FSDP2: half of each (a shard may be padded to split evenly), counted from the tensors themselves
    assert figures["FSDP2"][3] <= 0.55 * figures["DDP"][3] and figures["FSDP2"][4] <= 0.55
    assert all(f[5] > 100 for f in figures.values())  # the peak resident sets: each launch's own


@pytest.mark.timeout(300)
def test_bench_fsdp_times_sampling_both_ways():
    command = [sys.executable, str(ROOT / "benchmarks" / "bench_fsdp.py"), "--size", "tiny", "--sampling"]
    command += ["--processes", "2", "--rounds", "1", "--sampling-tokens", "8"]
    done = subprocess.run(command, capture_output=True, text=True, timeout=280)
    assert done.returncode == 0, done.stderr[-3000:]
    row = re.search(
        r"^\| 2 \| (\d+) \| ([\d.]+) \[[\d.-]+\] \| ([\d.]+) \[[\d.-]+\] \| ([\d.]+) \|$", done.stdout, re.M
    )
    assert row, done.stdout
    groups, each, once, ratio = int(row[1]), *map(float, row.groups()[1:])
    assert groups == 6 and each > 0 and once > 0 and ratio == pytest.approx(once / each, abs=0.01)


@pytest.mark.timeout(300)
def test_bench_fsdp_reports_each_rank_s_peak_memory_at_load():
    command = [sys.executable, str(ROOT / "benchmarks" / "bench_fsdp.py"), "--size", "tiny", "--loading"]
    done = subprocess.run([*command, "--processes", "2"], capture_output=True, text=True, timeout=280)
    assert done.returncode == 0, done.stderr[-3000:]
    rows = re.findall(r"^\| 2 \| ([\w -]+) \| (\d+) \| (\d+) \|$", done.stdout, re.M)
    assert [kind for kind, _, _ in rows] == ["DDP", "FSDP2", "FSDP2 own weights"], done.stdout
    assert all(int(first) > 100 and int(other) > 100 for _, first, other in rows)  # each launch's own


@pytest.mark.timeout(600)
def test_the_gpu_check_runs_its_parts_on_the_cpu(tmp_path):
    # every part of scripts/gpu_check.sh on the CPU over gloo, a few steps each; on a GPU the
    # same script runs them in bf16 over NCCL
    out = tmp_path / "gpu_check"
    # the memory rows at one vocabulary a tenth of GPT-2's (the GPU's at 32000 and 50257 take 28 s on the CPU);
    # the shipped objective's rows alone (the minimal objective's are the same code with fewer parts: 12 s)
    bench = "--sizes tiny --steps 2 --warmup 1 --rounds 1 --sampling-rounds 2 --threads 1 --vocabularies 5000"
    bench += " --objectives shipped"
    environment = {**os.environ, "DEVICE": "cpu", "STEPS": "4", "OUT": str(out), "BENCH_ARGS": bench}
    # the text recipe's evals (each frontier point is one) on fewer texts, at one temperature
    environment["TEXT_ARGS"] = "--set eval.batch_size=50 --set task_options.bleu_samples=20 --frontier 1"
    environment["PYTHON"] = sys.executable
    done = subprocess.run(
        ["bash", str(ROOT / "scripts" / "gpu_check.sh")],
        capture_output=True, text=True, timeout=580, env=environment,
    )  # fmt: skip
    logs = "".join(f"\n--- {log.name}\n{log.read_text()[-2000:]}" for log in sorted(out.glob("*.log")))
    assert done.returncode == 0, done.stdout + done.stderr[-3000:] + logs
    table = done.stdout[done.stdout.index("check ") :]
    assert "doctor (rank 0): verdict: OK" in table and "group of one: gloo all_reduce 16 MB" in table, table
    sides = [f"bench_text tiny shipped, {side}, bf16" for side in SIDES]
    assert "ring FSDP2 1 process, bf16           FSDP2: the generator in 1 group(s)" in table, table
    for name in ("ring, bf16", "text stage 2, bf16", "ring FSDP2 1 process, bf16", *sides):
        row = next(line for line in table.splitlines() if line.startswith(name))
        numbers = [float(word) for word in row[len(name) :].split() if word != "-"]
        assert numbers and all(n > 0 for n in numbers), row
    assert len(re.findall(r"ratio trainer/trl .*: [\d.]+$", table, re.M)) == 1, table
    assert re.search(r"checkpoint save\+load: trainer [\d.]+ s", table), table
    # the trainer's flush of its files, timed inside its own saves
    assert re.search(r"flushing its files to disk before the rename that publishes them [\d.]+ s", table), table
    # the bf16 text run's forwards took packed rows, and the generator phase's memory rows
    assert "generator forwards (GPT2LMHeadModel): packed rows" in table, table
    assert "discriminator forwards (GPT2ForSequenceClassification): packed rows" in table, table
    assert re.search(r"vocabulary 5000: peak above its start \d+ MB before packing, \d+ MB packed", table), table
    # part 3 is the README's table command (run_text.py --seeds 0, the shipped config): stage 2's
    # reward parts, the table of the seed, its place against the frontier
    assert all("reward" in record for record in records(out / "text" / "seed-0" / "stage2", "train"))
    text = (out / "text.log").read_text()
    assert "seeds 0: mean [min, max]" in text and "\nbeyond the frontier: " in text, text[-3000:]


def mixture_seeds(config: Path, output_dir: Path, *args: str) -> subprocess.CompletedProcess:
    """research/mixture_seeds.py on ``config`` into ``output_dir``, with a hard timeout."""
    command = [
        sys.executable,
        str(ROOT / "research" / "mixture_seeds.py"),
        str(config),
        "--output-dir",
        str(output_dir),
    ]
    return subprocess.run([*command, *args], capture_output=True, text=True, timeout=250)


@pytest.mark.timeout(300)
def test_mixture_seeds_prints_the_mean_and_range_of_each_variant(tmp_path):
    import json

    from helpers import records, write_run

    config = write_run(tmp_path, {"training": {"ema_decay": 0.5}})
    out = tmp_path / "seeds"
    # the "no EMA" runs are already there (finished: final/ exists), with known last evals
    known = {
        0: {"modes": 8, "high_quality": 0.9, "reverse_kl": 0.01},
        1: {"modes": 7, "high_quality": 0.8, "reverse_kl": 0.04},
    }
    for seed, last in known.items():
        (out / "no_EMA" / f"seed-{seed}" / "final").mkdir(parents=True)
        lines = [{"step": 2, "split": "eval", "modes": 1, "high_quality": 0.0, "reverse_kl": 2.0}]
        lines.append({"step": 4, "split": "eval", **last})
        (out / "no_EMA" / f"seed-{seed}" / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in lines))
    done = mixture_seeds(config, out, "--seeds", "0", "1", "--jobs", "2", "--variant", "no EMA:training.ema_decay=0")
    assert done.returncode == 0, done.stdout + done.stderr[-3000:]
    rows = {line[:18].strip(): line[18:].split() for line in done.stdout.splitlines()[2:]}
    assert list(rows) == ["as configured", "no EMA", "PacGAN2 (paper)"], done.stdout
    # the configured runs ran (one process each) and their eval scored the average
    finals = [records(out / "as_configured" / f"seed-{seed}", "eval")[-1] for seed in (0, 1)]
    assert [f["generator"] for f in finals] == ["ema", "ema"]
    assert rows["as configured"][0] == f"{(finals[0]['modes'] + finals[1]['modes']) / 2:.1f}"
    assert rows["no EMA"] == [
        "7.5",
        "[7.0,",
        "8.0]",
        "0.8500",
        "[0.8000,",
        "0.9000]",
        "0.0250",
        "[0.0100,",
        "0.0400]",
        "1/2",
    ]


@pytest.mark.timeout(120)
def test_mixture_seeds_averages_each_seed_over_its_last_evals(tmp_path):
    # a late eval moves by points from one to the next: --last K scores each seed by the mean of
    # its last K evals; a run with fewer evals than that is one error line, not a shorter mean
    import json

    from helpers import write_run

    config = write_run(tmp_path, {})
    out = tmp_path / "seeds"
    evals = {
        0: [(1, 0.0, 2.0), (8, 0.9, 0.02), (8, 0.7, 0.06)],
        1: [(1, 0.0, 2.0), (7, 0.8, 0.10), (8, 0.6, 0.02)],
    }
    for seed, rows in evals.items():
        run_dir = out / "as_configured" / f"seed-{seed}"
        (run_dir / "final").mkdir(parents=True)
        lines = [{"step": 0, "split": "train", "d_loss": 1.0}]  # other records are not evals
        for step, (modes, quality, kl) in enumerate(rows):
            lines.append({"step": step, "split": "eval", "modes": modes, "high_quality": quality, "reverse_kl": kl})
        (run_dir / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in lines))
    done = mixture_seeds(config, out, "--seeds", "0", "1", "--last", "2")
    assert done.returncode == 0, done.stdout + done.stderr[-3000:]
    assert "mean of each seed's last 2 evals" in done.stdout.splitlines()[0], done.stdout
    cells = done.stdout.splitlines()[2].split()
    # seed 0: 8 modes, 0.8, 0.04; seed 1: 7.5, 0.7, 0.06; a seed reaches every mode when each
    # of its last evals does
    assert cells[2:5] == ["7.8", "[7.5,", "8.0]"] and cells[5:8] == ["0.7500", "[0.7000,", "0.8000]"]
    assert cells[8:] == ["0.0500", "[0.0400,", "0.0600]", "1/2"]
    done = mixture_seeds(config, out, "--seeds", "0", "1", "--last", "4")
    assert done.returncode != 0 and done.stdout == "", done.stdout
    assert "metrics.jsonl: 3 eval records, fewer than --last 4" in done.stderr, done.stderr[-3000:]


@pytest.mark.timeout(300)
def test_mixture_seeds_continues_an_interrupted_run_from_its_last_checkpoint(tmp_path):
    # a schedule of hours is rarely run in one go: a seed stopped at step 2 of 4 (its step-2
    # checkpoint there, no final/) goes on from step 2 and ends where one run in one go ends
    from helpers import check, launch, records, write_run

    config = write_run(tmp_path, {"training": {"seed": 0}})
    whole, stopped = tmp_path / "whole", tmp_path / "seeds" / "as_configured" / "seed-0"
    args = ["--config", str(config), "--device", "cpu", "--output-dir"]
    check(launch([*args, str(whole)], 1))
    check(launch([*args, str(stopped), "--set", "training.max_steps=2"], 1))
    shutil.rmtree(stopped / "final")
    stopped.with_suffix(".log").write_text("the first leg's log\n")
    done = mixture_seeds(config, tmp_path / "seeds", "--seeds", "0")
    assert done.returncode == 0, done.stdout + done.stderr[-3000:]
    log = stopped.with_suffix(".log").read_text()
    assert log.startswith("the first leg's log\n") and "resumed from" in log and "step-0000002" in log, log
    assert (stopped / "final").is_dir()
    assert [r["step"] for r in records(stopped, "eval")] == [2, 4]
    assert records(stopped, "eval")[-1] == records(whole, "eval")[-1]


@pytest.mark.parametrize(("flags", "threads"), [([], "1"), (["--threads", "2"], "2")])
def test_mixture_seeds_gives_each_run_its_threads(tmp_path, monkeypatch, capsys, flags, threads):
    # one run alone on 2 cores trains faster on both (a schedule of hours): --jobs 1 --threads 2
    import json

    from helpers import write_run

    sys.path.insert(0, str(ROOT / "research"))
    import mixture_seeds as script

    started = []

    def train(command, env, **_):
        run_dir = Path(command[command.index("--output-dir") + 1])
        started.append((run_dir.name, env))
        (run_dir / "final").mkdir(parents=True)
        last = {"step": 4, "split": "eval", "modes": 8, "high_quality": 0.9, "reverse_kl": 0.01}
        (run_dir / "metrics.jsonl").write_text(json.dumps(last) + "\n")
        return subprocess.CompletedProcess(command, 0)

    monkeypatch.setattr(script.subprocess, "run", train)
    config = write_run(tmp_path, {})
    assert script.main([str(config), "--output-dir", str(tmp_path / "seeds"), "--seeds", "0", "1", *flags]) == 0
    assert sorted(name for name, _ in started) == ["seed-0", "seed-1"]
    for _, env in started:
        assert env["OMP_NUM_THREADS"] == env["MKL_NUM_THREADS"] == threads
        assert env["MALLOC_TRIM_THRESHOLD_"] == "1073741824" and env["PATH"] == os.environ["PATH"]
    table = capsys.readouterr().out.splitlines()
    assert table[2].startswith("as configured") and table[2].split()[2:5] == ["8.0", "[8.0,", "8.0]"], table
    assert table[2].endswith("2/2"), table
    with pytest.raises(SystemExit):
        script.main([str(config), "--threads", "0"])
    assert "--threads 0: expected 1 or more" in capsys.readouterr().err


@pytest.mark.timeout(300)
def test_mixture_seeds_stops_when_a_seed_stops_before_its_end(tmp_path):
    # a run stopped by a signal or training.max_time exits 0 with a checkpoint and no final/:
    # its last eval is not the seed's result
    from helpers import write_run

    config = write_run(tmp_path, {"training": {"max_time": 1e-6}})
    done = mixture_seeds(config, tmp_path / "seeds", "--seeds", "0")
    assert done.returncode != 0 and "stopped before its end" in done.stderr, done.stdout + done.stderr[-3000:]
    assert "run the command again" in done.stderr and "last eval" not in done.stdout


@pytest.mark.timeout(300)
def test_bench_peft_prints_each_variant_and_the_ratios(tmp_path):
    pytest.importorskip("peft")
    command = [sys.executable, str(ROOT / "benchmarks" / "bench_peft.py"), "--size", "tiny", "--steps", "1"]
    command += ["--warmup", "0", "--output-dir", str(tmp_path / "out")]
    temporary = tmp_path / "tmp"  # each variant's run directory is removed when it ends
    temporary.mkdir()
    done = subprocess.run(
        command, capture_output=True, text=True, timeout=280, env={**os.environ, "TMPDIR": str(temporary)}
    )
    assert done.returncode == 0, done.stderr[-3000:]
    rows = {line.split()[0]: line.split()[1:] for line in done.stdout.splitlines()[1:-1]}
    assert list(rows) == ["full", "lora", "lora-both"], done.stdout
    trained = [int(rows[v][2].replace(",", "")) for v in rows]
    assert trained[0] > trained[1] > trained[2] > 0  # the adapters train far fewer weights
    assert re.fullmatch(r"ratio lora/full: memory [\d.]+, steps/s [\d.]+", done.stdout.splitlines()[-1])
    assert not list(temporary.iterdir())


def test_bench_text_counts_each_second_of_a_step_once_in_its_innermost_part(monkeypatch):
    sys.path.insert(0, str(ROOT / "benchmarks"))
    import text_common

    clock = iter(range(100))
    monkeypatch.setattr(text_common.time, "perf_counter", lambda: next(clock))
    times = text_common.PartTimes()
    reward = times.wrap(lambda: None, "reward")
    # the D step absorbs what it calls; the loss holds a reward computed inside it
    d_step = times.wrap(lambda: reward(), "D step", absorbing=True)
    loss = times.wrap(lambda: (next(clock), reward(), next(clock)), "G forward")
    d_step()  # clock 0 -> 1: D step 1
    loss()  # clock 2 -> 7: G forward 5 less the reward's 1 (4 -> 5)
    assert times.seconds["D step"] == 1 and times.seconds["reward"] == 1 and times.seconds["G forward"] == 4
    parts = times.per_step(steps=2, seconds=10)  # milliseconds per step
    assert parts["G forward"] == 2000 and parts["other"] == 1000 * (10 - 6) / 2 and sum(parts.values()) == 5000
