#!/usr/bin/env bash
# Short GPU run for the flow statistics (session 6: ~150 s of command): the fused survival
# dots against the eager ones, then survival/read speed and memory at two shapes.
# Needs .gpu/ carried (benchmarks/gpu_prepare.sh makes it).
set -uo pipefail
source benchmarks/gpu_setup.sh || exit 1
python3 benchmarks/gpu_flow_check.py --model /tmp/smollm2-random 2>&1 | grep -v "Loading weights" | tee "$OUT/flow_check.txt"
M="--model /tmp/smollm2-random --device cuda --dtype bfloat16"
python3 benchmarks/scan_speed.py $M --batches 4 --batch-size 32 --seq-len 512 --rounds 3 --memory \
  --variants hf_forward,rs_survival --json "$OUT/flow6_32x512.json" 2>&1 | grep -v "Loading weights" | tee "$OUT/flow6_32x512.md"
python3 benchmarks/scan_speed.py $M --batches 8 --batch-size 8 --seq-len 128 --rounds 5 --memory \
  --variants hf_forward,rs_survival,rs_read --json "$OUT/flow6_8x128.json" 2>&1 | grep -v "Loading weights" | tee "$OUT/flow6_8x128.md"
