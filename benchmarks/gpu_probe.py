"""Where a GPU scan spends its time, and whether its replayed path is right: one device call.

For each variant (the plain forward; the plain forward replayed as a CUDA graph, the baseline
of the statistics' own share, with and without the full unembedding (``logits_to_keep=1``, as
the lean pass runs it); the growth statistic replayed from CUDA graphs with
fused reductions, as ``rs.scan`` runs it; the same run eagerly; eagerly without fusion; a
trace, and a trace with the per-head decomposition of its last point) and each batch shape
it reports, side by side in this process:

* wall seconds per batch (median of rounds, device synchronized);
* the device's busy time per batch (the sum of kernel times from ``torch.profiler``), so
  wall ≫ busy means the host (Python, launches, syncs) is the bottleneck;
* how many times the host waited for the device (``torch.cuda.set_sync_debug_mode``), and
  the package's lines that waited.

Then it checks the replayed, fused growth scan against the eager unfused one on the same
batches (every sum; tolerance is the reader's: bf16 attention under a captured mask may
round differently). Everything goes to stdout and ``--json``.

    python benchmarks/gpu_probe.py --model /tmp/smollm2-random --json $OUT/probe.json
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
import sys
import time
import traceback
import warnings
from collections import Counter
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).parent))
from scan_speed import _batches, variants  # noqa: E402

import residual_stream as rs  # noqa: E402
from residual_stream import fusion  # noqa: E402
from residual_stream.streaming import make_accumulators  # noqa: E402
from residual_stream.streaming.adding import add_batch as _add_batch  # noqa: E402
from residual_stream.streaming.adding import batch_adder


def replayed_forward(model, **extra):
    """The plain forward as a CUDA graph, captured on the first batch (static buffers).

    What the replayed scan's own forward costs, so ``rs_stats`` over it is the statistics'
    share alone; ``extra`` goes to the forward (``logits_to_keep=1``: the headless forward
    that the lean pass runs when no statistic reads logits).
    """
    from residual_stream.streaming.graphs import record

    shapes: dict = {}
    dev = model.device

    def run(batch):
        state = shapes.setdefault(tuple(batch.tokens.shape), {})  # one graph per batch shape
        if not state:
            state["tokens"] = batch.tokens.to(dev).clone()
            state["mask"] = batch.attention_mask.to(dev).clone()

            def fwd():
                with torch.inference_mode():
                    return model.module(input_ids=state["tokens"], attention_mask=state["mask"],
                                        use_cache=False, **extra)
            state["graph"], _ = record(fwd, dev)
        state["tokens"].copy_(batch.tokens, non_blocking=True)
        state["mask"].copy_(batch.attention_mask, non_blocking=True)
        state["graph"].replay()
    return run


def _wall(fn, batches, rounds: int) -> list[float]:
    """Seconds per batch of each round (device synchronized)."""
    times = []
    for _ in range(rounds):
        torch.cuda.synchronize()
        t = time.perf_counter()
        for b in batches:
            fn(b)
        torch.cuda.synchronize()
        times.append((time.perf_counter() - t) / len(batches))
    return times


def _profile(fn, batch) -> tuple[str, str]:
    """The profiler's tables of one call: by device time, and by the host's own time.

    The first lists the top kernels (its last line is the device total); the second, where
    the host spends its time (``cudaMalloc``, waits, launches).
    """
    from torch.profiler import ProfilerActivity, profile
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        fn(batch)
        torch.cuda.synchronize()
    avgs = prof.key_averages()
    key = "self_device_time_total" if hasattr(avgs[0], "self_device_time_total") else "self_cuda_time_total"
    return avgs.table(sort_by=key, row_limit=20), avgs.table(sort_by="self_cpu_time_total", row_limit=12)


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


def _compare(model, batches) -> dict:
    """The replayed growth scan (CUDA graphs, fused reductions) against the eager unfused one.

    Per sum: the largest difference relative to its largest entry (integers: how many differ).
    """
    eager, replayed = make_accumulators(["growth"]), make_accumulators(["growth"])
    fusion.ENABLED = False
    for b in batches:
        _add_batch(model, b, eager)
    fusion.ENABLED = True
    add = batch_adder(model, replayed, True, batches[0].tokens.shape[1])
    for b in batches:
        add(b)
    add.flush()  # the last replayed batch waits for a next one
    a, r = eager["growth"], replayed["growth"]
    out = {}
    for key, x in a.sums.items():
        y = r.sums[key]
        if x.is_floating_point():
            scale = float(x.abs().max().clamp_min(1e-30))
            out[key] = float((x - y).abs().nan_to_num(0).max()) / scale
        else:
            out[key] = int((x != y).sum())
    out["replays"] = add.replays
    return out


def _measure(fn, batches, rounds: int) -> dict:
    """Wall time, device busy time, host waits and first-batch time of one variant."""
    try:
        t = time.perf_counter()
        fn(batches[0])  # warm-up (captures the graph, compiles the fused reductions)
        torch.cuda.synchronize()
        first = time.perf_counter() - t
        walls = _wall(fn, batches, rounds)
        table, host = _profile(fn, batches[1])
        nsync, where = _syncs(fn, batches[1])
        return {"wall_s": statistics.median(walls), "walls_s": walls, "busy_s": _busy_of(table),
                "syncs": nsync, "where": where, "first_s": first, "table": table, "host_table": host}
    except Exception as e:  # noqa: BLE001 - keep probing the rest
        return {"error": f"{type(e).__name__}: {e}"[:800]}


def _busy_of(table: str) -> float:
    m = re.search(r"Self CUDA time total: ([\d.]+)(us|ms|s)", table)
    return float(m.group(1)) * {"us": 1e-6, "ms": 1e-3, "s": 1.0}[m.group(2)] if m else float("nan")


def _print_shape(rows: dict, names: list[str], shape: str) -> None:
    """One shape's summary table, host waits, check and kernel tables, as Markdown."""
    base = rows["hf_forward"].get("wall_s", float("nan"))
    print(f"\n## {shape}\n\n| variant | wall s / batch | × plain forward | device busy s "
          "| busy/wall | host waits | first batch s |")
    print("|---|---|---|---|---|---|---|")
    for name in names:
        r = rows[name]
        if "error" in r:
            print(f"| {name} | error: {r['error'][:300]} ||||||")
            continue
        print(f"| {name} | {r['wall_s']:.4g} | ×{r['wall_s'] / base:.2f} | {r['busy_s']:.4g} | "
              f"{r['busy_s'] / r['wall_s']:.2f} | {r['syncs']} | {r['first_s']:.3g} |")
    for name in ("rs_stats", "rs_stats_eager"):
        for w, c in rows[name].get("where", []):
            print(f"  wait {name}: {c}× {w}")
    print("check (replayed+fused vs eager unfused, max |diff| / max |value| per sum):",
          json.dumps(rows["check"]))
    for name in ("hf_forward", "rs_stats", "rs_capture", "rs_decompose"):
        print(f"\n### kernels: {name}\n")
        print(rows[name].get("table", ""))
    for name in ("rs_capture", "rs_decompose"):  # rounds' spread (s33: 2.16–2.54), host time
        print(f"\n### rounds and host time: {name}\n\nseconds per batch by round: "
              + ", ".join(f"{t:.4g}" for t in rows[name].get("walls_s", [])) + "\n")
        print(rows[name].get("host_table", ""))


