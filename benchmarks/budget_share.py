"""A token budget shared by N processes: how much text each process tokenizes to find its share.

With ``max_tokens`` the budget is taken in corpus order, so a process skipping another's
segment must know its token count. Three ways, each process reading alone (no model):

* ``every``: before session 15, every process tokenized every segment up to the budget, its
  own to batch it and the others' to count them: the whole budget's text, whatever N;
* ``count_first``: session 15 (``count_shares``, now gone), from 3 processes: each first
  counted its own segments (tokenized, counts all-gathered), then tokenized its own share
  again to batch it: 2/N of the text, the first half before the first batch;
* ``exchange``: now (``ledger.Share`` with an exchange), from 2 processes: each tokenizes
  its own segment of a round, the round's counts are exchanged, and it batches the rows it
  kept: 1/N of the text, once, in the reader thread.

The exchanges and the gathers are stand-ins handing over counts made beforehand, so the
times are the tokenizing and batching of each rank. The corpus: documents of the built-in
texts joined (about 1,000 tokens each) to ``--mb`` million characters, in segments of
``--segment-chars``; the budget ``--share`` of its tokens. Per N, each rank is timed in turn
in this process, and the slowest rank is reported: that is when the job's reading ends.
``--rounds`` rounds interleaved, median.

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
from residual_stream.streaming.batching import segment_tokens  # noqa: E402
from residual_stream.streaming.corpus import builtin_corpus  # noqa: E402
from residual_stream.streaming.ledger import Ledger, Share  # noqa: E402


def documents(mb: float) -> list[str]:
    """Texts of about 4,000 characters (the built-in lines joined), ``mb`` million in all."""
    lines, docs, size = builtin_corpus(), [], 0
    while size < mb * 1e6:
        doc = " ".join(lines[(len(docs) * 7 + i) % len(lines)] for i in range(60))
        docs.append(doc)
        size += len(doc)
    return docs


def read(model, corpus: Corpus, budget: int, share: Share, ledger: Ledger | None) -> int:
    """Tokens of ``share``'s batches read (up to the budget)."""
    return sum(sum(map(len, b.rows)) for b in row_batches(
        model, corpus, batch_size=32, seq_len=512, max_tokens=budget, share=share, ledger=ledger))


def every(model, corpus: Corpus, budget: int, rank: int, world: int, counts: list[int]) -> int:
    """Every segment up to the budget tokenized, the others' to count them."""
    return read(model, corpus, budget, Share(rank, world), None)


def count_first(model, corpus: Corpus, budget: int, rank: int, world: int, counts: list[int]) -> int:
    """Session 15's: its own segments counted round by round until the budget, then read."""
    ledger, total = Ledger(), 0
    for number, segment in enumerate(corpus.segments(cut=lambda: True)):
        if number % world == 0 and total >= budget:
            break
        if number % world == rank:
            segment_tokens(model, segment)
        ledger.record(number, counts[number])
        total += counts[number]
    return read(model, corpus, budget, Share(rank, world), ledger)


def exchange(model, corpus: Corpus, budget: int, rank: int, world: int, counts: list[int]) -> int:
    """Now: its own segment of each round tokenized once, the round's counts exchanged."""
    rounds = iter(range(0, len(counts), world))
    return read(model, corpus, budget, Share(rank, world, 0, lambda mine: counts[next(rounds):][:world]),
                Ledger())


WAYS = {"every": every, "count_first": count_first, "exchange": exchange}


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
    total = read(model, corpus, 10**12, Share(), full)
    one = time.perf_counter() - start
    budget = int(total * args.share)
    worlds = [int(n) for n in args.processes.split(",")]
    runs = {(n, w): [] for n in worlds for w in WAYS}
    for _ in range(args.rounds):
        for n in worlds:
            for name, way in WAYS.items():
                runs[(n, name)].append(slowest(way, model, corpus, budget, n, full.counts))
    rows = []
    for (n, name), r in runs.items():
        assert len({t for _, t in r}) == 1 and r[0][1] == budget, "the shares miss the budget"
        rows.append({"processes": n, "way": name, "slowest_s": statistics.median(s for s, _ in r)})
    base = {r["processes"]: r["slowest_s"] for r in rows if r["way"] == "every"}
    out = ["| processes | way | slowest process's reading, s | × every |", "|---|---|---|---|"]
    out += [f"| {r['processes']} | {r['way']} | {r['slowest_s']:.2f} | "
            f"×{r['slowest_s'] / base[r['processes']]:.2f} |" for r in rows]
    head = (f"{args.model}'s tokenizer, {len(corpus.source):,} documents, {total:,} tokens in "
            f"{len(full.counts)} segments of {args.segment_chars:,} characters; budget {budget:,} "
            f"tokens; one process reads all of it in {one:.2f} s; {args.rounds} rounds (median)")
    save(head + "\n\n" + "\n".join(out), rows, args.out)


if __name__ == "__main__":
    main()
