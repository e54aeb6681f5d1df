"""The host's time per replayed batch outside the graph, against a plain forward pass.

A replayed scan (``streaming.graphs``) launches a batch's whole lean pass as one CUDA graph;
what the host still does per batch runs while the device waits: the batch copied into the
graph's buffers (``refill``), the overflow and finiteness checks, and each statistic's
``into`` (its reductions over tokens and what it reads back). On an H200 a 32×512 batch of
SmolLM2 kept the device idle 10.7 ms of 46 ms this way (session 33, ``gpu/probe33.md``).
This times that part alone, batch by batch, beside the plain forward pass of the same batch
in the same process. On the CPU the replay is emulated (run eagerly, outside the timing);
on the narrow stand-in of ``narrow_model.py`` at 1×16 tokens both are host-bound, as on the
GPU:

    python benchmarks/narrow_model.py /tmp/smollm2-narrow
    python benchmarks/replay_host.py --model /tmp/smollm2-narrow --batch-size 1 --seq-len 16
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import torch
from scan_speed import _batches, _sync

import residual_stream as rs
from residual_stream.streaming import make_accumulators
from residual_stream.streaming.graphs import Replayed, padded_batch
from residual_stream.streaming.sampling import unpadded


def _host_part(replay: Replayed, batch, width: int) -> None:
    """What ``Replayed.add`` does for ``batch`` besides replaying the graph.

    The refill, the sums' copies where they are kept for the next batch (``snapshot``), the
    checks and reads (``fetch``) and ``into``.
    """
    padded = padded_batch(batch, width)
    entry = replay.entries[(*padded.tokens.shape, unpadded(padded))]
    entry.batch.refill(padded)
    replay.pending = replay.held(entry, batch)
    replay.flush()


def main() -> None:
    """Time the host part of each statistic's replayed batch and the plain forward; print both."""
    p = argparse.ArgumentParser()
    p.add_argument("--model", default="/tmp/smollm2-narrow")
    p.add_argument("--device", default="cpu")
    p.add_argument("--dtype", default="float32")
    p.add_argument("--batch-size", type=int, default=1)
    p.add_argument("--seq-len", type=int, default=16)
    p.add_argument("--rounds", type=int, default=30)
    p.add_argument("--stats", default="growth;survival;read_attribution;lens",
                   help="';'-separated sets of statistics, each a ','-separated list")
    p.add_argument("--json")
    args = p.parse_args()
    model = rs.load(args.model, device=args.device, dtype=args.dtype, progress=False)
    batch = _batches(model, 2, args.batch_size, args.seq_len)[1]

    def forward() -> None:
        with torch.inference_mode():
            model.module(input_ids=batch.tokens.to(model.device),
                         attention_mask=batch.attention_mask.to(model.device))

    timed = {"hf_forward": forward}
    for names in args.stats.split(";"):
        accs = make_accumulators(names.split(","))
        replay = Replayed(model, accs, width=args.seq_len, emulate=model.device.type != "cuda")
        replay.add(batch)  # the capture (and, emulated, its first pass)
        timed[f"host of {names}"] = (lambda r=replay: _host_part(r, batch, args.seq_len))
    times: dict[str, list[float]] = {name: [] for name in timed}
    for _ in range(args.rounds):  # interleaved, so drift hits every variant alike
        for name, fn in timed.items():
            _sync(model.device)
            t = time.perf_counter()
            fn()
            _sync(model.device)
            times[name].append(time.perf_counter() - t)
    base = statistics.median(times["hf_forward"])
    print(f"model {model.name}, {model.device}, {model.dtype}, {torch.get_num_threads()} threads, "
          f"one batch of {args.batch_size}×{args.seq_len}, {args.rounds} rounds\n")
    print("| what | ms (median) | × plain forward |\n|---|---|---|")
    rows = []
    for name, ts in times.items():
        med = statistics.median(ts)
        rows.append({"what": name, "ms": med * 1e3, "ratio": med / base})
        print(f"| {name} | {med * 1e3:.3g} | ×{med / base:.2f} |")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
