"""The every-token lens's eager reductions at an earlier commit against the working tree's.

Run side by side in one process, interleaved by rounds with the plain forward pass: the lens
statistic scanned with ``LensSums.logits`` and ``LensSums._reduce`` (the final logits' terms,
and each point's) taken from ``streaming/lens.py`` as it stood at ``--before`` (loaded from
git as a module of its own, so its helpers are its own), then as they are now. Everything
else (the lean pass, the unembedding, the accumulators) is the working tree's. Run times of
separate processes on this 2-core machine drift by more than the change measured here
(session 35: the same lens ×23.6 and ×25.5 in two runs), hence one process.

    python benchmarks/lens_ab.py --before 3a37b33 [--batch-size 8] [--seq-len 512] [--rounds 3]
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from scan_speed import _batches, _sync, variants  # noqa: E402

import residual_stream as rs  # noqa: E402
from residual_stream.streaming import lens  # noqa: E402

SWAPPED = ("logits", "_reduce")  # the LensSums methods taken from the earlier commit


def lens_at(rev: str):
    """``residual_stream/streaming/lens.py`` at git revision ``rev``, as a module of its own."""
    root = Path(__file__).resolve().parent.parent
    source = subprocess.run(["git", "show", f"{rev}:residual_stream/streaming/lens.py"], cwd=root,
                            capture_output=True, text=True, check=True).stdout
    source = re.sub(r"^from \.\.(\w*)", lambda m: "from residual_stream" + (m[1] and f".{m[1]}"),
                    source, flags=re.M)  # ``from .. import x`` and ``from ..y import x``
    source = re.sub(r"^from \.(\w+)", r"from residual_stream.streaming.\1", source, flags=re.M)
    path = Path(tempfile.mkdtemp()) / "lens_before.py"
    path.write_text(source, encoding="utf-8")
    spec = importlib.util.spec_from_file_location("lens_before", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def main() -> None:
    """Time the plain forward, the lens before and the lens now, interleaved; print and write JSON."""
    p = argparse.ArgumentParser()
    p.add_argument("--before", required=True, help="git revision of the earlier lens.py")
    p.add_argument("--model", default="smollm2-135m")
    p.add_argument("--dtype", default="bfloat16")
    p.add_argument("--batch-size", type=int, default=8)
    p.add_argument("--seq-len", type=int, default=512)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--json")
    args = p.parse_args()
    before = lens_at(args.before)
    now = {name: getattr(lens.LensSums, name) for name in SWAPPED}
    then = {name: getattr(before.LensSums, name) for name in SWAPPED}
    model = rs.load(args.model, dtype=args.dtype, progress=False)
    batch = _batches(model, 1, args.batch_size, args.seq_len)[0]
    fns = variants(model, False)
    runs = {"hf_forward": (now, fns["hf_forward"]), f"lens at {args.before}": (then, fns["rs_lens"]),
            "lens now": (now, fns["rs_lens"])}
    times: dict[str, list[float]] = {name: [] for name in runs}
    try:
        for r in range(args.rounds + 1):  # round 0 warms up
            for name, (methods, fn) in runs.items():
                for attr, method in methods.items():
                    setattr(lens.LensSums, attr, method)
                _sync(model.device)
                t = time.perf_counter()
                fn(batch)
                _sync(model.device)
                if r:
                    times[name].append(time.perf_counter() - t)
    finally:
        for attr, method in now.items():
            setattr(lens.LensSums, attr, method)
    base = statistics.median(times["hf_forward"])
    tokens = int(batch.attention_mask.sum())
    print(f"model {model.name}, {model.dtype}, 1 batch of {args.batch_size}×{args.seq_len} "
          f"({tokens} tokens), {args.rounds} rounds\n")
    print("| variant | s / batch (median) | range | × plain forward |\n|---|---|---|---|")
    rows = []
    for name, ts in times.items():
        med = statistics.median(ts)
        rows.append({"variant": name, "seconds": med, "ratio": med / base, "all_seconds": ts})
        print(f"| {name} | {med:.3g} | {min(ts):.3g}–{max(ts):.3g} | ×{med / base:.2f} |")
    if args.json:
        Path(args.json).write_text(json.dumps({"model": model.name, "dtype": str(model.dtype),
                                               "tokens": tokens, "rows": rows}, indent=1))


if __name__ == "__main__":
    main()
