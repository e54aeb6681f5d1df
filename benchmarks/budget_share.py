"""A token budget shared by N processes: every process counted every segment (before) or its own.

With ``max_tokens`` the budget is taken in corpus order, so a process skipping another's
segment must know its token count. Before session 15 every process tokenized every segment up
to the budget to count it: each read the whole budget's text, whatever N. Now, from
``ledger.COUNT_FROM`` (3) processes, each counts its own segments first and the counts are
all-gathered (``ledger.count_shares``), then it reads its own share: 2/N of the text.

The corpus: documents of the built-in texts joined (about 1,000 tokens each) to ``--mb``
million characters, in segments of ``--segment-chars``; the budget ``--share`` of its tokens.
Per N, each rank's reading is timed in turn in this process (the reader alone, no model; the
gather is a stand-in handing over counts made beforehand), and the slowest rank is reported:
that is when the job's reading ends. ``--rounds`` rounds interleaved, median.

    python benchmarks/budget_share.py [--model smollm2-135m] [--mb 20] [--segment-chars 1048576]
        [--processes 2,4,8] [--rounds 3] [--out NAME]
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

from corpus_speed import save  # noqa: E402  (this folder's; run as a script)

import residual_stream as rs  # noqa: E402
from residual_stream.streaming import Corpus, row_batches  # noqa: E402
from residual_stream.streaming.corpus import builtin_corpus  # noqa: E402
from residual_stream.streaming.ledger import Ledger, count_shares  # noqa: E402


def documents(mb: float) -> list[str]:
    """Texts of about 4,000 characters (the built-in lines joined), ``mb`` million in all."""
    lines, docs, size = builtin_corpus(), [], 0
    while size < mb * 1e6:
        doc = " ".join(lines[(len(docs) * 7 + i) % len(lines)] for i in range(60))
        docs.append(doc)
        size += len(doc)
    return docs


def read(model, corpus: Corpus, budget: int, rank: int, world: int, ledger: Ledger | None) -> int:
    """Tokens of rank ``rank``'s share read (its batches, up to the budget)."""
    return sum(sum(map(len, b.rows)) for b in row_batches(
        model, corpus, batch_size=32, seq_len=512, max_tokens=budget,
        own=lambda s: s % world == rank, ledger=ledger))


def before(model, corpus: Corpus, budget: int, rank: int, world: int, counts: list[int]) -> int:
    """Every segment up to the budget tokenized, others' to count them."""
    return read(model, corpus, budget, rank, world, None)


def now(model, corpus: Corpus, budget: int, rank: int, world: int, counts: list[int]) -> int:
    """Its own segments counted, the counts gathered (a stand-in), then its share read."""
    rounds = iter(range(0, len(counts), world))
    ledger = Ledger()
    count_shares(model, corpus, budget, rank, world, ledger,
                 lambda mine: counts[next(rounds):][:world])
    return read(model, corpus, budget, rank, world, ledger)


def slowest(way, model, corpus, budget, world, counts) -> tuple[float, int]:
    """Seconds of the slowest rank, and the tokens the ranks read in all."""
    times, tokens = [], 0
    for rank in range(world):
        start = time.perf_counter()
        tokens += way(model, corpus, budget, rank, world, counts)
        times.append(time.perf_counter() - start)
    return max(times), tokens


def main() -> None:
    """Time both ways for every N, interleaved; print the table."""
    parser = argparse.ArgumentParser()
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--mb", type=float, default=20.0)
    parser.add_argument("--segment-chars", type=int, default=1 << 20)
    parser.add_argument("--share", type=float, default=0.9)
    parser.add_argument("--processes", default="2,4,8")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--out", default=None)
    args = parser.parse_args()
    model = rs.load(args.model, progress=False)
    corpus = Corpus(documents(args.mb), segment_chars=args.segment_chars)
    full = Ledger()
    start = time.perf_counter()
    total = read(model, corpus, 10**12, 0, 1, full)
    one = time.perf_counter() - start
    budget = int(total * args.share)
    worlds = [int(n) for n in args.processes.split(",")]
    runs = {(n, w): [] for n in worlds for w in ("before", "now")}
    for _ in range(args.rounds):
        for n in worlds:
            for name, way in (("before", before), ("now", now)):
                runs[(n, name)].append(slowest(way, model, corpus, budget, n, full.counts))
    rows = []
    for (n, name), r in runs.items():
        assert len({t for _, t in r}) == 1 and r[0][1] == budget, "the shares miss the budget"
        rows.append({"processes": n, "way": name, "slowest_s": statistics.median(s for s, _ in r)})
    base = {r["processes"]: r["slowest_s"] for r in rows if r["way"] == "before"}
    out = ["| processes | way | slowest process's reading, s | × before |", "|---|---|---|---|"]
    out += [f"| {r['processes']} | {r['way']} | {r['slowest_s']:.2f} | "
            f"×{r['slowest_s'] / base[r['processes']]:.2f} |" for r in rows]
    head = (f"{args.model}'s tokenizer, {len(corpus.source):,} documents, {total:,} tokens in "
            f"{len(full.counts)} segments of {args.segment_chars:,} characters; budget {budget:,} "
            f"tokens; one process reads all of it in {one:.2f} s; {args.rounds} rounds (median)")
    save(head + "\n\n" + "\n".join(out), rows, args.out)


if __name__ == "__main__":
    main()
