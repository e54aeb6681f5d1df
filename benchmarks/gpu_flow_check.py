"""The flow statistics with fused reductions (as a GPU scan runs them) against the eager ones.

Survival's per-mark dot products compile into one kernel on a GPU (``flow.token_dots``); this
scans the same batches with ``fusion.ENABLED`` on and off and prints, per sum, the largest
difference relative to the sum's largest entry, as one JSON line.

    python benchmarks/gpu_flow_check.py --model /tmp/smollm2-random
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from scan_speed import _batches  # noqa: E402

import residual_stream as rs  # noqa: E402
from residual_stream import fusion  # noqa: E402
from residual_stream.streaming import make_accumulators  # noqa: E402
from residual_stream.streaming.runner import _add_batch  # noqa: E402

STATS = ["survival", "read_attribution"]


def main() -> None:
    """Scan fused and eager; print the differences as JSON."""
    p = argparse.ArgumentParser()
    p.add_argument("--model", default="/tmp/smollm2-random")
    p.add_argument("--device", default="cuda", help="cpu checks the script itself")
    args = p.parse_args()
    model = rs.load(args.model, device=args.device, dtype="bfloat16", progress=False)
    batches = _batches(model, 3, 8, 128)
    out = {}
    for enabled in (True, False):
        fusion.ENABLED = enabled
        accs = make_accumulators(STATS)
        for b in batches:
            _add_batch(model, b, 0, accs)
        out[enabled] = accs
    fusion.ENABLED = True
    diffs = {}
    for name in STATS:
        for key, x in out[False][name].sums.items():
            y = out[True][name].sums[key]
            scale = float(x.nan_to_num().abs().max().clamp_min(1e-30))
            diffs[f"{name}.{key}"] = float((x - y).nan_to_num().abs().max()) / scale
    print(json.dumps(diffs))


if __name__ == "__main__":
    main()
