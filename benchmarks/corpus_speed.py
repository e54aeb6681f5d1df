"""How fast the scan's corpus reader turns texts into batches, against the one-text-at-a-time path.

Variants, side by side in one process on SmolLM2-135M's tokenizer (no model run):

* ``per_text`` (baseline): what the reader did until session 9: one tokenizer call per text
  and every batch packed row by row, with every row's token strings converted;
* ``grouped``: ``row_batches`` + ``pack(names="lazy")`` as the scan reads now
  (``TOKENIZE_CHARS`` of text per tokenizer call, one vectorized pad, strings on demand);
* ``device_*``: a scan loop whose model is replaced by a wait of ``tokens / RATE`` seconds per
  batch, with the GIL released as a thread waiting on a GPU has it: ``device_inline`` reads
  each batch before its wait, ``device_read_ahead`` reads in the scan's reader thread
  (``reader.prefetched``). ``RATE`` defaults to SmolLM2's plain forward on one H200 in bf16
  at 32×512 (session 6: 16,384 tokens in 0.0313 s).

Two corpora: short lines (the built-in corpus repeated, ~20 tokens a text) and documents
(50 of its lines joined, ~1,000 tokens a text, cut into rows of ``seq_len``).

    python benchmarks/corpus_speed.py [--texts 16000] [--rate 523000] [--out NAME]
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import torch  # noqa: E402

import residual_stream as rs  # noqa: E402
from residual_stream.inputs import pack  # noqa: E402
from residual_stream.streaming import Corpus, row_batches  # noqa: E402
from residual_stream.streaming.corpus import builtin_corpus  # noqa: E402
from residual_stream.streaming.reader import prefetched  # noqa: E402

BATCH, SEQ = 32, 512


def per_text(model, texts):
    """The baseline: a tokenizer call per text, rows padded one by one, every string converted."""
    rows, out = [], []
    for text in texts:
        ids = list(model.tokenizer(text, add_special_tokens=True)["input_ids"])
        rows += [ids[s:s + SEQ] for s in range(0, len(ids), SEQ)]
    for start in range(0, len(rows), BATCH):
        part = rows[start:start + BATCH]
        tokens = torch.full((len(part), max(map(len, part))), 0, dtype=torch.long)
        mask = torch.zeros_like(tokens)
        for r, ids in enumerate(part):
            tokens[r, :len(ids)], mask[r, :len(ids)] = torch.tensor(ids), 1
        out.append((tokens, mask, [model.tokenizer.convert_ids_to_tokens(r) for r in part]))
    return out


def batches(model, texts):
    """The scan's reader: ``row_batches`` packed lazily."""
    for rows, _ in row_batches(model, Corpus(texts), batch_size=BATCH, seq_len=SEQ):
        yield pack(model, rows, names="lazy")


def device_loop(model, texts, rate: float, ahead: bool) -> int:
    """A scan loop whose forward pass is a GIL-free wait of ``tokens / rate`` seconds."""
    n = 0
    for batch in (prefetched(batches(model, texts)) if ahead else batches(model, texts)):
        tokens = int(batch.attention_mask.sum())
        time.sleep(tokens / rate)
        n += tokens
    return n


def timed(fn) -> float:
    """Seconds ``fn()`` takes."""
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def main() -> None:
    """Time every variant on both corpora, ``--rounds`` times each, interleaved; print the table."""
    parser = argparse.ArgumentParser()
    parser.add_argument("--texts", type=int, default=16000)
    parser.add_argument("--rate", type=float, default=16384 / 0.0313)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--out", default=None)
    args = parser.parse_args()
    model = rs.load("smollm2-135m", progress=False)
    lines = builtin_corpus()
    corpora = {"lines": (lines * (args.texts // len(lines) + 1))[:args.texts]}
    docs = [" ".join(lines[i:i + 50]) for i in range(0, len(lines) - 50, 7)]
    corpora["documents"] = (docs * (args.texts // 50 // len(docs) + 1))[:max(1, args.texts // 50)]
    rows = []
    for name, texts in corpora.items():
        n = sum(len(model.tokenizer(t)["input_ids"]) for t in texts)
        variants = {
            "per_text": lambda texts=texts: per_text(model, texts),
            "grouped": lambda texts=texts: list(batches(model, texts)),
            "device_inline": lambda texts=texts: device_loop(model, texts, args.rate, False),
            "device_read_ahead": lambda texts=texts: device_loop(model, texts, args.rate, True),
        }
        times = {k: [] for k in variants}
        for _ in range(args.rounds):
            for k, fn in variants.items():
                times[k].append(timed(fn))
        base = sorted(times["per_text"])[len(times["per_text"]) // 2]
        for k, ts in times.items():
            s = sorted(ts)[len(ts) // 2]
            rows.append({"corpus": name, "texts": len(texts), "tokens": n, "variant": k, "s": s,
                         "tokens_per_s": n / s, "x_per_text": s / base,
                         "device_alone_s": n / args.rate})
    lines_out = ["| corpus | texts | tokens | variant | s (median) | tokens/s | × per_text | "
                 "device alone s |", "|---|---|---|---|---|---|---|---|"]
    lines_out += [f"| {r['corpus']} | {r['texts']:,} | {r['tokens']:,} | {r['variant']} | "
                  f"{r['s']:.3f} | {r['tokens_per_s']:,.0f} | ×{r['x_per_text']:.2f} | "
                  f"{r['device_alone_s']:.3f} |" for r in rows]
    text = "\n".join(lines_out)
    print(f"threads {torch.get_num_threads()}, rate {args.rate:,.0f} tokens/s\n{text}")
    if args.out:
        out = Path(__file__).parent / args.out
        out.with_suffix(".md").write_text(text + "\n", encoding="utf-8")
        out.with_suffix(".json").write_text(json.dumps(rows, indent=1), encoding="utf-8")


if __name__ == "__main__":
    main()
