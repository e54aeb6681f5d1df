"""What saving a scan's state costs: per statistic, and against a scan that saves by time.

A scan with ``state=`` saves its accumulators (``state.save_state``: sums copied to the
host, written, flushed to disk, renamed). Until session 14 it saved after every batch; now
after the first batch ending ``save_seconds`` (60) after the last save.

* Per statistic, after a short scan: the state's size and the median time of one save
  (``--saves`` of them), and that time over one batch's share of the scan (``save/batch``).
* Timed side by side in one process, ``--rounds`` times each, interleaved (median):
  ``rs.scan`` of ``--timed-stats`` with no state, with the state saved by time (the
  default), and saved after every batch (``save_seconds=0``, as before).

    python benchmarks/state_save.py [--model smollm2-135m] [--batch-size 8] [--seq-len 128]
        [--batches 4] [--stats growth,survival,read_attribution,subspaces,lens,composition]
        [--timed-stats growth] [--device cpu] [--dtype float32] [--rounds 3] [--out NAME]
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")

from corpus_speed import save, setting, timed  # noqa: E402  (this folder's; run as a script)

import residual_stream as rs  # noqa: E402
from residual_stream.streaming.corpus import builtin_corpus  # noqa: E402
from residual_stream.streaming.ledger import Ledger  # noqa: E402
from residual_stream.streaming.state import save_state  # noqa: E402


def save_cost(model, stat: str, texts: list[str], folder: Path, saves: int, **kw) -> dict:
    """Size and median save time of ``stat``'s state after a scan of ``texts``."""
    result = rs.scan(model, texts, [stat], progress=False, **kw)
    path = folder / f"{stat}.pt"
    times = [timed(lambda: save_state(path, {"benchmark": True}, (0, 1), result.tokens,
                                      result.batches, result.accumulators, Ledger()))
             for _ in range(saves)]
    save_s = statistics.median(times)
    batch_s = result.seconds / max(result.batches, 1)
    return {"stat": stat, "mb": path.stat().st_size / 1e6, "save_ms": 1e3 * save_s,
            "batch_ms": 1e3 * batch_s, "save_per_batch": save_s / batch_s}


def main() -> None:
    """Measure every statistic's save, then time the scans side by side; print the tables."""
    parser = argparse.ArgumentParser()
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--seq-len", type=int, default=128)
    parser.add_argument("--batches", type=int, default=4)
    parser.add_argument("--stats", default="growth,survival,read_attribution,subspaces,lens,"
                                           "composition")
    parser.add_argument("--timed-stats", default="growth")
    parser.add_argument("--saves", type=int, default=5)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--dtype", default="float32")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--out", default=None)
    args = parser.parse_args()
    model = rs.load(args.model, device=args.device, dtype=args.dtype, progress=False)
    kw = dict(batch_size=args.batch_size, seq_len=args.seq_len,
              max_tokens=args.batches * args.batch_size * args.seq_len)
    texts = [" ".join(builtin_corpus())] * (args.batches + 1)  # full rows: every batch alike
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        rows = [save_cost(model, s, texts, folder, args.saves, **kw)
                for s in args.stats.split(",") if s]
        timed_stats = [s for s in args.timed_stats.split(",") if s]
        variants = {"no_state": {}, "by_time": {"state": folder / "t.pt"},
                    "every_batch": {"state": folder / "b.pt", "save_seconds": 0.0}}
        seconds: dict[str, list[float]] = {v: [] for v in variants}
        for _ in range(args.rounds):
            for name, extra in variants.items():
                for path in folder.glob("[tb].pt"):
                    path.unlink()  # each run scans from the start
                seconds[name].append(timed(lambda e=extra: rs.scan(
                    model, texts, timed_stats, progress=False, **kw, **e)))
    median = {v: statistics.median(t) for v, t in seconds.items()}
    out = ["| statistic | state MB | one save ms | one batch ms | save / batch |", "|---" * 5 + "|"]
    out += [f"| {r['stat']} | {r['mb']:.2f} | {r['save_ms']:.1f} | {r['batch_ms']:.0f} | "
            f"{r['save_per_batch']:.3f} |" for r in rows]
    out += ["", f"| scan of {timed_stats} | s | ×no state |", "|---|---|---|"]
    out += [f"| {v} | {s:.2f} | ×{s / median['no_state']:.3f} |" for v, s in median.items()]
    rows.append({"timed_stats": timed_stats, "seconds": seconds, "median": median})
    text = (f"{setting(args, model)}, "
            f"{args.batches} batches of {args.batch_size}×{args.seq_len}, {args.saves} saves "
            f"(median), {args.rounds} rounds (median)\n\n" + "\n".join(out))
    save(text, rows, args.out)


if __name__ == "__main__":
    main()
