"""How fast each kind of corpus source gives its texts, against a list of the same texts in memory.

What ``Corpus.texts`` reads before any tokenizing (the reader thread's first step), for one
corpus written in every form a scan takes: ``list`` (the baseline: the texts in memory, as a
notebook holds them), a ``.txt`` file, ``.jsonl`` and ``.jsonl.gz`` files, a Parquet file,
a ``datasets.Dataset`` (Arrow, ``hf_datasets.TextColumn``), its column ``dataset["text"]``
(read as the dataset), the same column through the ``Column``'s own rows (what session 39
read it through: a list of its items), and the JSON Lines file opened as a streaming
``IterableDataset`` (``load_dataset("json", …, streaming=True)``, ``hf_datasets.StreamColumn``).
Each is read whole ``--repeat`` times in one process; the best time counts. The texts are the
built-in corpus's lines repeated, stripped (about 100 characters each).

    python benchmarks/source_speed.py [--texts 300000] [--repeat 3] [--out NAME]
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import tempfile
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import datasets  # noqa: E402
import pyarrow as pa  # noqa: E402
import pyarrow.parquet as pq  # noqa: E402

from residual_stream.streaming import Corpus  # noqa: E402
from residual_stream.streaming.sources import builtin_corpus  # noqa: E402


def sources(texts: list[str], folder: Path) -> dict[str, object]:
    """The corpus in every form, keyed by the name the table gives it."""
    lines = "".join(t + "\n" for t in texts)
    (folder / "c.txt").write_text(lines, "utf-8")
    records = "".join(json.dumps({"text": t}) + "\n" for t in texts)
    (folder / "c.jsonl").write_text(records, "utf-8")
    with gzip.open(folder / "c.jsonl.gz", "wt", encoding="utf-8") as f:
        f.write(records)
    pq.write_table(pa.table({"text": texts}), folder / "c.parquet")
    dataset = datasets.Dataset.from_dict({"text": texts})
    stream = datasets.load_dataset("json", data_files=str(folder / "c.jsonl"), split="train",
                                   streaming=True)
    return {"list": texts, "txt": folder / "c.txt", "jsonl": folder / "c.jsonl",
            "jsonl.gz": folder / "c.jsonl.gz", "parquet": folder / "c.parquet", "Dataset": dataset,
            "Dataset column": dataset["text"], "Column's own rows": dataset["text"],
            "IterableDataset (streamed jsonl)": stream}


def read(source) -> tuple[float, int]:
    """(seconds, characters) to read every text of ``source`` once."""
    start = time.perf_counter()
    chars = sum(len(t) for t in Corpus(source).texts())
    return time.perf_counter() - start, chars


def main() -> None:
    """Time every source, best of ``--repeat``; print and save the table."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--texts", type=int, default=300_000)
    p.add_argument("--repeat", type=int, default=3)
    p.add_argument("--out", help="save NAME.md and NAME.json in benchmarks/")
    args = p.parse_args()
    base = builtin_corpus()
    texts = [base[i % len(base)].strip() for i in range(args.texts)]  # as a .txt file's lines are read
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        made = sources(texts, Path(tmp))
        for name, source in made.items():
            if name == "Column's own rows":  # the conversion is the cost: timed with the reading
                start = time.perf_counter()
                _, chars = read(list(source))
                best = time.perf_counter() - start
            else:
                best, chars = min(read(source) for _ in range(args.repeat))
            rows.append({"source": name, "seconds": round(best, 4), "chars": chars,
                         "Mchars_per_s": round(chars / best / 1e6, 2)})
    baseline = rows[0]["seconds"]
    for row in rows:
        row["ratio"] = round(row["seconds"] / baseline, 2)
        assert row["chars"] == rows[0]["chars"], row  # every form gives the same texts
    table = ["| source | seconds | M chars/s | ratio to the list |", "|---|---:|---:|---:|"]
    table += [f"| {r['source']} | {r['seconds']} | {r['Mchars_per_s']} | ×{r['ratio']} |" for r in rows]
    head = f"{args.texts} texts, {rows[0]['chars']:,} characters; best of {args.repeat}"
    text = head + "\n\n" + "\n".join(table)
    print(text)
    if args.out:
        out = Path(__file__).resolve().parent / args.out
        out.with_suffix(".md").write_text(text + "\n", "utf-8")
        out.with_suffix(".json").write_text(json.dumps(rows, indent=1), "utf-8")


if __name__ == "__main__":
    main()
