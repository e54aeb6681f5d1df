"""Reading a compressed corpus file: each packing against the plain file, side by side.

A JSON Lines corpus of ``--mb`` million characters (the built-in corpus's lines as records,
repeated) written plain and as ``.gz``, ``.xz``, ``.bz2`` and ``.zst`` (each tool's default
level). Each is read whole as a scan reads it (``Corpus(path).texts()``: unpack, decode, parse
every record), ``--rounds`` rounds interleaved, the median kept. Reported: the file's size, the
seconds, the text read per second and the time as a ratio to the plain file's, in the same
process. Every packing must give the plain file's texts (checked).

    python benchmarks/packing_speed.py [--mb 50] [--rounds 3] [--out NAME]
"""

from __future__ import annotations

import argparse
import bz2
import gzip
import json
import lzma
import statistics
import tempfile
import time
from pathlib import Path

import zstandard
from corpus_speed import save  # this folder's; run as a script

from residual_stream.streaming import Corpus
from residual_stream.streaming.corpus import builtin_corpus

PACK = {"": lambda data: data, ".gz": gzip.compress, ".xz": lzma.compress, ".bz2": bz2.compress,
        ".zst": lambda data: zstandard.ZstdCompressor().compress(data)}


def _corpus(mb: float) -> bytes:
    """JSON Lines records of the built-in corpus's lines, repeated to ``mb`` million characters."""
    lines = builtin_corpus()
    records, chars, i = [], 0, 0
    while chars < mb * 1e6:
        text = lines[i % len(lines)]
        records.append(json.dumps({"text": text, "id": i}))
        chars, i = chars + len(text), i + 1
    return ("\n".join(records) + "\n").encode()


def main() -> None:
    """Write the corpus in every packing, read each ``--rounds`` times, print the table."""
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--mb", type=float, default=50.0, help="million characters of text (default 50)")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--out", help="also write NAME.md and NAME.json beside this script")
    args = p.parse_args()
    data = _corpus(args.mb)
    with tempfile.TemporaryDirectory() as folder:
        paths = {}
        for suffix, pack in PACK.items():
            paths[suffix] = Path(folder) / f"corpus.jsonl{suffix}"
            paths[suffix].write_bytes(pack(data))
        want = list(Corpus(paths[""]).texts())
        seconds: dict[str, list[float]] = {s: [] for s in PACK}
        for _ in range(args.rounds):
            for suffix, path in paths.items():
                start = time.perf_counter()
                texts = list(Corpus(path).texts())
                seconds[suffix].append(time.perf_counter() - start)
                assert texts == want, f"{suffix}: other texts than the plain file's"
        chars = sum(map(len, want))
        base = statistics.median(seconds[""])
        rows = [{"packing": suffix or "plain", "file_mb": paths[suffix].stat().st_size / 1e6,
                 "seconds": statistics.median(s), "mchars_per_s": chars / 1e6 / statistics.median(s),
                 "ratio_to_plain": statistics.median(s) / base} for suffix, s in seconds.items()]
    lines = [f"Reading {len(want):,} JSON Lines records ({chars / 1e6:.1f} M characters), median of "
             f"{args.rounds} interleaved rounds", "",
             "| packing | file MB | seconds | M chars/s | × plain |", "|---|---:|---:|---:|---:|"]
    lines += [f"| {r['packing']} | {r['file_mb']:.1f} | {r['seconds']:.2f} | {r['mchars_per_s']:.1f} | "
              f"{r['ratio_to_plain']:.2f} |" for r in rows]
    save("\n".join(lines), rows, args.out)


if __name__ == "__main__":
    main()
