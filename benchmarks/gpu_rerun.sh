#!/usr/bin/env bash
# The prepared GPU rerun (device tool, carry [".gpu"]; benchmarks/gpu_prepare.sh makes .gpu/).
# Sessions 7 and 8's changes are unmeasured on a GPU. Three steps, most important first; STEPS
# picks them (default all three, an estimated 9-10 min: over one call's 600 s, so run
# STEPS="check big" first, ~6 min, then STEPS=small, ~3.5 min, if the budget allows). Each
# step writes under $OUT as it goes, so a run cut short still returns what it wrote:
#  check: gpu_flow_check.py, survival and read attribution replayed as CUDA graphs and fused
#     against the eager unfused scan (sums; replays; warnings), and the lens's compiled
#     reductions against its eager ones (~1.5 min); then gpu_probe.py, growth's wall and
#     busy time against the forward, replayed, with and without the full unembedding, its
#     kernel table, replayed-vs-eager sums (~1.5 min);
#  big: scan_speed.py at 32×512, time and peak memory of growth, survival, the flow
#     statistics, the decomposition, the lens and (session 10) the lens on one token in 16
#     (~3.5 min);
#  small: scan_speed.py at 8×128, the same plus read attribution, subspaces, the lens
#     with TF32 products as a what-if, and (session 10) read attribution, the lens and
#     subspaces on one token in 16 (~4.5 min);
#  reader (session 9): corpus_speed.py, the corpus reader's tokens/s on this host's cores and
#     `rs.scan` of growth end to end against the plain forward over the same 32×512 batches,
#     so whether the reader bounds a GPU scan (~1.5 min). STEPS="small reader" fits one call.
# Session 11 added: to check, sampled growth + survival + read attribution + lens replayed
#     against eager (gpu_flow_check.py's "sampled_*" keys: fixed-capacity token choices);
#     to big, survival on one token in 16 (its buffer then holds those tokens only); to small,
#     survival + read attribution on one token in 16 together. Sampled survival, read
#     attribution and lens variants now replay (before session 11 they ran eagerly).
# Session 12 added: subspaces and the every-token lens replay (bases made once per scan; the
#     logits' forward pass in the lens's graph), so check also compares them replayed against
#     eager (subspaces on every token, and on one in 64 beside the others' one in 16: nested
#     samples, one buffer of one token in 16); rs_lens and rs_subspaces now replay; small adds
#     read attribution on one token in 16 beside subspaces on one in 64 (rs_read16_sub64).
# Session 13 added: to reader, batch_order.py at 32x512 on the GPU: growth scanned with rows
#     sorted by length against corpus order, and the plain forward, on short lines, documents
#     and mixed lengths; replays now pad to seq_len or a halving of it, so this also
#     captures up to 6 widths (~1 min).
# Session 14 added: to reader, state_save.py at 32x512: each statistic's state save against
#     a batch, and growth scanned with its state saved by time and after every batch (~1 min).
# NCCL=1 adds the one-rank nccl merge (gpu_nccl.py) after the check step.
# Session 17: tests/test_benchmarks.py runs every script of these steps on the CPU (a tiny
#     SmolLM2-shaped model, float32, this file's variant lists), so a script broken by a change
#     in the library fails CI rather than the device call.
# Session 33 (the first device since session 6): the steps run in the order STEPS names them
#     (most important first, so a call cut short has run those); the device tool returns at
#     most 8 files, which all four steps exceed, so the call packs $OUT into one archive:
#     timeout -k 5 555 env STEPS="big check small reader" bash benchmarks/gpu_rerun.sh 2>&1 \
#       | tee $OUT/log.txt; cd $OUT && tar czf results.tgz --exclude results.tgz * \
#       && find . -type f ! -name results.tgz -delete
#     In 555 s it ran big (~5 min with the setup) and check (~2 min); small did not finish.
#     Added after it, to check: replay_host.py, the host's part of a replayed 32×512 batch
#     (refill, checks, into) against the plain forward, for growth, survival and the lens.
# Session 34 (no device lent): big and small run their memory subprocesses four at a time
#     (scan_speed.py --memory-jobs 4; each reports its own process's max_memory_allocated, so
#     only their wall time changes), which were run one after another, each starting Python,
#     CUDA and its compiles: with them, STEPS="check big small" is meant to fit one call.
#     Added: lens:tf32=true (the lens's unembedding inputs rounded to TF32, products on the
#     tensor cores) as rs_lens_tf32 in big (32x512) beside small; to check, the flow check's
#     tf32_* keys (lens:tf32 replayed against the same inputs multiplied in float32, and
#     against the plain lens), and the probe's trace and per-head decomposition (kernel
#     tables, host time, every round: the decomposition missed x2 at 32x512 in session 33);
#     to big, rs_lens_chunk256 (the lens's chunks capped at 256 tokens, not 512: its peak was
#     x1.22, the logits 1,536 MiB + the headless pass ~250 + its [chunk, vocab] temporaries).
# Session 35 (no device lent): the probe adds a what-if, the head-write products of one
#     32x512 decomposition in float32 against bf16 inputs with float32 output
#     (torch.bmm(..., out_dtype=torch.float32), tensor cores) and their largest difference.
set -uo pipefail
STEPS=${STEPS:-check big small reader}
source benchmarks/gpu_setup.sh || exit 1
nvidia-smi --query-gpu=name,driver_version,clocks.sm,memory.used --format=csv | tee "$OUT/gpu.txt"
quiet() { grep -v "Loading weights\|USDT\|_warn_once\|acc_events"; }
M="--model /tmp/smollm2-random --device cuda --dtype bfloat16"
check() {
  python3 benchmarks/gpu_flow_check.py --model /tmp/smollm2-random 2>&1 | quiet | tee "$OUT/flow_check8.txt"
  python3 benchmarks/gpu_probe.py --model /tmp/smollm2-random --json "$OUT/probe8.json" 2>&1 | quiet \
    | tee "$OUT/probe8.md"
  python3 benchmarks/replay_host.py --model /tmp/smollm2-random --device cuda --dtype bfloat16 \
    --batch-size 32 --seq-len 512 --rounds 10 --stats "growth;survival;lens" --json "$OUT/host33.json" \
    2>&1 | quiet | tee "$OUT/host33.md"
  [ "${NCCL:-0}" = 1 ] && python3 benchmarks/gpu_nccl.py --model /tmp/smollm2-random 2>&1 | quiet \
    | tee "$OUT/nccl.txt"
}
big() {
  python3 benchmarks/scan_speed.py $M --batches 4 --batch-size 32 --seq-len 512 --rounds 3 --memory --memory-jobs 4 \
    --variants hf_forward,hf_headless,rs_stats,rs_survival,rs_survival_every16,rs_stats_flow,rs_decompose,rs_lens,rs_lens_chunk256,rs_lens_every16,rs_lens_tf32 \
    --json "$OUT/speed8_32x512.json" 2>&1 | quiet | tee "$OUT/speed8_32x512.md"
}
small() {
  python3 benchmarks/scan_speed.py $M --batches 8 --batch-size 8 --seq-len 128 --rounds 5 --memory --memory-jobs 4 \
    --variants hf_forward,hf_headless,rs_stats,rs_survival,rs_read,rs_read_every16,rs_flow_every16,rs_stats_flow,rs_lens,rs_lens_every16,rs_lens_tf32,rs_subspaces,rs_subspaces_every16,rs_read16_sub64 \
    --json "$OUT/speed8_8x128.json" 2>&1 | quiet | tee "$OUT/speed8_8x128.md"
}
reader() {
  TOKENIZERS_PARALLELISM=true python3 benchmarks/corpus_speed.py --model /tmp/smollm2-random --scan \
    --device cuda --dtype bfloat16 --texts 16000 --rounds 3 --out "$OUT/corpus9" 2>&1 | quiet
  TOKENIZERS_PARALLELISM=false python3 benchmarks/corpus_speed.py --model /tmp/smollm2-random \
    --texts 16000 --rounds 3 --out "$OUT/corpus9_serial" 2>&1 | quiet
  python3 benchmarks/batch_order.py --model /tmp/smollm2-random --device cuda --dtype bfloat16 \
    --batch-size 32 --seq-len 512 --copies 8 --rounds 3 --out "$OUT/order13" 2>&1 | quiet
  python3 benchmarks/state_save.py --model /tmp/smollm2-random --device cuda --dtype bfloat16 \
    --batch-size 32 --seq-len 512 --batches 2 --rounds 3 --out "$OUT/state14" 2>&1 | quiet
}
for step in $STEPS; do  # in the order given, so a call cut short has run the first ones
  case $step in check|big|small|reader) $step ;; *) echo "unknown step $step" >&2; exit 1 ;; esac
done
exit 0
