"""Corpora for scanning: texts read lazily, tokenized, cut into rows, grouped into batches.

A corpus is a list of texts, a text file (one text per non-empty line), a folder of ``.txt``
files (each line a text, files in name order) or ``"builtin"`` (the shipped corpus). Texts
are read lazily, ``TOKENIZE_CHARS`` characters at a time, so a corpus of any size streams
through in constant memory. Each text is tokenized as ``rs.trace`` would (with the
tokenizer's special tokens), a group of texts per call: the fast tokenizers' batch path,
the same ids, and with packing 2.6× (short lines) and 1.7× (documents) the batches per
second of one call a text, on one core with SmolLM2's tokenizer. Texts are cut into rows of
at most ``seq_len`` tokens; rows are grouped into batches of ``batch_size``, the last one
possibly smaller. The order is fixed by the corpus alone, so batch ``i`` is the same batch
in every run: that is what makes resuming and sharding exact. ``row_batches`` gives each
batch's rows, unpacked (a process skips the batches of others without packing them);
``corpus_batches`` packs them.
"""

from __future__ import annotations

import hashlib
import itertools
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from importlib import resources
from pathlib import Path

from ..errors import EmptyTextError, InputError
from ..inputs import TOKENIZER_LOCK, Batch, pack

TOKENIZE_CHARS = 1 << 16  # characters per tokenizer call (~16,000 tokens of English), at least a text


def builtin_corpus() -> list[str]:
    """The shipped corpus: 220 English sentences and 100 lines of Python, one per line."""
    text = resources.files("residual_stream").joinpath("data/builtin_corpus.txt").read_text("utf-8")
    return [line for line in text.splitlines() if line and not line.startswith("#")]


@dataclass(frozen=True)
class Corpus:
    """Where the texts come from (see the module docstring)."""

    source: str | Path | Sequence[str]

    def _files(self) -> list[Path]:
        path = Path(self.source)
        if path.is_dir():  # an empty folder is an empty corpus: its consumers say so
            return sorted(path.rglob("*.txt"))
        if path.is_file():
            return [path]
        raise InputError(f"corpus {self.source!r} is not 'builtin', a text file or a folder of "
                         ".txt files")

    def texts(self) -> Iterator[str]:
        """Every non-empty line (stripped), in order, read lazily."""
        if not isinstance(self.source, (str, Path)):
            yield from (t for t in self.source if t.strip())
            return
        if self.source == "builtin":
            yield from builtin_corpus()
            return
        for f in self._files():
            with f.open(encoding="utf-8", errors="replace") as handle:
                yield from (line.strip() for line in handle if line.strip())

    def fingerprint(self) -> str:
        """Identifies the corpus in a saved scan state: name, size and modification time."""
        if not isinstance(self.source, (str, Path)):
            digest = hashlib.sha256("\0".join(self.source).encode()).hexdigest()[:16]
            return f"list of {len(self.source)} texts sha256:{digest}"
        if self.source == "builtin":
            return "builtin"
        return ";".join(f"{f}:{f.stat().st_size}:{int(f.stat().st_mtime)}" for f in self._files())


def _groups(texts: Iterable[str]) -> Iterator[list[str]]:
    group, size = [], 0
    for text in texts:
        group.append(text)
        size += len(text)
        if size >= TOKENIZE_CHARS:
            yield group
            group, size = [], 0
    if group:
        yield group


def _encoder(tokenizer) -> Callable[[list[str]], list[list[int]]]:
    """Token ids of a list of texts, as ``tokenizer(text, add_special_tokens=True)`` gives each.

    A fast tokenizer whose backend neither pads nor truncates is called directly
    (``encode_batch_fast``: no offsets; 1.7× the tokens per second of the Hugging Face call
    on SmolLM2's tokenizer and one core, 2.8× on two); any other goes through the
    tokenizer's own call, which sets the backend's padding and truncation for each call.
    """
    backend = getattr(tokenizer, "backend_tokenizer", None)
    fast = getattr(backend, "encode_batch_fast", None)
    if fast is not None and backend.padding is None and backend.truncation is None:
        return lambda texts: [e.ids for e in fast(texts, add_special_tokens=True)]
    return lambda texts: tokenizer(texts, add_special_tokens=True,
                                   return_attention_mask=False)["input_ids"]


def token_ids(tokenizer, texts: Iterable[str]) -> Iterator[list[int]]:
    """Each text's token ids (special tokens added), ``TOKENIZE_CHARS`` of text per tokenizer call."""
    encode = _encoder(tokenizer)
    for group in _groups(texts):
        with TOKENIZER_LOCK:  # the scan's reader thread and the caller may share a tokenizer
            ids = encode(group)
        yield from (list(i) for i in ids)


def _rows(model, corpus: Corpus, seq_len: int, max_tokens: int | None) -> Iterator[list[int]]:
    budget = max_tokens if max_tokens is not None else float("inf")
    for ids in token_ids(model.tokenizer, corpus.texts()):
        for start in range(0, len(ids), seq_len):
            row = ids[start:start + seq_len][: int(min(seq_len, budget))]
            if not row:
                return
            budget -= len(row)
            yield row
            if budget <= 0:
                return


def row_batches(
    model, corpus: Corpus, *, batch_size: int, seq_len: int, max_tokens: int | None = None
) -> Iterator[tuple[list[list[int]], int]]:
    """``(rows of token ids, index of the first row)`` per batch: ``corpus_batches`` unpacked."""
    if batch_size < 1 or seq_len < 1:
        raise InputError(f"batch_size and seq_len must be positive, got {batch_size} and {seq_len}")
    if seq_len > model.anatomy.n_ctx:
        raise InputError(f"seq_len {seq_len} is longer than the model's context of "
                         f"{model.anatomy.n_ctx}; pass a smaller seq_len")
    if max_tokens is not None and max_tokens < 1:
        raise InputError(f"max_tokens must be positive, got {max_tokens}")
    rows = _rows(model, corpus, seq_len, max_tokens)
    first = 0
    while batch := list(itertools.islice(rows, batch_size)):
        yield batch, first
        first += len(batch)
    if first == 0:
        raise EmptyTextError("the corpus has no texts: give a file or folder with one text per line")


def corpus_batches(
    model, corpus: Corpus, *, batch_size: int, seq_len: int, max_tokens: int | None = None
) -> Iterator[tuple[Batch, int]]:
    """``(batch, index of its first row)`` over the corpus, at most ``max_tokens`` tokens in all.

    Token strings are converted when read (``pack(names="lazy")``).
    """
    for rows, first in row_batches(model, corpus, batch_size=batch_size, seq_len=seq_len,
                                   max_tokens=max_tokens):
        yield pack(model, rows, names="lazy"), first
