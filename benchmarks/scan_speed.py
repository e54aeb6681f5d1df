"""Scan speed and memory against a plain Hugging Face forward pass and TransformerLens.

Every variant runs over the same batches in this one process, in interleaved rounds, and
is reported as the median seconds per batch and the ratio to the plain forward pass (SDPA
attention, ``torch.inference_mode``):

* ``hf_forward``: the baseline;
* ``hf_headless``: the same forward with ``logits_to_keep=1`` (the last position unembedded
  only), as the lean pass runs it when no statistic reads logits: a stricter baseline,
  the statistics' own cost without the skipped ``[tokens, vocab]`` product;
* ``rs_capture``: ``trace_batch`` (hooks keep the stream, z, MLP outputs, norm scales);
* ``rs_stats``: the ``growth`` statistic as ``rs.scan`` computes it: the lean pass, reduced
  block by block inside the forward pass (norms, update sizes, norm inputs, centering share,
  massive activations): "statistics alone"; on a CUDA device replayed from a CUDA graph per
  batch shape (``streaming.graphs``), captured on the warm-up batch;
* ``rs_stats_eager``: the same with ``graphs=False`` (the lean pass run eagerly every batch);
* ``rs_survival`` / ``rs_read``: ``survival`` / ``read_attribution`` alone, lean (component
  granularity: contributions carried in one buffer, ``streaming.flow``);
* ``rs_survival_every16`` / ``rs_read_every16``: survival / read attribution on one token
  in 16 (``survival:every=16``, ``read_attribution:every=16``: contributions carried for the
  chosen tokens only, the statistic's products on them);
* ``rs_flow_every16``: ``survival:every=16`` and ``read_attribution:every=16`` together (one
  buffer of the chosen tokens);
* ``rs_read16_sub64``: ``read_attribution:every=16`` beside ``subspaces:every=64``, the rates
  at which each met ×1.1 on the CPU (session 10): nested samples, so one buffer of the tokens
  chosen one in 16 (the greatest common divisor) serves both;
* ``rs_stats_flow``: ``growth``, ``survival`` and ``read_attribution`` together, lean;
* ``rs_lens``: the ``lens`` statistic, lean (a plain forward pass for the logits, then each
  point reduced against them as it arrives, in token chunks of at most ``lens.MAX_CHUNK``);
* ``rs_lens_chunk256``: the same in chunks of at most 256 tokens (512 by default): what
  halving the lens's ``[chunk, d_vocab]`` temporaries saves in memory and costs in launches;
* ``rs_lens_every16`` / ``rs_lens_every64``: the lens on one token in 16 / 64
  (``lens:every=16``: the sampled tokens' points kept, the logits from the same pass);
* ``rs_lens_tf32`` (16-bit models only): ``lens:tf32=true``, the unembeddings' inputs
  rounded to TF32 and, on a GPU, their products on the tensor cores (``lens.tf32_round``);
* ``rs_subspaces``: the ``subspaces`` statistic, lean (every write's energy in the named
  subspaces, in every head's write space and in every later reader's read space, measured
  from the flow buffer; its PCA and bases fixed once, on the warm-up batch, as a scan does);
* ``rs_subspaces_every16`` / ``rs_subspaces_every64``: ``subspaces:every=16`` / ``=64``
  (the measures on one token in 16 / 64);
* ``rs_decompose``: capture + the full per-head decomposition of the last point;
* ``tl_cache_all`` / ``tl_cache_resid``: TransformerLens ``run_with_cache`` on a bridge booted
  on a private copy of the model, with every hook / residual hooks only (as users call it,
  autograd left on);
* ``tl_decompose_resid``: ``run_with_cache`` + ``cache.decompose_resid()``.

Memory (``--memory``): each variant runs in a fresh subprocess over ``--batches`` batches and
reports its peak: on CUDA ``torch.cuda.max_memory_allocated``; on the CPU the resident set
sampled every millisecond during the run; both also as the increase over the loaded model.
``--memory-jobs N`` runs N of those subprocesses at once (each peak is its own process's; on a
GPU this shortens a device call, the subprocesses' start and compiles being most of it).

    python benchmarks/scan_speed.py [--model smollm2-135m] [--batches 4] [--batch-size 8]
        [--seq-len 128] [--rounds 3] [--device auto] [--memory] [--memory-jobs 1] [--no-tl]
"""

