#!/usr/bin/env bash
# The checks that need a GPU, on a machine with one, in a few minutes; prints one table.
#
#   pip install -e ".[bench]" && bash scripts/gpu_check.sh
#
# 1. the doctor in one process (torchrun), and a process group of one over NCCL;
# 2. the ring (configs/training/ring.yaml) in bf16 for STEPS steps;
# 3. the text recipe on the offline example in bf16: stage 1 then stage 2, STEPS steps each (and
#    whether its forwards took packed rows);
# 4. benchmarks/bench_text.py at GPT-2-small shape against TRL in bf16 (tokens/s of the packed training
#    forwards, steps/s, checkpoint);
# 5. the ring under accelerate_configs/8gpu_fsdp.yaml, one process: FSDP2's fully_shard with its
#    bf16 policy on the device (a world of one: every shard is whole).
# Each part's output goes to OUT/<part>.log. Environment: DEVICE (cuda; cpu runs the same parts
# on the CPU over gloo, as tests/test_bench.py does), STEPS (300), OUT (outputs/gpu_check),
# BENCH_ARGS (--sizes small), TEXT_ARGS (more flags of part 3; none).
set -euo pipefail
cd "$(dirname "$0")/.."
DEVICE=${DEVICE:-cuda}
STEPS=${STEPS:-300}
OUT=${OUT:-outputs/gpu_check}
BENCH_ARGS=${BENCH_ARGS:---sizes small}
TEXT_ARGS=${TEXT_ARGS:-}
PYTHON=${PYTHON:-python}
EVERY=$(( STEPS / 2 > 0 ? STEPS / 2 : 1 ))
rm -rf "$OUT" && mkdir -p "$OUT"
SHORT=(--set "training.max_steps=$STEPS" --set "training.eval_every=$EVERY" --set "training.save_every=$EVERY"
       --set "training.log_every=$EVERY" --set training.mixed_precision=bf16 --set 'training.log_with=[none]')

echo "1/5 doctor, one process ($DEVICE), then a process group of one on its backend"
"$PYTHON" -m torch.distributed.run --standalone --nproc_per_node 1 scripts/doctor.py \
    --config configs/training/ring.yaml --device "$DEVICE" --output-dir "$OUT/doctor" > "$OUT/doctor.log" 2>&1
# The doctor times collectives between ranks only; one GPU's NCCL is checked by a group of one.
"$PYTHON" - "$DEVICE" >> "$OUT/doctor.log" 2>&1 <<'PYTHON'
import sys, time, torch, torch.distributed as dist

device = torch.device("cuda:0" if sys.argv[1] == "cuda" else "cpu")
dist.init_process_group("nccl" if device.type == "cuda" else "gloo", store=dist.HashStore(), rank=0, world_size=1)
payload = torch.ones(16 * 2**20 // 4, device=device)
for _ in range(2):  # the first round builds the communicator
    began = time.perf_counter()
    dist.all_reduce(payload)
    dist.barrier()
    if device.type == "cuda":
        torch.cuda.synchronize()
elapsed_ms = 1000 * (time.perf_counter() - began)
verdict = "ok" if float(payload[0]) == 1.0 else "WRONG SUM"
print(f"group of one: {dist.get_backend()} all_reduce 16 MB + barrier {elapsed_ms:.1f} ms, {verdict}")
dist.destroy_process_group()
PYTHON
echo "2/5 ring, bf16, $STEPS steps"
"$PYTHON" scripts/train_stage2.py --config configs/training/ring.yaml --device "$DEVICE" \
    --output-dir "$OUT/ring" "${SHORT[@]}" --set task_options.plot=false > "$OUT/ring.log" 2>&1
echo "3/5 text, bf16, stage 1 then stage 2, $STEPS steps each"
# shellcheck disable=SC2086  # TEXT_ARGS is a list of flags
"$PYTHON" scripts/run_text.py --device "$DEVICE" --seeds 0 --output-dir "$OUT/text" "${SHORT[@]}" $TEXT_ARGS \
    > "$OUT/text.log" 2>&1
echo "4/5 bench_text.py, bf16, $BENCH_ARGS"
# shellcheck disable=SC2086  # BENCH_ARGS is a list of flags
"$PYTHON" benchmarks/bench_text.py --device "$DEVICE" --precision bf16 --output-dir "$OUT/bench" $BENCH_ARGS \
    > "$OUT/bench.log" 2>&1
echo "5/5 ring, FSDP2 (8gpu_fsdp.yaml, one process), bf16, $STEPS steps"
"$PYTHON" -m accelerate.commands.launch --config_file accelerate_configs/8gpu_fsdp.yaml --num_processes 1 \
    scripts/train_stage2.py --config configs/training/ring.yaml --device "$DEVICE" --output-dir "$OUT/ring_fsdp" \
    "${SHORT[@]}" --set task_options.plot=false > "$OUT/ring_fsdp.log" 2>&1

"$PYTHON" - "$OUT" <<'PYTHON'
import json, re, sys
from pathlib import Path

out = Path(sys.argv[1])
print(f"\n{'check':36} {'tokens/s':>10} {'steps/s':>9} {'peak MB':>9} {'checkpoint s':>13}")
for line in (out / "doctor.log").read_text().splitlines():
    if "verdict" in line or line.startswith("group of one"):
        print(f"{'doctor':36} {line.strip()}")
runs = (("ring, bf16", out / "ring", out / "ring.log"),
        ("text stage 2, bf16", out / "text" / "seed-0" / "stage2", out / "text.log"),
        ("ring FSDP2 1 process, bf16", out / "ring_fsdp", out / "ring_fsdp.log"))
for name, run, log in runs:
    records = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    train = [r for r in records if r["split"] == "train"][-1]
    saved = rf"saved {re.escape(str(run))}/checkpoints/\S+ in ([0-9.]+) s"
    seconds = max(float(s) for s in re.findall(saved, log.read_text()))
    print(f"{name:36} {'-':>10} {train['steps_per_s']:9.2f} {train['peak_memory_mb']:9.0f} {seconds:13.2f}")
sharded = re.search(r"FSDP2: [^\n]+", (out / "ring_fsdp.log").read_text())
print(f"{'ring FSDP2 1 process, bf16':36} {sharded.group(0) if sharded else 'no FSDP2 line: not sharded'}")
# which path the text run's forwards took (packed rows where the models take them), once each
paths = dict.fromkeys(re.findall(r"(\w+ forwards \(\w+\): [^\n]+)", (out / "text.log").read_text()))
for line in paths:
    print(f"{'text, bf16':36} {line}")
for line in (out / "bench.log").read_text().splitlines():
    words = line.split()
    if len(words) >= 6 and words[2] in ("trainer", "trl"):
        size, objective, side, steps, tokens, peak = words[:6]
        name = f"bench_text {size} {objective}, {side}, bf16"
        print(f"{name:36} {float(tokens) * float(steps):10.0f} {float(steps):9.2f} {float(peak):9.0f} {'-':>13}")
    elif "checkpoint save+load" in line or "ratio" in line or "gradient_checkpointing" in line:
        print(f"{'bench_text':36} {line.strip()}")
PYTHON
