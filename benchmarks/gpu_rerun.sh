#!/usr/bin/env bash
# The short GPU rerun (device tool: 482 s of command time in session 5, plus the start):
# where the time goes and whether the replayed path is right (gpu_probe.py), the merge over
# nccl (gpu_nccl.py), then the package's variants and their memory (the TransformerLens baselines do not change with this
# package's code; see gpu_run.sh). Needs .gpu/ carried (benchmarks/gpu_prepare.sh makes it).
# Most important first: a run cut short still returns what it wrote under $OUT.
set -uo pipefail
source benchmarks/gpu_setup.sh || exit 1
nvidia-smi --query-gpu=name,driver_version,clocks.sm,memory.used --format=csv | tee "$OUT/gpu.txt"
python3 benchmarks/gpu_probe.py --model /tmp/smollm2-random --json "$OUT/probe6.json" 2>&1 \
  | grep -v "Loading weights\|USDT\|_warn_once\|acc_events" | tee "$OUT/probe6.md"
python3 benchmarks/gpu_nccl.py --model /tmp/smollm2-random 2>&1 | grep -v "Loading weights" | tee "$OUT/nccl.txt"
[ "${PROBE_ONLY:-0}" = 1 ] && exit 0  # PROBE_ONLY=1: where the time goes, and nccl; no variants
M="--model /tmp/smollm2-random --device cuda --dtype bfloat16"
python3 benchmarks/scan_speed.py $M --batches 4 --batch-size 32 --seq-len 512 --rounds 3 --memory \
  --variants hf_forward,rs_stats,rs_survival,rs_decompose,rs_capture \
  --json "$OUT/speed6_32x512.json" 2>&1 | grep -v "Loading weights" | tee "$OUT/speed6_32x512.md"
python3 benchmarks/scan_speed.py $M --batches 8 --batch-size 8 --seq-len 128 --rounds 5 --memory \
  --variants hf_forward,rs_stats,rs_survival,rs_read,rs_stats_flow,rs_lens,rs_subspaces \
  --json "$OUT/speed6_8x128.json" 2>&1 | grep -v "Loading weights" | tee "$OUT/speed6_8x128.md"
