#!/usr/bin/env bash
# The one prepared GPU run (device tool): checks, then the speed benchmark at two sizes.
# Needs .gpu/whl (wheels matching constraints.txt for Python 3.12) and .gpu/smollm2 (SmolLM2's
# config and tokenizer) carried; writes everything under $OUT. See benchmarks/RESULTS.md.
set -uo pipefail
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
  --target /tmp/site .gpu/whl/*.whl || exit 1
export PYTHONPATH=/tmp/site:$PWD HF_HUB_OFFLINE=1 PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv | tee "$OUT/gpu.txt"
python3 -c "import torch, transformers, transformer_lens; print(torch.__version__, transformers.__version__)" | tee -a "$OUT/gpu.txt"
python3 benchmarks/gpu_check.py --config .gpu/smollm2 --out "$OUT" 2>&1 | grep -v "Loading weights" | tee "$OUT/check.log"
python3 benchmarks/scan_speed.py --model /tmp/smollm2-random --device cuda --dtype bfloat16 \
  --batches 8 --batch-size 8 --seq-len 128 --rounds 5 --memory --json "$OUT/speed_8x128.json" \
  2>&1 | grep -v "Loading weights" | tee "$OUT/speed_8x128.md"
python3 benchmarks/scan_speed.py --model /tmp/smollm2-random --device cuda --dtype bfloat16 \
  --batches 4 --batch-size 32 --seq-len 512 --rounds 3 --json "$OUT/speed_32x512.json" \
  2>&1 | grep -v "Loading weights" | tee "$OUT/speed_32x512.md"
