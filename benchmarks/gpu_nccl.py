"""The scan's merge over nccl, on the one GPU a device session has.

Two nccl ranks cannot share one GPU (NCCL refuses a duplicate device), so this joins a
one-process nccl group and runs the merge ``torchrun`` runs (``runner._gather``:
``all_gather_object`` of every accumulator's CUDA state, then a merge in rank order) on a
growth + survival scan, and compares the merged sums with the scan's own (they must be
equal: one rank merges into an empty accumulator). Prints one JSON line.

    python benchmarks/gpu_nccl.py --model /tmp/smollm2-random
"""

from __future__ import annotations

import argparse
import json
import os

import torch
import torch.distributed as dist

import residual_stream as rs
from residual_stream.streaming.runner import _gather

TEXTS = ["The residual stream is a shared channel.", "Attention reads from it and writes back.",
         "Norms rescale what each block reads."] * 8


def main() -> None:
    """Scan, merge over nccl, compare; print the result as JSON."""
    p = argparse.ArgumentParser()
    p.add_argument("--model", default="/tmp/smollm2-random")
    p.add_argument("--backend", default="nccl", help="gloo (with --device cpu) checks the script itself")
    p.add_argument("--device", default="cuda")
    args = p.parse_args()
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", "29531")
    if args.device == "cuda":
        torch.cuda.set_device(0)
    dist.init_process_group(args.backend, rank=0, world_size=1)
    try:
        dtype = "bfloat16" if args.device == "cuda" else "float32"
        model = rs.load(args.model, device=args.device, dtype=dtype, progress=False)
        res = rs.scan(model, TEXTS, ["growth", "survival"], batch_size=4, seq_len=32, progress=False)
        merged, tokens, batches, _, _ = _gather(res.accumulators, res.tokens, res.batches, 0)
        diffs = {f"{n}.{k}": float((v.double().cpu() - merged[n].sums[k].double().cpu())
                                   .abs().nan_to_num().max())
                 for n, a in res.accumulators.items() for k, v in a.sums.items()}
        print(json.dumps({"backend": dist.get_backend(), "tokens": [res.tokens, tokens],
                          "batches": [res.batches, batches], "max_abs_diff": max(diffs.values()),
                          "sums": len(diffs)}))
    finally:
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
