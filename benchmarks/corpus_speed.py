"""How fast the scan's corpus reader turns texts into batches, against the one-text-at-a-time path.

Variants, side by side in one process on SmolLM2-135M's tokenizer (no model run):

* ``per_text`` (baseline): what the reader did until session 9: one tokenizer call per text
  and every batch packed row by row, with every row's token strings converted;
* ``grouped``: ``row_batches`` + ``RowBatch.pack`` as the scan reads now
  (``TOKENIZE_CHARS`` of text per tokenizer call, one vectorized pad, strings on demand);
* ``grouped_share_of_N``: what process 0 of ``N`` reads (its segments of 128 Ki characters;
  it tokenizes no other);
* ``device_*``: a scan loop whose model is replaced by a wait of ``tokens / RATE`` seconds per
  batch, with the GIL released as a thread waiting on a GPU has it: ``device_per_text``
  reads each batch the old way before its wait (the old scan), ``device_inline`` the new way,
  ``device_read_ahead`` in the scan's reader thread (``reader.prefetched``: the scan now).
  ``RATE`` defaults to SmolLM2's plain forward on one H200 in bf16 at 32×512 (session 6:
  16,384 tokens in 0.0313 s).

Two corpora: short lines (the built-in corpus repeated, ~20 tokens a text) and documents
(50 of its lines joined, ~1,000 tokens a text, cut into rows of ``seq_len``).

``--scan`` adds, per corpus, the real thing on ``--device``: ``scan_growth``, ``rs.scan`` of
growth end to end (reader thread, lean pass, replayed on a GPU), against ``forward``, the
plain Hugging Face forward over the same batches packed beforehand (the scan's ratio to it
is then the reader's cost on top of statistics' own). Meant for a GPU: on this CPU the model,
not the reader, sets the pace.

    python benchmarks/corpus_speed.py [--model smollm2-135m] [--texts 16000] [--rate 523000]
        [--scan --device cuda --dtype bfloat16] [--out NAME]
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
from residual_stream.streaming import Corpus, row_batches  # noqa: E402
from residual_stream.streaming.corpus import builtin_corpus  # noqa: E402
from residual_stream.streaming.ledger import Share  # noqa: E402
from residual_stream.streaming.reader import prefetched  # noqa: E402

BATCH, SEQ = 32, 512


def per_text(model, texts):
    """The baseline: a tokenizer call per text, rows padded one by one, every string converted."""
    part = []
    for text in texts:
        ids = list(model.tokenizer(text, add_special_tokens=True)["input_ids"])
        for start in range(0, len(ids), SEQ):
            part.append(ids[start:start + SEQ])
            if len(part) == BATCH:
                yield _pack_loop(model, part)
                part = []
    if part:
        yield _pack_loop(model, part)


def _pack_loop(model, part):
    tokens = torch.full((len(part), max(map(len, part))), 0, dtype=torch.long)
    mask = torch.zeros_like(tokens)
    for r, ids in enumerate(part):
        tokens[r, :len(ids)], mask[r, :len(ids)] = torch.tensor(ids), 1
    return tokens, mask, [model.tokenizer.convert_ids_to_tokens(r) for r in part]


SEGMENT = 1 << 17  # characters per segment here (the default, 4 Mi, would make one segment)


def batches(model, texts, rank: int = 0, world: int = 1):
    """The scan's reader: ``row_batches`` packed, of process ``rank``'s segments of ``world``."""
    for rows in row_batches(model, Corpus(texts, SEGMENT), batch_size=BATCH, seq_len=SEQ,
                            share=Share(rank, world)):
        yield rows.pack(model)


def device_loop(model, texts, rate: float, reader: str) -> int:
    """A scan loop whose forward pass is a GIL-free wait of ``tokens / rate`` seconds."""
    n = 0
    read = {"per_text": lambda: (m for _, m, _ in per_text(model, texts)),
            "inline": lambda: (b.attention_mask for b in batches(model, texts)),
            "read_ahead": lambda: (b.attention_mask for b in prefetched(batches(model, texts)))}
    for mask in read[reader]():
        tokens = int(mask.sum())
        time.sleep(tokens / rate)
        n += tokens
    return n


def forward(model, texts):
    """The plain forward over the batches, packed before the clock starts (``main`` times it)."""
    return plain_forward(model, batches(model, texts))


def plain_forward(model, packed):
    """``run()``: the plain forward over ``packed`` batches, moved to the device beforehand."""
    ready = [(b.tokens.to(model.device), b.attention_mask.to(model.device)) for b in packed]

    def run():
        with torch.inference_mode():
            for tokens, mask in ready:
                model.module(input_ids=tokens, attention_mask=mask)
        if model.device.type == "cuda":
            torch.cuda.synchronize()
    return run


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
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--scan", action="store_true")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--dtype", default="float32")
    args = parser.parse_args()
    model = rs.load(args.model, device=args.device, dtype=args.dtype, progress=False)
    lines = builtin_corpus()
    corpora = {"lines": (lines * (args.texts // len(lines) + 1))[:args.texts]}
    docs = [" ".join(lines[i:i + 50]) for i in range(0, len(lines) - 50, 7)]
    corpora["documents"] = (docs * (args.texts // 50 // len(docs) + 1))[:max(1, args.texts // 50)]
    rows = []
    for name, texts in corpora.items():
        n = sum(len(model.tokenizer(t)["input_ids"]) for t in texts)
        variants = {
            "per_text": lambda texts=texts: list(per_text(model, texts)),
            "grouped": lambda texts=texts: list(batches(model, texts)),
            "grouped_share_of_2": lambda texts=texts: list(batches(model, texts, 0, 2)),
            "grouped_share_of_4": lambda texts=texts: list(batches(model, texts, 0, 4)),
            "device_per_text": lambda texts=texts: device_loop(model, texts, args.rate, "per_text"),
            "device_inline": lambda texts=texts: device_loop(model, texts, args.rate, "inline"),
            "device_read_ahead": lambda texts=texts: device_loop(model, texts, args.rate,
                                                                 "read_ahead"),
        }
        if args.scan:
            run = forward(model, texts)
            run()  # warm-up: kernels, and the replayed graphs of both batch shapes below
            rs.scan(model, texts, ["growth"], batch_size=BATCH, seq_len=SEQ, progress=False)
            variants["forward"] = run
            variants["scan_growth"] = lambda texts=texts: rs.scan(
                model, texts, ["growth"], batch_size=BATCH, seq_len=SEQ, progress=False)
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
    text = (f"{setting(args, model)}, "
            f"TOKENIZERS_PARALLELISM={os.environ.get('TOKENIZERS_PARALLELISM', 'unset')}, "
            f"device_* rate {args.rate:,.0f} tokens/s, batches {BATCH}×{SEQ}\n\n{text}")
    save(text, rows, args.out)


def setting(args: argparse.Namespace, model) -> str:
    """The table's first words: the model, its device and dtype, the threads."""
    return f"{args.model} on {model.device} ({args.dtype}), {torch.get_num_threads()} threads"


def save(text: str, rows: list[dict], out: str | None) -> None:
    """Print ``text``; with ``out``, write it as ``.md`` and ``rows`` as ``.json``.

    ``out`` is a path without suffix; a bare name lands beside this script.
    """
    print(text)
    if out:
        path = Path(out) if os.sep in out else Path(__file__).parent / out
        path.with_suffix(".md").write_text(text + "\n", encoding="utf-8")
        path.with_suffix(".json").write_text(json.dumps(rows, indent=1), encoding="utf-8")


if __name__ == "__main__":
    main()
