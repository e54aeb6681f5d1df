"""The flow statistics as a GPU scan runs them (replayed, fused) against the eager ones.

Survival, read attribution, ``subspaces`` (since session 12: its readers' bases made once
per scan) and the lens on every token (session 12: its logits' forward pass in the same
graph) replay as a CUDA graph per batch shape (``streaming.graphs``)
and survival's per-mark dot products compile into one kernel (``carry.token_dots``). This
scans the same batches three ways: replayed with fusion (what ``rs.scan`` does on a GPU),
eagerly with fusion, eagerly without; and prints as one JSON line, per sum, the largest
difference of each of the first two from the third, relative to the sum's largest entry
(counts: how many moved, half the summed absolute difference; session 33's H200 run counted
differing bins instead, 38 in the lens's rank histogram), with how many batches were
replayed and any warning (a capture that failed falls back to
the eager pass with a warning); the lens's per-point reductions are compiled in the first
two (``lens.point_terms``, ``lens.final_terms``).
Then the statistics on one token in 16 (session 11: replayed from fixed-capacity token
choices refilled per batch, ``sampling.StaticBatch``) with ``subspaces`` on one in 64 (session
12: picked among the buffer's one in 16), replayed against eager. For a 16-bit model, the lens
with TF32 products (session 34, ``lens:tf32=true``) replayed against the same rounded inputs
multiplied in float32, and against the plain lens.

    python benchmarks/gpu_flow_check.py --model /tmp/smollm2-random

(``tests/test_benchmarks.py`` runs it on the CPU in float32 on a tiny model, as a check of
the script itself.)
"""

from __future__ import annotations

import argparse
import contextlib
import json
import sys
import warnings
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).parent))
from scan_speed import _batches  # noqa: E402

import residual_stream as rs  # noqa: E402
from residual_stream import fusion  # noqa: E402
from residual_stream.streaming import lens as lens_module  # noqa: E402
from residual_stream.streaming import make_accumulators  # noqa: E402
from residual_stream.streaming.adding import batch_adder  # noqa: E402
from residual_stream.streaming.lean import points  # noqa: E402

STATS = ["growth", "survival", "read_attribution", "subspaces", "lens"]
SAMPLED = ["growth", "survival:every=16", "read_attribution:every=16", "lens:every=16",
           "subspaces:every=64"]


def _scan(model, batches, graphs: bool, fused: bool, stats=STATS) -> tuple[dict, int]:
    fusion.ENABLED = fused
    try:
        accs = make_accumulators(stats)
        calibrates = any(a.calibrates for a in accs.values())  # subspaces' PCA, as a scan fixes
        calibration = points(model, batches[0]) if calibrates else None
        for a in accs.values():
            a.prepare(model, calibration)
        add = batch_adder(model, accs, graphs, batches[0].tokens.shape[1])
        for b in batches:
            add(b)
        add.flush()  # a replayed batch may wait for the next one
        return accs, add.replays
    finally:
        fusion.ENABLED = True


def _diffs(ref: dict, got: dict, stats=STATS) -> dict:
    out = {}
    for name in stats:
        for key, x in ref[name].sums.items():
            y = got[name].sums[key]
            if not x.is_floating_point():  # counts: how many moved (a histogram's tokens in
                out[f"{name}.{key}"] = float((x - y).abs().sum()) / 2  # another bin)
                continue
            scale = float(x.nan_to_num().abs().max().clamp_min(1e-30))
            out[f"{name}.{key}"] = float((x - y).nan_to_num().abs().max()) / scale
    return out


def main() -> None:
    """Scan three ways; print the differences as JSON."""
    p = argparse.ArgumentParser()
    p.add_argument("--model", default="/tmp/smollm2-random")
    p.add_argument("--device", default="cuda", help="cpu checks the script itself (no replay)")
    p.add_argument("--dtype", default="bfloat16")
    p.add_argument("--batches", type=int, default=3)
    p.add_argument("--batch-size", type=int, default=8)
    p.add_argument("--seq-len", type=int, default=128)
    args = p.parse_args()
    model = rs.load(args.model, device=args.device, dtype=args.dtype, progress=False)
    batches = _batches(model, args.batches, args.batch_size, args.seq_len)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        graphs = model.device.type == "cuda"
        replayed, replays = _scan(model, batches, graphs, True)
        fused, _ = _scan(model, batches, False, True)
        eager, _ = _scan(model, batches, False, False)
        sampled_replayed, sampled_replays = _scan(model, batches, graphs, True, SAMPLED)
        sampled_eager, _ = _scan(model, batches, False, True, SAMPLED)
        tf32 = _tf32_checks(model, batches, graphs, eager["lens"])
    print(json.dumps({"replays": replays, "batches": len(batches),
                      "warnings": [str(w.message)[:300] for w in caught],
                      "replayed_vs_eager": _diffs(eager, replayed),
                      "fused_vs_eager": _diffs(eager, fused),
                      "sampled_replays": sampled_replays,
                      "sampled_replayed_vs_eager": _diffs(sampled_eager, sampled_replayed, SAMPLED),
                      **tf32}))


def _tf32_checks(model, batches, graphs: bool, plain) -> dict:
    """``lens:tf32=true`` (session 34) of a 16-bit model, replayed, its products on the tensor cores.

    Against the same rounded inputs multiplied in float32 (only the products' additions
    differ), and against the plain lens (what the rounding moves; on the CPU
    ``benchmarks/lens_tf32.py`` measured up to 2.5e-5 of a point's mean KL).
    """
    if model.dtype not in (torch.bfloat16, torch.float16):
        return {}
    spec = "lens:tf32=True"
    tensor_cores, replays = _scan(model, batches, graphs, True, [spec])
    saved = lens_module.tf32_products
    lens_module.tf32_products = lambda device, on=True: contextlib.nullcontext()
    try:
        float32_products, _ = _scan(model, batches, False, True, [spec])
    finally:
        lens_module.tf32_products = saved
    return {"tf32_replays": replays,
            "tf32_vs_float32_products": _diffs(float32_products, tensor_cores, [spec]),
            "tf32_vs_lens": _diffs({"lens": plain}, {"lens": tensor_cores[spec]}, ["lens"])}


if __name__ == "__main__":
    main()
