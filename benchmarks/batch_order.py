"""What sorting each batch's rows by length saves: padded positions, and a scan's time.

For each corpus and each batch order (``rs.scan(order=...)``: ``text`` keeps the corpus
order, ``length`` sorts the rows of every ``batching.SORT_BATCHES`` batches longest first),
counted exactly from the batches the scan reads:

* ``eager_fill``: real tokens / positions computed by an eager pass (each batch padded to its
  longest row);
* ``replay_fill``: the same for a replayed pass on a GPU, whose batches are padded to a
  quarter, a half or all of ``seq_len`` (``graphs.padded_width``); ``replay_fill_before``:
  padded to ``seq_len``, as replays were until session 13.

Timed side by side in one process, ``--rounds`` times each, interleaved (median): ``forward``,
the plain Hugging Face forward over the corpus-order batches packed beforehand (the issue's
baseline), and ``scan_text`` / ``scan_length``: ``rs.scan`` of ``--stats`` end to end in each
order. On a GPU the scan replays (the ``replay_fill`` positions); on the CPU it runs eagerly.

Three corpora from the built-in one: ``lines`` (its texts, ~20 tokens each), ``documents``
(50 lines joined, ~1,000 tokens), ``varied`` (1 to 40 lines joined, in a fixed shuffled order).

    python benchmarks/batch_order.py [--model smollm2-135m] [--batch-size 32] [--seq-len 128]
        [--stats growth] [--device cpu] [--dtype float32] [--rounds 3]
        [--corpora lines,documents,varied] [--out NAME]
"""

from __future__ import annotations

import argparse
import json
import os
import random

os.environ.setdefault("HF_HUB_OFFLINE", "1")

from corpus_speed import plain_forward, save, setting, timed  # noqa: E402  (this folder's; run as a script)

import residual_stream as rs  # noqa: E402
from residual_stream.streaming import Corpus, corpus_batches, row_batches  # noqa: E402
from residual_stream.streaming.corpus import builtin_corpus  # noqa: E402
from residual_stream.streaming.graphs import padded_width  # noqa: E402


def corpora(copies: int) -> dict[str, list[str]]:
    """The three corpora, ``copies`` times the built-in lines' worth of text each."""
    lines = builtin_corpus()
    docs = [" ".join(lines[i:i + 50]) for i in range(0, len(lines) - 50, 7)]
    rng = random.Random(0)
    varied, i = [], 0
    while i < len(lines):
        k = rng.randint(1, 40)
        varied.append(" ".join(lines[i:i + k]))
        i += k
    rng.shuffle(varied)
    return {"lines": lines * copies, "documents": docs[:max(1, copies * 7)],
            "varied": varied * copies}


def fills(model, texts: list[str], order: str, batch_size: int, seq_len: int) -> dict:
    """Real tokens, batches, and the share of computed positions that are real tokens."""
    real = eager = replay = before = batches = 0
    for b in row_batches(model, Corpus(texts), batch_size=batch_size, seq_len=seq_len, order=order):
        lengths = [len(r) for r in b.rows]
        real += sum(lengths)
        eager += len(lengths) * max(lengths)
        replay += len(lengths) * padded_width(max(lengths), seq_len)
        before += len(lengths) * seq_len
        batches += 1
    return {"tokens": real, "batches": batches, "eager_fill": real / eager,
            "replay_fill": real / replay, "replay_fill_before": real / before}


def forward(model, texts: list[str], batch_size: int, seq_len: int):
    """The plain forward over the corpus-order batches, packed before the clock starts."""
    return plain_forward(model, corpus_batches(model, Corpus(texts), batch_size=batch_size,
                                               seq_len=seq_len, order="text"))


def main() -> None:
    """Count and time every corpus in both orders; print and save the table."""
    parser = argparse.ArgumentParser()
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--seq-len", type=int, default=128)
    parser.add_argument("--stats", default="growth")
    parser.add_argument("--copies", type=int, default=1, help="built-in corpora's worth of text")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--dtype", default="float32")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--corpora", default="lines,documents,varied")
    parser.add_argument("--out", default=None)
    args = parser.parse_args()
    model = rs.load(args.model, device=args.device, dtype=args.dtype, progress=False)
    stats = [s for s in args.stats.split(",") if s]
    kw = dict(batch_size=args.batch_size, seq_len=args.seq_len)
    rows = []
    for name, texts in corpora(args.copies).items():
        if name not in args.corpora.split(","):
            continue
        row = {"corpus": name, "texts": len(texts)}
        for order in ("text", "length"):
            row |= {f"{k}_{order}": v for k, v in fills(model, texts, order, **kw).items()}
        variants = {"forward": forward(model, texts, **kw)}
        for order in ("text", "length"):
            variants[f"scan_{order}"] = lambda order=order, texts=texts: rs.scan(
                model, texts, stats, order=order, progress=False, **kw)
        for fn in variants.values():  # warm-up: kernels, and on a GPU every replayed shape
            fn()
        times = {k: [] for k in variants}
        for _ in range(args.rounds):
            for k, fn in variants.items():
                times[k].append(timed(fn))
        median = {k: sorted(ts)[len(ts) // 2] for k, ts in times.items()}
        row |= {f"{k}_s": s for k, s in median.items()} | {f"{k}_rounds": ts for k, ts in times.items()}
        row |= {"x_text": median["scan_text"] / median["forward"],
                "x_length": median["scan_length"] / median["forward"],
                "speedup": median["scan_text"] / median["scan_length"],
                "tokens_per_s_text": row["tokens_text"] / median["scan_text"],
                "tokens_per_s_length": row["tokens_length"] / median["scan_length"]}
        rows.append(row)
        print(json.dumps(row), flush=True)
    head = ("| corpus | texts | tokens | batches (text / length) | eager fill (text → length) | "
            "replay fill (seq_len → bucketed text → bucketed length) | forward s | "
            "scan text s (×fwd) | scan length s (×fwd) | speed-up |")
    out = [head, "|---" * 10 + "|"]
    out += [f"| {r['corpus']} | {r['texts']:,} | {r['tokens_text']:,} | {r['batches_text']} / "
            f"{r['batches_length']} | {r['eager_fill_text']:.2f} → {r['eager_fill_length']:.2f} | "
            f"{r['replay_fill_before_text']:.2f} → {r['replay_fill_text']:.2f} → "
            f"{r['replay_fill_length']:.2f} | {r['forward_s']:.2f} | {r['scan_text_s']:.2f} "
            f"(×{r['x_text']:.2f}) | {r['scan_length_s']:.2f} (×{r['x_length']:.2f}) | "
            f"×{r['speedup']:.2f} |" for r in rows]
    text = (f"{setting(args, model)}, "
            f"stats {stats}, batches {args.batch_size}×{args.seq_len}, {args.rounds} rounds "
            f"(median)\n\n" + "\n".join(out))
    save(text, rows, args.out)


if __name__ == "__main__":
    main()
