"""A report on a large corpus: its texts read whole (before) or only as far as the budgets reach.

``residual-stream report --corpus`` read every text of the corpus into a list, then analysed
the leading texts that fill ``--max-tokens`` for each model. It now reads them lazily
(``report.Leading``). Both ways run here side by side in one process, interleaved, on a
synthetic JSON Lines corpus written to a temporary folder (``--records`` records of about 60
characters; 1,000,000 make about 70 MB), with the same models and budget. For each way: the
seconds, the Python heap's peak (tracemalloc: the texts' strings; torch's own allocations are
not counted) and the texts read, with the ratio to reading them whole. The script asserts that
both ways give the same report numbers.

    python benchmarks/report_reading.py [--records 1000000] [--models twin-pre-rms twin-post-ln]
        [--max-tokens 1024] [--rounds 2] [--out benchmarks/cpu_report_reading42]
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
import tracemalloc
from pathlib import Path

import torch

import residual_stream as rs
from residual_stream.report import Leading, build_report
from residual_stream.streaming.corpus import Corpus


def write_corpus(folder: Path, records: int) -> Path:
    """``records`` JSON Lines records, each a text of about 60 characters, in ``folder/part.jsonl``."""
    path = folder / "part.jsonl"
    with path.open("w", encoding="utf-8") as f:
        for i in range(records):
            text = f"Record {i}: the residual stream carries every write onward."
            f.write(json.dumps({"text": text}) + "\n")
    return path


def one_way(way: str, models, corpus: Path, max_tokens: int) -> dict:
    """One report, its texts read ``whole`` (a list, as before) or ``lazily``: its cost and its data."""
    tracemalloc.start()
    start = time.perf_counter()
    texts = Corpus(corpus).texts()
    texts = list(texts) if way == "whole" else Leading(texts)
    _, data = build_report(models, texts, max_tokens=max_tokens)
    seconds = time.perf_counter() - start
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    read = len(texts) if way == "whole" else texts.read
    return {"way": way, "seconds": seconds, "peak_mb": peak / 2**20, "texts_read": read,
            "models": data["models"], "texts_used": data["metadata"]["texts"]}


def main() -> None:
    """Run both ways ``--rounds`` times, interleaved; print a Markdown table, write it and a JSON."""
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--records", type=int, default=1_000_000)
    parser.add_argument("--models", nargs="+", default=["twin-pre-rms", "twin-post-ln"])
    parser.add_argument("--max-tokens", type=int, default=1024)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--out", type=Path, help="write OUT.md and OUT.json")
    args = parser.parse_args()
    models = [rs.load(m, progress=False) for m in args.models]
    with tempfile.TemporaryDirectory() as tmp:
        corpus = write_corpus(Path(tmp), args.records)
        size = corpus.stat().st_size
        runs = {"whole": [], "lazily": []}
        for _ in range(args.rounds):
            for way in runs:
                runs[way].append(one_way(way, models, corpus, args.max_tokens))
    for whole, lazy in zip(runs["whole"], runs["lazily"], strict=True):  # the same report either way
        assert whole["models"] == lazy["models"] and whole["texts_used"] == lazy["texts_used"]
    rows = []
    base = {k: statistics.median(r[k] for r in runs["whole"]) for k in ("seconds", "peak_mb")}
    for way, done in runs.items():
        row = {"way": way, "records": args.records, "corpus_mb": size / 2**20, "models": args.models,
               "max_tokens": args.max_tokens, "threads": torch.get_num_threads(),
               "texts_read": done[0]["texts_read"], "texts_used": done[0]["texts_used"],
               "seconds": [r["seconds"] for r in done], "peak_mb": [r["peak_mb"] for r in done]}
        for k in ("seconds", "peak_mb"):
            row[f"{k}_median"] = statistics.median(row[k])
            row[f"{k}_ratio"] = row[f"{k}_median"] / base[k]
        rows.append(row)
    lines = ["| texts read | of records | seconds (median) | ratio | Python heap peak, MB | ratio |",
             "|---|---:|---:|---:|---:|---:|"]
    lines += [f"| {r['way']}: {r['texts_read']:,} | {r['records']:,} ({r['corpus_mb']:.0f} MB) | "
              f"{r['seconds_median']:.2f} | ×{r['seconds_ratio']:.3f} | {r['peak_mb_median']:.1f} | "
              f"×{r['peak_mb_ratio']:.4f} |" for r in rows]
    table = "\n".join(lines)
    print(table)
    if args.out:
        args.out.with_suffix(".md").write_text(table + "\n", encoding="utf-8")
        args.out.with_suffix(".json").write_text(json.dumps(rows, indent=1), encoding="utf-8")


if __name__ == "__main__":
    main()