from __future__ import annotations

import argparse
import copy
import ctypes
import json
import os
import resource
import statistics
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import torch

import residual_stream as rs
from residual_stream.streaming import Corpus, corpus_batches, lens, make_accumulators
from residual_stream.streaming.adding import batch_adder
from residual_stream.streaming.lean import points
from residual_stream.trace import trace_batch


def _batches(model, n: int, batch_size: int, seq_len: int) -> list:
    text = " ".join(Corpus("builtin").texts())  # one long text: every row is seq_len tokens
    out = [b for b in corpus_batches(model, Corpus([text] * 50), batch_size=batch_size,
                                        seq_len=seq_len)]
    return out[:n]


def _sync(device) -> None:
    if torch.device(device).type == "cuda":
        torch.cuda.synchronize()


def _max_chunk(fn, tokens: int):
    """``fn`` with the lens's token chunks capped at ``tokens`` (``lens.MAX_CHUNK``) while it runs."""
    def run(batch):
        before = lens.MAX_CHUNK
        lens.MAX_CHUNK = tokens
        try:
            fn(batch)
        finally:
            lens.MAX_CHUNK = before
    return run


def variants(model, use_tl: bool, copy_for_tl: bool = True) -> dict:
    """Variant name → function of one batch.

    The bridge boots on a copy of the model (booting changes the model in place) unless
    ``copy_for_tl`` is False (a memory subprocess that runs one TransformerLens variant only).
    """
    dev = model.device

    def hf_forward(batch):
        with torch.inference_mode():
            model.module(input_ids=batch.tokens.to(dev), attention_mask=batch.attention_mask.to(dev),
                         use_cache=False)

    def hf_headless(batch):
        with torch.inference_mode():
            model.module(input_ids=batch.tokens.to(dev), attention_mask=batch.attention_mask.to(dev),
                         use_cache=False, logits_to_keep=1)

    def stats(names, graphs="auto"):
        accs: dict = {}  # made and calibrated on the first batch, as a scan does, then reused
        add: list = []

        def run(batch):  # what rs.scan does per batch (replayed, or the lean pass, or a trace)
            if not accs:
                accs.update(make_accumulators(names))
                calibrates = any(a.calibrates for a in accs.values())
                for a in accs.values():
                    a.prepare(model, points(model, batch) if calibrates else None)
                add.append(batch_adder(model, accs, graphs, batch.tokens.shape[1]))
            add[0](batch)
        return run

    def decompose(batch):
        trace_batch(model, batch).decompose(model.anatomy.n_layers)

    out = {"hf_forward": hf_forward, "hf_headless": hf_headless,
           "rs_capture": lambda b: trace_batch(model, b),
           "rs_stats": stats(["growth"]), "rs_stats_eager": stats(["growth"], graphs=False),
           "rs_survival": stats(["survival"]),
           "rs_read": stats(["read_attribution"]),
           "rs_read_every16": stats(["read_attribution:every=16"]),
           "rs_survival_every16": stats(["survival:every=16"]),
           "rs_flow_every16": stats(["survival:every=16", "read_attribution:every=16"]),
           "rs_read16_sub64": stats(["read_attribution:every=16", "subspaces:every=64"]),
           "rs_stats_flow": stats(["growth", "survival", "read_attribution"]),
           "rs_lens": stats(["lens"]), "rs_lens_chunk256": _max_chunk(stats(["lens"]), 256),
           "rs_lens_every16": stats(["lens:every=16"]),
           "rs_lens_every64": stats(["lens:every=64"]), "rs_subspaces": stats(["subspaces"]),
           "rs_subspaces_every16": stats(["subspaces:every=16"]),
           "rs_subspaces_every64": stats(["subspaces:every=64"]),
           "rs_decompose": decompose}
    if model.dtype in (torch.bfloat16, torch.float16):  # lens:tf32 reads a 16-bit W_U exactly
        out["rs_lens_tf32"] = stats(["lens:tf32=true"])
    if use_tl:
        from residual_stream.tl_compat import boot_bridge

        hf = copy.deepcopy(model.module) if copy_for_tl else model.module
        bridge = boot_bridge(hf, model.tokenizer, "smollm2", str(dev))
        n = model.anatomy.n_layers
        resid = {f"blocks.{L}.hook_resid_pre" for L in range(n)} | {f"blocks.{n - 1}.hook_resid_post"}
        out["tl_cache_all"] = lambda b: bridge.run_with_cache(b.tokens.to(dev))
        out["tl_cache_resid"] = lambda b: bridge.run_with_cache(b.tokens.to(dev),
                                                                names_filter=lambda h: h in resid)
        out["tl_decompose_resid"] = lambda b: bridge.run_with_cache(b.tokens.to(dev))[1].decompose_resid()
    return out


