"""A corpus of one long text: tokenized whole (before session 14) against in pieces (now).

One text of ``--mb`` million characters of English (the built-in corpus joined with spaces,
repeated), as a corpus shipped on one line (text8) is. Two ways to its rows of ``--seq-len``
ids, both reading every row:

* ``whole``: one tokenizer call on the whole text (``tokenize.encoder``), its rows cut from
  the list of ids: what the reader did before;
* ``pieces``: ``corpus`` rows as a scan reads them now (``tokenize.token_chunks``: pieces
  of ``PIECE_CHARS`` characters, ``TOKENIZE_CHARS`` per call).

Time: side by side in one process, ``--rounds`` rounds interleaved (median), with the
seconds to the first row. Memory: each variant once in a fresh process, the growth of its
peak resident set while it reads (``VmHWM`` after ``clear_refs``, over ``VmRSS`` before).
Both give the same ids (checked here, and in ``tests/test_long_texts.py``).

    python benchmarks/long_text.py [--model smollm2-135m] [--mb 20] [--seq-len 512]
        [--rounds 3] [--out NAME]
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import statistics
import subprocess
import sys
import time

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

from corpus_speed import save  # noqa: E402  (this folder's; run as a script)

import residual_stream as rs  # noqa: E402
from residual_stream.streaming.batching import _rows  # noqa: E402
from residual_stream.streaming.corpus import Segment, builtin_corpus  # noqa: E402
from residual_stream.streaming.tokenize import encoder  # noqa: E402


def long_text(mb: float) -> str:
    """About ``mb`` million characters of English on one line."""
    line = " ".join(builtin_corpus()) + " "
    return line * max(1, int(mb * 1e6 / len(line)))


def whole(model, text: str, seq_len: int):
    """Rows from one call on the whole text."""
    ids = encoder(model.tokenizer)([text])[0]
    for start in range(0, len(ids), seq_len):
        yield ids[start:start + seq_len]


def pieces(model, text: str, seq_len: int):
    """Rows as the corpus reader cuts them now."""
    for row, _, _ in _rows(model, Segment(0, [text]), seq_len):
        yield row


VARIANTS = {"whole": whole, "pieces": pieces}


def _status_mb(field: str) -> float:
    """A ``/proc/self/status`` memory field (``VmRSS``, ``VmHWM``: the peak) in MiB."""
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith(field + ":")) / 1024


def run(variant: str, model, text: str, seq_len: int) -> dict:
    """Read every row; seconds to the first and to the last, tokens, and a digest of the ids."""
    start, first, tokens, digest = time.perf_counter(), None, 0, hashlib.sha256()
    for row in VARIANTS[variant](model, text, seq_len):
        first = first if first is not None else time.perf_counter() - start
        tokens += len(row)
        digest.update(str(row).encode())
    return {"seconds": time.perf_counter() - start, "first_row_s": first, "tokens": tokens,
            "digest": digest.hexdigest()[:16]}


def main() -> None:
    """Time both variants side by side, measure each one's memory alone; print the table."""
    parser = argparse.ArgumentParser()
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--mb", type=float, default=20.0)
    parser.add_argument("--seq-len", type=int, default=512)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--memory-of", choices=list(VARIANTS), help=argparse.SUPPRESS)
    parser.add_argument("--out", default=None)
    args = parser.parse_args()
    model = rs.load(args.model, progress=False)
    text = long_text(args.mb)
    if args.memory_of:  # the child: one variant, its peak resident set's growth
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")  # the peak starts again here (a child's ru_maxrss keeps its parent's)
        before = _status_mb("VmRSS")
        run(args.memory_of, model, text, args.seq_len)
        print(json.dumps({"peak_growth_mb": _status_mb("VmHWM") - before}))
        return
    results = {v: [] for v in VARIANTS}
    for _ in range(args.rounds):
        for v in VARIANTS:
            results[v].append(run(v, model, text, args.seq_len))
    assert len({r["digest"] for rs_ in results.values() for r in rs_}) == 1, "the ids differ"
    rows = []
    for v, runs in results.items():
        child = subprocess.run([sys.executable, __file__, "--model", args.model, "--mb", str(args.mb),
                                "--seq-len", str(args.seq_len), "--memory-of", v],
                               capture_output=True, text=True, check=True)
        memory = json.loads(child.stdout.strip().splitlines()[-1])["peak_growth_mb"]
        rows.append({"variant": v, "seconds": statistics.median(r["seconds"] for r in runs),
                     "first_row_s": statistics.median(r["first_row_s"] for r in runs),
                     "tokens": runs[0]["tokens"], "peak_growth_mb": memory})
    base = rows[0]["seconds"]
    out = ["| variant | tokens | seconds | × whole | first row s | peak memory growth |",
           "|---|---|---|---|---|---|"]
    out += [f"| {r['variant']} | {r['tokens']:,} | {r['seconds']:.2f} | ×{r['seconds'] / base:.2f} | "
            f"{r['first_row_s']:.3f} | {r['peak_growth_mb']:,.0f} MiB |" for r in rows]
    text_out = (f"{args.model}'s tokenizer, one text of {len(text):,} characters, rows of "
                f"{args.seq_len}, {args.rounds} rounds (median), same ids\n\n" + "\n".join(out))
    save(text_out, rows, args.out)


if __name__ == "__main__":
    main()
