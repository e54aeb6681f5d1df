"""Where a GPU scan spends its time: a diagnostic for one short device call.

For each variant (plain forward, capture, the growth statistic, the per-head decomposition)
and each batch shape it reports, side by side in this process:

* wall seconds per batch (median of rounds, device synchronized);
* the device's busy time per batch (the sum of kernel times from ``torch.profiler``), so
  wall ≫ busy means the host (Python, launches, syncs) is the bottleneck;
* how many times the host waited for the device (``torch.cuda.set_sync_debug_mode``), and
  the package's lines that waited.

Then it tries CUDA-graph capture of (a) the plain forward pass and (b) the lean pass with a
sync-free reducer (a norm per point and per walk step), and times graph replays against the
eager calls. Everything goes to stdout and ``--json``.

    python benchmarks/gpu_probe.py --model /tmp/smollm2-random --json $OUT/probe.json
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import statistics
import sys
import time
import traceback
import warnings
from collections import Counter
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).parent))
import residual_stream as rs  # noqa: E402
import residual_stream.streaming.lean as lean  # noqa: E402
from scan_speed import _batches, variants  # noqa: E402


def _wall(fn, batches, rounds: int) -> float:
    times = []
    for _ in range(rounds):
        torch.cuda.synchronize()
        t = time.perf_counter()
        for b in batches:
            fn(b)
        torch.cuda.synchronize()
        times.append((time.perf_counter() - t) / len(batches))
    return statistics.median(times)


def _busy(fn, batch) -> tuple[float, str]:
    """Device busy seconds for one call, and the top kernels table."""
    from torch.profiler import ProfilerActivity, profile
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        fn(batch)
        torch.cuda.synchronize()
    avgs = prof.key_averages()
    key = "self_device_time_total" if hasattr(avgs[0], "self_device_time_total") else "self_cuda_time_total"
    busy = sum(getattr(k, key) for k in avgs) / 1e6
    return busy, avgs.table(sort_by=key, row_limit=12)


def _syncs(fn, batch) -> tuple[int, list]:
    """How many times the host waited for the device in one call, and where (our frames)."""
    where: Counter = Counter()
    n = 0
    orig = warnings.showwarning

    def show(message, category, filename, lineno, file=None, line=None):
        nonlocal n
        n += 1
        frames = [f for f in traceback.extract_stack()[:-2]
                  if "residual_stream" in f.filename or "transformers" in f.filename]
        if frames:
            f = frames[-1]
            where[f"{Path(f.filename).name}:{f.lineno} {f.line}"] += 1

    torch.cuda.synchronize()
    with warnings.catch_warnings():
        warnings.simplefilter("always")
        warnings.showwarning = show
        torch.cuda.set_sync_debug_mode("warn")
        try:
            fn(batch)
        finally:
            torch.cuda.set_sync_debug_mode("default")
            warnings.showwarning = orig
    return n, where.most_common(12)


class _Norms:
    """A sync-free reducer: the stream's norm per point and each write's norm per step."""

    def __init__(self) -> None:
        self.out = []

    def point(self, point, x):
        self.out.append(torch.linalg.vector_norm(x, dim=-1))

    def step(self, step, scales):
        if step.added is not None:
            self.out.append(torch.linalg.vector_norm(step.added, dim=-1))


def _graph(fn, rounds: int = 20) -> dict:
    """Capture ``fn`` (no arguments, returns tensors) in a CUDA graph; time eager vs replay."""
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for _ in range(3):
            fn()
    torch.cuda.current_stream().wait_stream(s)
    torch.cuda.synchronize()
    eager_out = fn()
    eager_out = [t.clone() for t in eager_out]
    g = torch.cuda.CUDAGraph()
    try:
        with torch.cuda.graph(g):
            out = fn()
    except Exception as e:  # noqa: BLE001 - report why capture failed
        return {"ok": False, "error": f"{type(e).__name__}: {e}"[:600]}
    g.replay()
    torch.cuda.synchronize()
    err = max(float((a.float() - b.float()).abs().max()) for a, b in zip(out, eager_out, strict=True))
    t_e, t_g = [], []
    for _ in range(rounds):
        torch.cuda.synchronize()
        t = time.perf_counter()
        fn()
        torch.cuda.synchronize()
        t_e.append(time.perf_counter() - t)
        t = time.perf_counter()
        g.replay()
        torch.cuda.synchronize()
        t_g.append(time.perf_counter() - t)
    return {"ok": True, "max_abs_diff": err, "eager_s": statistics.median(t_e),
            "replay_s": statistics.median(t_g), "outputs": len(out)}


def main() -> None:
    """Run every probe; print a summary and write JSON."""
    p = argparse.ArgumentParser()
    p.add_argument("--model", default="/tmp/smollm2-random")
    p.add_argument("--json")
    p.add_argument("--rounds", type=int, default=5)
    args = p.parse_args()
    model = rs.load(args.model, device="cuda", dtype="bfloat16", progress=False)
    fns = variants(model, use_tl=False)
    names = ["hf_forward", "rs_capture", "rs_stats", "rs_decompose", "rs_stats_flow"]
    report: dict = {"device": torch.cuda.get_device_name(), "torch": torch.__version__, "shapes": {}}
    for bs, seq, n in [(8, 128, 8), (32, 512, 4)]:
        batches = _batches(model, n, bs, seq)
        rows = {}
        for name in names:
            fn = fns[name]
            try:
                fn(batches[0])
                wall = _wall(fn, batches, args.rounds)
                busy, table = _busy(fn, batches[0])
                nsync, where = _syncs(fn, batches[0])
                rows[name] = {"wall_s": wall, "busy_s": busy, "syncs": nsync, "where": where,
                              "table": table}
            except Exception as e:  # noqa: BLE001 - keep probing the rest
                rows[name] = {"error": f"{type(e).__name__}: {e}"[:600]}
        report["shapes"][f"{bs}x{seq}"] = rows
        base = rows["hf_forward"].get("wall_s", float("nan"))
        print(f"\n## {bs}×{seq}\n\n| variant | wall s | × forward | device busy s | busy/wall | syncs |")
        print("|---|---|---|---|---|---|")
        for name, r in rows.items():
            if "error" in r:
                print(f"| {name} | error: {r['error'][:200]} |||||")
                continue
            print(f"| {name} | {r['wall_s']:.4g} | ×{r['wall_s'] / base:.2f} | {r['busy_s']:.4g} | "
                  f"{r['busy_s'] / r['wall_s']:.2f} | {r['syncs']} |")
        for name in ("rs_stats", "rs_capture"):
            for w, c in rows[name].get("where", []):
                print(f"  sync {name}: {c}× {w}")
        print(rows["rs_stats"].get("table", ""))

        b0 = batches[0]
        dev_batch = dataclasses.replace(b0, tokens=b0.tokens.to(model.device),
                                        attention_mask=b0.attention_mask.to(model.device))
        tok, mask = dev_batch.tokens, dev_batch.attention_mask
        graphs = {}

        def forward():
            with torch.inference_mode():
                return [model.module(input_ids=tok, attention_mask=mask, use_cache=False).logits]

        def forward_nomask():
            with torch.inference_mode():
                return [model.module(input_ids=tok, use_cache=False).logits]

        def lean_norms():
            r = _Norms()
            saved = lean._check_finite
            lean._check_finite = lambda sums, m: None
            try:
                lean.lean_pass(model, dev_batch, [r])
            finally:
                lean._check_finite = saved
            return r.out

        for gname, gfn in [("forward", forward), ("forward_nomask", forward_nomask),
                           ("lean_norms", lean_norms)]:
            try:
                graphs[gname] = _graph(gfn)
            except Exception as e:  # noqa: BLE001
                graphs[gname] = {"ok": False, "error": f"outside capture: {type(e).__name__}: {e}"[:600]}
            print(f"graph {gname}: {json.dumps(graphs[gname])}")
        report["shapes"][f"{bs}x{seq}"]["graphs"] = graphs
    if args.json:
        with open(args.json, "w") as f:
            json.dump(report, f, indent=1, default=str)


if __name__ == "__main__":
    main()