def _rss_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * resource.getpagesize()


class _PeakRss:
    """Peak resident set while the block runs, sampled every millisecond by a thread."""

    def __enter__(self):
        ctypes.CDLL("libc.so.6").malloc_trim(0)  # hand freed loading buffers back to the OS first
        self.base = self.peak = _rss_bytes()
        self.running = True
        self.thread = threading.Thread(target=self._sample, daemon=True)
        self.thread.start()
        return self

    def _sample(self) -> None:
        while self.running:
            self.peak = max(self.peak, _rss_bytes())
            time.sleep(0.001)

    def __exit__(self, *exc) -> None:
        self.running = False
        self.thread.join()
        self.peak = max(self.peak, _rss_bytes())


def memory_of(args, name: str) -> dict:
    """Run one variant in this (fresh) process and report its peak memory.

    CUDA: ``max_memory_allocated`` over the run and its increase over the loaded model. CPU:
    the resident set sampled every millisecond during the run (after ``malloc_trim``, with a
    fixed glibc mmap threshold so that freed blocks leave it), and its increase over the
    resident set just before it.
    """
    model = rs.load(args.model, device=args.device, dtype=args.dtype, progress=False)
    batches = _batches(model, args.batches, args.batch_size, args.seq_len)
    tl = name.startswith("tl_")
    fn = variants(model, tl, copy_for_tl=False)[name]  # no second copy of the weights in memory
    if model.device.type == "cuda":
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        base = torch.cuda.memory_allocated()
        for b in batches:
            fn(b)
        torch.cuda.synchronize()
        peak = torch.cuda.max_memory_allocated()
        return {"variant": name, "peak_bytes": peak, "over_loaded_bytes": peak - base}
    with _PeakRss() as rss:
        for b in batches:
            fn(b)
    return {"variant": name, "peak_bytes": rss.peak, "over_loaded_bytes": rss.peak - rss.base}


def _memory_run(args, name: str) -> dict:
    """``memory_of(name)`` in a fresh subprocess; its stderr's tail in the error if it fails."""
    cmd = [sys.executable, __file__, "--only-memory-of", name, "--model", args.model,
           "--batches", str(args.batches), "--batch-size", str(args.batch_size),
           "--seq-len", str(args.seq_len), "--device", args.device, "--dtype", args.dtype]
    # glibc keeps freed heap memory in the resident set once its mmap threshold has grown;
    # a fixed threshold returns every large block at free, so the sampled RSS is live memory
    env = dict(os.environ, MALLOC_MMAP_THRESHOLD_="65536")
    done = subprocess.run(cmd, capture_output=True, text=True, env=env)
    if done.returncode:
        raise RuntimeError(f"the memory run of {name} failed ({done.returncode}): {done.stderr[-2000:]}")
    m = json.loads(done.stdout.strip().splitlines()[-1])
    _progress(f"memory {name}: peak {m['peak_bytes'] / 2**20:,.0f} MiB, "
              f"{m['over_loaded_bytes'] / 2**20:,.0f} MiB over the loaded model")
    return m