def _head_products(model, tokens: int, rounds: int = 5) -> dict:
    """What-if: one batch's per-head write products in float32, against 16-bit inputs.

    The decomposition makes every head's write ``z_h @ W_O[h]`` (``weights.head_writes``) in
    float32, which a GPU runs on its CUDA cores. A bf16 model's ``z`` and ``W_O`` are bf16
    values, so ``torch.bmm(z, W_O, out_dtype=torch.float32)`` (tensor cores, float32
    accumulation) makes the same products up to the order of additions. Timed here over
    ``n_layers`` products of ``tokens`` tokens (one decomposition's), with their largest
    difference relative to the largest entry: whether the decomposition should use it.
    """
    from residual_stream.weights import attn_W_O

    anatomy, dev = model.anatomy, model.device
    module = model.module.get_submodule(anatomy.modules.attn_out[0])
    W = attn_W_O(module, anatomy.n_heads).to(dev, torch.bfloat16)          # (head, d_head, d)
    z = torch.randn(anatomy.n_heads, tokens, W.shape[1], device=dev).to(torch.bfloat16)
    runs = {"float32": lambda: torch.bmm(z.float(), W.float()),
            "bf16_in_float32_out": lambda: torch.bmm(z, W, out_dtype=torch.float32)}
    out: dict = {"tokens": tokens, "products": anatomy.n_layers}
    try:
        ref, mixed = runs["float32"](), runs["bf16_in_float32_out"]()
        out["max_rel_diff"] = float((ref - mixed).abs().max() / ref.abs().max())
        layers = range(anatomy.n_layers)  # ``_wall`` gives seconds per item: per layer here
        for name, fn in runs.items():
            out[f"{name}_s"] = statistics.median(_wall(lambda _, f=fn: f(), layers, rounds)) * len(layers)
    except Exception as e:  # noqa: BLE001 - a what-if: report, keep probing
        out["error"] = f"{type(e).__name__}: {e}"[:300]
    return out


def main() -> None:
    """Run every probe; print a summary and write JSON."""
    p = argparse.ArgumentParser()
    p.add_argument("--model", default="/tmp/smollm2-random")
    p.add_argument("--json")
    p.add_argument("--rounds", type=int, default=5)
    args = p.parse_args()
    model = rs.load(args.model, device="cuda", dtype="bfloat16", progress=False)
    fns = variants(model, use_tl=False)
    unfused_eager = fns["rs_stats_eager"]

    def unfused(batch):
        fusion.ENABLED = False
        try:
            unfused_eager(batch)
        finally:
            fusion.ENABLED = True

    fns = {"hf_forward": fns["hf_forward"], "hf_forward_replayed": replayed_forward(model),
           "hf_headless_replayed": replayed_forward(model, logits_to_keep=1),
           "rs_stats": fns["rs_stats"],
           "rs_stats_eager": variants(model, use_tl=False)["rs_stats_eager"],
           "rs_stats_unfused": unfused,
           # the per-head decomposition (×2.54 at 32×512 in session 33, target ×2): a trace,
           # then the trace decomposed; their kernel tables say where its time goes
           "rs_capture": fns["rs_capture"], "rs_decompose": fns["rs_decompose"]}
    report: dict = {"device": torch.cuda.get_device_name(), "torch": torch.__version__, "shapes": {}}
    for bs, seq, n in [(8, 128, 8), (32, 512, 4)]:
        batches = _batches(model, n, bs, seq)
        rows = {name: _measure(fn, batches, args.rounds) for name, fn in fns.items()}
        try:
            rows["check"] = _compare(model, batches)
        except Exception as e:  # noqa: BLE001
            rows["check"] = {"error": f"{type(e).__name__}: {e}"[:800]}
        report["shapes"][f"{bs}x{seq}"] = rows
        _print_shape(rows, list(fns), f"{bs}×{seq}")
    report["head_products"] = _head_products(model, 32 * 512)
    print("\nhead-write products of one 32×512 decomposition (float32 vs bf16 in, float32 out):",
          json.dumps(report["head_products"]))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(report, f, indent=1, default=str)


if __name__ == "__main__":
    main()
