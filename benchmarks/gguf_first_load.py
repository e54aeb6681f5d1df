"""A GGUF file's first load: transformers' three readings of it, each parsed apart or sharing one parse.

``gguf_cache.from_gguf`` (what a first load dequantizes: transformers' model and tokenizer from
the GGUF) is run plain and inside ``gguf_cache.reads_once``, ``--rounds`` rounds interleaved
(plain, shared, plain, shared, ...) in one process after a warm-up load that pays the imports,
the median of each kept. Reported: the seconds of each, their ratio, and ``GGUFReader``
parses and tensor-name tables built per load (counted by wrapping gguf's own functions). Both
ways must give equal tensors, configs and tokenizers (checked: every tensor bit for bit, the
config's dict, the vocabulary and the ids of a probe text).

    python benchmarks/gguf_first_load.py [--gguf PATH] [--rounds 2] [--out NAME]

The default file is the bundled SmolLM2-135M-Instruct (Q4_1).
"""

from __future__ import annotations

import argparse
import contextlib
import statistics
import time
from pathlib import Path

import gguf
import torch
from corpus_speed import save  # this folder's; run as a script

from residual_stream.gguf_cache import from_gguf, reads_once
from residual_stream.registry import REGISTRY

PROBE = "The residual stream grows, naïvely: 東京, x² + 1 ✓"


@contextlib.contextmanager
def counted(counts: dict):
    """Count the calls of gguf's ``GGUFReader`` and ``get_tensor_name_map`` (what transformers imports)."""
    reader, name_map = gguf.GGUFReader, gguf.get_tensor_name_map

    def count(key, fn):
        def wrapped(*args, **kwargs):
            counts[key] = counts.get(key, 0) + 1
            return fn(*args, **kwargs)
        return wrapped

    gguf.GGUFReader, gguf.get_tensor_name_map = count("parses", reader), count("name_maps", name_map)
    try:
        yield
    finally:
        gguf.GGUFReader, gguf.get_tensor_name_map = reader, name_map


def load(path: Path, shared: bool) -> tuple[float, dict, tuple]:
    """Seconds of one dequantization of ``path``, the parses counted, and (model, tokenizer).

    The counting wrappers go under ``reads_once``'s memo (it memoizes what it finds), so only the
    parses and tables it lets through are counted.
    """
    counts: dict = {}
    start = time.perf_counter()
    with counted(counts), (reads_once() if shared else contextlib.nullcontext()):
        model, tok, _ = from_gguf(path)
    return time.perf_counter() - start, counts, (model, tok)


def same(a: tuple, b: tuple) -> None:
    """Assert that two loads gave equal tensors, configs and tokenizers."""
    (ma, ta), (mb, tb) = a, b
    sa, sb = ma.state_dict(), mb.state_dict()
    assert sa.keys() == sb.keys() and all(torch.equal(sa[k], sb[k]) for k in sa), "tensors differ"
    assert ma.config.to_dict() == mb.config.to_dict(), "configs differ"
    assert ta.get_vocab() == tb.get_vocab() and ta(PROBE)["input_ids"] == tb(PROBE)["input_ids"], \
        "tokenizers differ"


def main() -> None:
    """Load the GGUF file both ways ``--rounds`` times each, interleaved; print the table."""
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--gguf", default=None, help="a GGUF file (default: the bundled SmolLM2's)")
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--out", default=None, help="write NAME.md and NAME.json (beside this script)")
    args = p.parse_args()
    path = Path(args.gguf or REGISTRY["smollm2-135m"].location())
    reference = load(path, shared=False)[2]  # warm-up: imports and the file in the page cache
    times: dict[str, list[float]] = {"plain": [], "shared": []}
    counts: dict[str, dict] = {}
    for _ in range(args.rounds):
        for way in times:
            seconds, counts[way], loaded = load(path, shared=way == "shared")
            same(reference, loaded)
            times[way].append(seconds)
    plain = statistics.median(times["plain"])
    rows = [{"way": way, "seconds": round(statistics.median(ts), 2), "rounds": [round(t, 2) for t in ts],
             "ratio_to_plain": round(statistics.median(ts) / plain, 3), **counts[way]}
            for way, ts in times.items()]
    lines = [f"GGUF first load (`from_gguf`), {path.name}, {torch.get_num_threads()} threads, median of "
             f"{args.rounds} interleaved rounds; every tensor, the config and the tokenizer equal", "",
             "| way | seconds | rounds | ratio to plain | GGUFReader parses | tensor-name tables |",
             "|---|---|---|---|---|---|"]
    lines += [f"| {r['way']} | {r['seconds']} | {', '.join(map(str, r['rounds']))} | "
              f"×{r['ratio_to_plain']} | {r.get('parses', 0)} | {r.get('name_maps', 0)} |" for r in rows]
    save("\n".join(lines), rows, args.out)


if __name__ == "__main__":
    main()
