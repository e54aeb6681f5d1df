"""How busy the scan's reader keeps a device, by the depth of its read-ahead queue.

The scan's reader thread (``reader.prefetched``) tokenizes and packs batches while the model
runs, up to ``depth`` batches ahead; blocked on a full queue, it tokenizes nothing. Batches
come in bursts: a window of ``SORT_BATCHES`` (32) batches sorted by length, or (several
processes with a budget) a whole segment, tokenized before its counts are exchanged. A queue
shallower than a burst leaves the reader idle while the device drains it, then the device
idle while the reader makes the next burst.

Here the device is a GIL-free wait of ``tokens / rate`` per batch, ``rate`` a fraction
``--load`` of this reader's own measured tokens/s, so that a perfect pipeline keeps it busy
all the time; reported: the device's busy fraction (its waits over the wall time). Cases: one
process with no budget; and process 0 of 2 with a budget (its counts exchanged with a
stand-in holding counts made beforehand). Documents of the built-in lines joined, ``--mb``
million characters in segments of ``--segment-chars``, ``--batch-size``×``--seq-len``.

    python benchmarks/read_ahead.py [--model smollm2-135m] [--mb 8] [--depths 16,64,256]
        [--load 0.8] [--rounds 3] [--out NAME]
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

from budget_share import documents  # noqa: E402  (this folder's; run as a script)
from corpus_speed import save  # noqa: E402

import residual_stream as rs  # noqa: E402
from residual_stream.streaming import Corpus, Share, row_batches  # noqa: E402
from residual_stream.streaming.ledger import Ledger  # noqa: E402
from residual_stream.streaming.reader import prefetched  # noqa: E402


def packed(model, corpus: Corpus, share: Share, budget: int | None, kw: dict):
    """The scan's batches of ``share`` (packed, as the reader thread makes them)."""
    for rows in row_batches(model, corpus, share=share, max_tokens=budget, ledger=Ledger(), **kw):
        yield rows.pack(model)


def busy(model, corpus, share_of, budget, kw, depth: int, rate: float) -> float:
    """The device's busy fraction with the reader ``depth`` batches ahead."""
    start, device = time.perf_counter(), 0.0
    for batch in prefetched(packed(model, corpus, share_of(), budget, kw), depth=depth):
        wait = int(batch.attention_mask.sum()) / rate
        time.sleep(wait)
        device += wait
    return device / (time.perf_counter() - start)


def main() -> None:
    """Measure the reader's rate per case, then the busy fraction per depth, interleaved."""
    parser = argparse.ArgumentParser()
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--mb", type=float, default=8.0)
    parser.add_argument("--segment-chars", type=int, default=1 << 20)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--seq-len", type=int, default=512)
    parser.add_argument("--depths", default="16,64,256")
    parser.add_argument("--load", type=float, default=0.8)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--out", default=None)
    args = parser.parse_args()
    model = rs.load(args.model, progress=False)
    corpus = Corpus(documents(args.mb), segment_chars=args.segment_chars)
    kw = dict(batch_size=args.batch_size, seq_len=args.seq_len)
    counts = Ledger()
    total = sum(sum(map(len, b.rows)) for b in row_batches(model, corpus, ledger=counts,
                                                            max_tokens=10**12, **kw))
    budget = int(total * 0.9)

    def exchanged() -> Share:  # process 0 of 2; the other's counts from a stand-in
        rounds = iter(range(0, len(counts.counts), 2))
        return Share(0, 2, 0, lambda mine: counts.counts[next(rounds):][:2])

    cases = {"one process": (lambda: Share(), None), "0 of 2, budget": (exchanged, budget)}
    rates = {}
    for name, (share_of, cap) in cases.items():
        start = time.perf_counter()
        n = sum(int(b.attention_mask.sum()) for b in packed(model, corpus, share_of(), cap, kw))
        rates[name] = n / (time.perf_counter() - start)
    depths = [int(d) for d in args.depths.split(",")]
    runs = {(c, d): [] for c in cases for d in depths}
    for _ in range(args.rounds):
        for name, (share_of, cap) in cases.items():
            for d in depths:
                runs[(name, d)].append(busy(model, corpus, share_of, cap, kw, d, rates[name] * args.load))
    rows = [{"case": c, "depth": d, "reader_tok_s": rates[c], "busy": statistics.median(r)}
            for (c, d), r in runs.items()]
    out = ["| case | reader alone, tokens/s | depth (batches) | device busy |", "|---|---|---|---|"]
    out += [f"| {r['case']} | {r['reader_tok_s']:,.0f} | {r['depth']} | {r['busy']:.2f} |" for r in rows]
    head = (f"{args.model}'s tokenizer, {len(corpus.source):,} documents, {total:,} tokens in "
            f"{len(counts.counts)} segments of {args.segment_chars:,} characters, "
            f"{args.batch_size}×{args.seq_len}; device at {args.load:.0%} of the reader's rate; "
            f"{args.rounds} rounds (median)")
    save(head + "\n\n" + "\n".join(out), rows, args.out)


if __name__ == "__main__":
    main()
