"""Corpora for scanning: texts read lazily, tokenized, cut into rows, grouped into batches.

A corpus is a list of texts, a text file (one text per non-empty line), a folder of ``.txt``
files (each line a text, files in name order) or ``"builtin"`` (the shipped corpus). Texts
are read one at a time, so a corpus of any size streams through in constant memory. Each
text is tokenized as ``rs.trace`` would (with the tokenizer's special tokens) and cut into
rows of at most ``seq_len`` tokens; rows are grouped into batches of ``batch_size``, the
last one possibly smaller. The order is fixed by the corpus alone, so batch ``i`` is the
same batch in every run: that is what makes resuming and sharding exact.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from importlib import resources
from pathlib import Path

from ..errors import EmptyTextError, InputError
from ..inputs import Batch, pack


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


def _rows(model, corpus: Corpus, seq_len: int, max_tokens: int | None) -> Iterator[list[int]]:
    budget = max_tokens if max_tokens is not None else float("inf")
    for text in corpus.texts():
        ids = list(model.tokenizer(text, add_special_tokens=True)["input_ids"])
        for start in range(0, len(ids), seq_len):
            row = ids[start:start + seq_len][: int(min(seq_len, budget))]
            if not row:
                return
            budget -= len(row)
            yield row
            if budget <= 0:
                return


def corpus_batches(
    model, corpus: Corpus, *, batch_size: int, seq_len: int, max_tokens: int | None = None
) -> Iterator[tuple[Batch, int]]:
    """``(batch, index of its first row)`` over the corpus, at most ``max_tokens`` tokens in all."""
    if batch_size < 1 or seq_len < 1:
        raise InputError(f"batch_size and seq_len must be positive, got {batch_size} and {seq_len}")
    if seq_len > model.anatomy.n_ctx:
        raise InputError(f"seq_len {seq_len} is longer than the model's context of "
                         f"{model.anatomy.n_ctx}; pass a smaller seq_len")
    if max_tokens is not None and max_tokens < 1:
        raise InputError(f"max_tokens must be positive, got {max_tokens}")
    rows: list[list[int]] = []
    first, any_rows = 0, False
    for row in _rows(model, corpus, seq_len, max_tokens):
        rows.append(row)
        if len(rows) == batch_size:
            yield pack(model, rows), first
            first, rows, any_rows = first + batch_size, [], True
    if rows:
        yield pack(model, rows), first
    elif not any_rows:
        raise EmptyTextError("the corpus has no texts: give a file or folder with one text per line")
