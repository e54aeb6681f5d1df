"""How much TF32 products move the logit lens's sums (``lens:tf32=true``), on the CPU.

On a GPU the lens is its float32 unembeddings (about 29 TFLOP per 32×512 batch of SmolLM2,
×33.8 of the plain forward on the H200 in session 33): float32 products run on the CUDA cores,
TF32 ones on the tensor cores at several times their rate. A TF32 product rounds each input to
10 mantissa bits and accumulates in float32. For a 16-bit model ``W_U`` is bf16 or fp16, exact
in TF32, so only the final-normed stream ``h`` (float32) is rounded, to a finer grid than the
bf16 ``h`` the model's own unembedding reads. ``lens:tf32=true`` rounds ``h`` so on every
device (``lens.tf32_round``), so its sums here are what a GPU gives, up to the order of the
products' additions. This script scans the same batches with ``lens`` and ``lens:tf32=true``
and reports per point the change in mean KL (relative, and against the mean's standard error
over the tokens), in top-1 agreement, in the rank histogram (token-points whose rank moved:
half its L1 change) and in the median rank.

    python benchmarks/lens_tf32.py [--model smollm2-135m] [--dtype bfloat16] [--batches 2]
        [--batch-size 4] [--seq-len 128] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from gpu_flow_check import _scan  # noqa: E402
from scan_speed import _batches  # noqa: E402

import residual_stream as rs  # noqa: E402


def lens_sums(model, batches, spec: str) -> tuple[object, float]:
    """The accumulator of ``spec`` over ``batches`` (eager, as the flow check scans), and seconds."""
    t = time.perf_counter()
    accs, _ = _scan(model, batches, graphs=False, fused=True, stats=[spec])
    return accs[spec], time.perf_counter() - t


def compare(ref, tf32) -> list[dict]:
    """Per point: mean KL both ways and its change, agreement and rank-histogram changes.

    The change in mean KL is given relative to it and in units of its standard error.
    """
    a, b = ref.result(), tf32.result()
    moved = (ref.sums["rank_hist"] - tf32.sums["rank_hist"]).abs().sum(-1) // 2
    agree = (ref.sums["top1"] - tf32.sums["top1"]).abs()
    rows = []
    for i in range(len(a)):
        kl, kl_t, se = float(a["kl"].iloc[i]), float(b["kl"].iloc[i]), float(a["kl_se"].iloc[i])
        rows.append({"point": i, "kl": kl, "kl_tf32": kl_t,
                     "rel_change": abs(kl_t - kl) / max(abs(kl), 1e-30),
                     "change_in_se": abs(kl_t - kl) / se if se > 0 else float("nan"),
                     "top1_changed": int(agree[i]), "ranks_moved": int(moved[i]),
                     "median_rank": float(a["median_rank"].iloc[i]),
                     "median_rank_tf32": float(b["median_rank"].iloc[i])})
    return rows


def main() -> None:
    """Run both scans, print a Markdown table and the largest changes."""
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default="smollm2-135m")
    p.add_argument("--dtype", default="bfloat16")
    p.add_argument("--batches", type=int, default=2)
    p.add_argument("--batch-size", type=int, default=4)
    p.add_argument("--seq-len", type=int, default=128)
    p.add_argument("--json")
    args = p.parse_args()
    model = rs.load(args.model, device="cpu", dtype=args.dtype, progress=False)
    batches = _batches(model, args.batches, args.batch_size, args.seq_len)
    ref, t_ref = lens_sums(model, batches, "lens")
    tf32, t_tf32 = lens_sums(model, batches, "lens:tf32=True")
    rows = compare(ref, tf32)
    tokens = int(ref.sums["n"])
    print(f"model {model.name}, {model.dtype}, {len(batches)} batches of {args.batch_size}×"
          f"{args.seq_len} ({tokens} tokens); scans {t_ref:.1f} s and {t_tf32:.1f} s\n")
    print("| point | mean KL (float32) | mean KL (TF32 inputs) | relative change | change / SE "
          "| top-1 changed | ranks moved | median rank (float32, TF32) |")
    print("|---|---|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['point']} | {r['kl']:.6g} | {r['kl_tf32']:.6g} | {r['rel_change']:.2e} | "
              f"{r['change_in_se']:.2e} | {r['top1_changed']} | {r['ranks_moved']} | "
              f"{r['median_rank']:g}, {r['median_rank_tf32']:g} |")
    worst = {"rel_change": max(r["rel_change"] for r in rows),
             "change_in_se": max(r["change_in_se"] for r in rows),
             "top1_changed": sum(r["top1_changed"] for r in rows),
             "ranks_moved": sum(r["ranks_moved"] for r in rows), "token_points": tokens * len(rows),
             "median_ranks_changed": sum(r["median_rank"] != r["median_rank_tf32"] for r in rows)}
    print("\nworst:", json.dumps(worst))
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"model": model.name, "dtype": str(model.dtype), "tokens": tokens,
                       "points": rows, "worst": worst}, f, indent=1)


if __name__ == "__main__":
    main()
