"""A corpus of one long text shared by processes and resumed: one segment (before) or parts.

One text of ``--mb`` million characters of English on one line (``long_text.long_text``), as
text8 is. Before session 15 a text was one segment at least: one process of N read all of
it, and a resumed scan tokenized it again up to the saved batch. Now it is cut into parts of
about ``segment_chars`` characters, each a segment. Both are read here by ``row_batches`` as
a scan reads them (rows of ``--seq-len``, batches of ``--batch-size``, length order), the
reader alone (no model forward), side by side in one process, ``--rounds`` rounds
interleaved (median):

* ``all``: every batch, one process;
* ``share of 2``: the slower of the two shares of ``torchrun --nproc-per-node 2`` (each
  rank's reading timed in turn; the segments of others are skipped untokenized);
* ``resume at 80 %``: seconds to the first batch of a scan resumed where part 5 of 5 begins
  (before: the batch of the one segment that holds the same character).

    python benchmarks/long_text_parts.py [--model smollm2-135m] [--mb 20] [--rounds 3] [--out NAME]
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

from corpus_speed import save  # noqa: E402  (this folder's; run as a script)
from long_text import long_text  # noqa: E402

import residual_stream as rs  # noqa: E402
from residual_stream.streaming import Corpus, row_batches  # noqa: E402
from residual_stream.streaming.ledger import Share  # noqa: E402


class OneSegment(Corpus):
    """The corpus as read before: a text is never cut into parts."""

    def segments(self, reading=None, cut=None):
        """``Corpus.segments`` without cutting."""
        return super().segments(reading, None)


def read(model, corpus: Corpus, share=None, skip: int = 0, **kw) -> tuple[float, float, int]:
    """(seconds, seconds to the first kept batch, tokens kept) reading ``corpus``'s batches.

    Kept: those of the segments ``share`` owns, from batch ``skip`` of a segment on (those
    before it are read and dropped, as a resumed scan does).
    """
    start, first, tokens = time.perf_counter(), None, 0
    for batch in row_batches(model, corpus, share=share, **kw):
        if batch.index < skip:
            continue
        first = first if first is not None else time.perf_counter() - start
        tokens += sum(map(len, batch.rows))
    return time.perf_counter() - start, first, tokens


def main() -> None:
    """Time both ways on the three tasks, interleaved; print the table."""
    parser = argparse.ArgumentParser()
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--mb", type=float, default=20.0)
    parser.add_argument("--seq-len", type=int, default=512)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--out", default=None)
    args = parser.parse_args()
    model = rs.load(args.model, progress=False)
    text = long_text(args.mb)
    kw = dict(batch_size=args.batch_size, seq_len=args.seq_len)
    chars = -(-len(text) // 5)  # five parts
    parts, whole = Corpus([text], segment_chars=chars), OneSegment([text], segment_chars=chars)
    spans = [s.span for s in parts.segments(cut=lambda: True)]
    assert len(spans) == 5, spans
    n_batches = sum(1 for _ in row_batches(model, whole, **kw))
    skip = int(n_batches * spans[4][0] / len(text))  # the one segment's batch at part 5's start
    tasks = {
        ("all", "one segment"): lambda: read(model, whole, **kw),
        ("all", "parts"): lambda: read(model, parts, **kw),
        ("share of 2", "one segment"): lambda: max((read(model, whole, share=Share(r, 2), **kw)
                                                    for r in (0, 1)), key=lambda t: t[0]),
        ("share of 2", "parts"): lambda: max((read(model, parts, share=Share(r, 2), **kw)
                                              for r in (0, 1)), key=lambda t: t[0]),
        ("resume at 80 %", "one segment"): lambda: read(model, whole, skip=skip, **kw),
        ("resume at 80 %", "parts"): lambda: read(model, parts, share=Share(start=4), **kw),
    }
    times = {key: [] for key in tasks}
    for _ in range(args.rounds):
        for key, task in tasks.items():
            times[key].append(task())
    rows = [{"task": task, "way": way, "seconds": statistics.median(t[0] for t in runs),
             "first_batch_s": statistics.median(t[1] for t in runs), "tokens": runs[0][2]}
            for (task, way), runs in times.items()]
    out = ["| task | way | tokens read | seconds | first batch s |", "|---|---|---|---|---|"]
    out += [f"| {r['task']} | {r['way']} | {r['tokens']:,} | {r['seconds']:.2f} | "
            f"{r['first_batch_s']:.2f} |" for r in rows]
    head = (f"{args.model}'s tokenizer, one text of {len(text):,} characters in 5 parts, "
            f"{args.batch_size}×{args.seq_len} batches, {args.rounds} rounds (median), reader only")
    save(head + "\n\n" + "\n".join(out), rows, args.out)


if __name__ == "__main__":
    main()