def measure_memory(args, names: list[str]) -> list[dict]:
    """Peak memory of each variant, each in a fresh subprocess; prints a Markdown table.

    ``args.memory_jobs`` subprocesses run at once: each reports its own peak (CUDA's
    ``max_memory_allocated`` is per process, and so is a resident set), so running them
    side by side changes how long they take, not what they report.
    """
    with ThreadPoolExecutor(max_workers=max(1, args.memory_jobs)) as pool:
        memory = list(pool.map(lambda name: _memory_run(args, name), names))
    base_peak = memory[0]["peak_bytes"]
    base_over = memory[0]["over_loaded_bytes"]
    print("\n| variant | peak memory | over the loaded model | × plain forward (peak) "
          "| × plain forward (over) |")
    print("|---|---|---|---|---|")
    for m in memory:
        print(f"| {m['variant']} | {m['peak_bytes'] / 2**20:,.0f} MiB | "
              f"{m['over_loaded_bytes'] / 2**20:,.0f} MiB | ×{m['peak_bytes'] / base_peak:.2f} | "
              f"×{m['over_loaded_bytes'] / base_over:.2f} |")
    return memory


def _progress(line: str) -> None:
    """A line on stderr at once: a device call cut short still shows what was measured."""
    print(line, file=sys.stderr, flush=True)


def main() -> None:
    """Time every variant (and optionally measure memory); print Markdown tables and JSON."""
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default="smollm2-135m")
    p.add_argument("--batches", type=int, default=4)
    p.add_argument("--batch-size", type=int, default=8)
    p.add_argument("--seq-len", type=int, default=128)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--device", default="auto")
    p.add_argument("--dtype", default="auto")
    p.add_argument("--memory", action="store_true", help="also measure peak memory per variant")
    p.add_argument("--memory-jobs", type=int, default=1,
                   help="memory subprocesses run at once (each reports its own peak)")
    p.add_argument("--no-tl", action="store_true", help="skip the TransformerLens baselines")
    p.add_argument("--variants", help="comma-separated subset of the variants (hf_forward first)")
    p.add_argument("--only-memory-of", help=argparse.SUPPRESS)
    p.add_argument("--json", help="write the figures here too")
    args = p.parse_args()
    if args.only_memory_of:
        print(json.dumps(memory_of(args, args.only_memory_of)))
        return
    model = rs.load(args.model, device=args.device, dtype=args.dtype, progress=False)
    batches = _batches(model, args.batches, args.batch_size, args.seq_len)
    tokens = sum(int(b.attention_mask.sum()) for b in batches)
    fns = variants(model, not args.no_tl and (not args.variants or "tl_" in args.variants))
    if args.variants:
        fns = {n: fns[n] for n in args.variants.split(",")}
    for name, fn in fns.items():  # warm up every path once (captures, compiles)
        t = time.perf_counter()
        fn(batches[0])
        _sync(model.device)
        _progress(f"warm-up {name}: {time.perf_counter() - t:.3g} s")
    times: dict[str, list[float]] = {n: [] for n in fns}
    for r in range(args.rounds):
        for name, fn in fns.items():
            _sync(model.device)
            t = time.perf_counter()
            for b in batches:
                fn(b)
            _sync(model.device)
            times[name].append((time.perf_counter() - t) / len(batches))
        _progress(f"round {r + 1}: " + ", ".join(f"{n} {ts[-1]:.4g} s" for n, ts in times.items()))
    base = statistics.median(times["hf_forward"])
    headless = statistics.median(times["hf_headless"]) if "hf_headless" in times else float("nan")
    print(f"model {model.name}, {model.device}, {model.dtype}, {torch.get_num_threads()} threads, "
          f"{len(batches)} batches of {args.batch_size}×{args.seq_len} ({tokens} tokens)\n")
    print("| variant | s / batch (median of rounds) | range | × plain forward | × headless | tokens/s |")
    print("|---|---|---|---|---|---|")
    rows = []
    for name, ts in times.items():
        med = statistics.median(ts)
        per = tokens / len(batches) / med
        rows.append({"variant": name, "seconds_per_batch": med, "ratio": med / base,
                     "ratio_headless": med / headless, "min_ratio": min(ts) / base,
                     "max_ratio": max(ts) / base, "tokens_per_s": per})
        print(f"| {name} | {med:.4g} | {min(ts):.4g}–{max(ts):.4g} | ×{med / base:.2f} | "
              f"×{med / headless:.2f} | {per:,.0f} |")
    memory = measure_memory(args, list(fns)) if args.memory else []
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"model": model.name, "device": str(model.device), "dtype": str(model.dtype),
                       "tokens": tokens, "timing": rows, "memory": memory}, f, indent=1)


if __name__ == "__main__":
    main()
