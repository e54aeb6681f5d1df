"""Corpora for scanning: texts read lazily, tokenized, cut into rows, grouped into batches.

A corpus is a list of texts, a file, a folder of files (in name order) or ``"builtin"`` (the
shipped corpus). A file is plain text (one text per non-empty line) or JSON Lines (a text in
each record's ``text_field``), either gzipped or not (``sources``). Texts
are read lazily, a segment at a time, and tokenized ``tokenize.TOKENIZE_CHARS`` characters
per call (a long text in pieces), so a corpus of any size streams through in constant
memory. Each text gets the ids ``rs.trace`` gives it (with the tokenizer's special tokens),
a group of texts per call: the fast tokenizers' batch path, and with packing 2.3× (short
lines) and 1.7× (documents) the batches per second of one call a text, on one core with
SmolLM2's tokenizer. Texts are cut into rows of at most ``seq_len`` tokens.

The texts are grouped into *segments* by their characters alone (``Corpus.segments``:
``SEGMENT_CHARS``, 4 Mi, by default; a longer text is cut between words into parts of
about that size, each a segment, whose ids join to the text's), and each segment's rows
into batches of
``batch_size``, its last batch possibly smaller. With ``order="length"`` (the default) the
rows of each window of ``SORT_BATCHES`` batches are sorted longest first before they are
cut into batches, so a batch pads its rows to about their own length: on the built-in
corpus of one-sentence texts at 32 rows a batch, 0.87 of the padded positions are real
tokens against 0.44 in corpus order. ``order="text"`` keeps the corpus order. Either way
batch ``(segment, index)`` is the same batch in every run and every process, which makes
resuming and sharding exact, and a process can skip a segment without tokenizing it
(``row_batches(own=...)``): the reading of a corpus is shared by the processes that scan
it. Each row keeps its text's index in the corpus and its first token's position in that
text (in a part, counted from the part's first character, ``text_char``), so no statistic
depends on the order (sampled tokens are chosen by those two).
``row_batches`` gives each batch's rows unpacked (``RowBatch``); ``corpus_batches`` packs
them.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, NamedTuple

from ..errors import EmptyTextError, InputError
from ..inputs import Batch, pack
from .progress import ReadProgress
from .sources import (
    builtin_corpus,
    corpus_files,
    file_texts,
    files_fingerprint,
    kind,
    ordered_and_reread,
    probes,
    sizes,
)
from .tokenize import can_cut, groups, part_chunks, spans, token_chunks

if TYPE_CHECKING:
    from .ledger import Ledger

SEGMENT_CHARS = 1 << 22  # characters per segment (~1M tokens of English), at least a text
SORT_BATCHES = 32  # order="length": batches whose rows are sorted together
ITEMS = "items"  # the progress unit of an in-memory corpus: one of its items
ORDERS = {  # a batch order: how the rows of a window are sorted (None: kept in corpus order)
    "length": lambda row: -len(row[0]),  # longest first; sorted() keeps ties in corpus order
    "text": None,
}


class Segment(NamedTuple):
    """Texts ``first``, ``first + 1``, … of a corpus (``Corpus.segments``), or a part of one.

    ``span``: the characters ``[start, end)`` of ``texts[0]`` (its only text) that the
    segment holds, when a long text is cut into parts; None for whole texts.
    """

    first: int
    texts: list[str]
    span: tuple[int, int] | None = None


@dataclass(frozen=True)
class Corpus:
    """Where the texts come from (see the module docstring)."""

    source: str | Path | Iterable[str]  # a collection read the same every time (checked)
    segment_chars: int = SEGMENT_CHARS
    text_field: str = "text"  # the field of a JSON Lines record that holds its text

    def __post_init__(self) -> None:
        """Refuse a segment size that is not a positive number of characters, an empty field."""
        if not isinstance(self.segment_chars, int) or self.segment_chars < 1:
            raise InputError(f"segment_chars must be a positive number of characters, got "
                             f"{self.segment_chars!r}")
        if not isinstance(self.text_field, str) or not self.text_field:
            raise InputError(f"text_field must name a JSON field, got {self.text_field!r}")
        if not ordered_and_reread(self.source):
            raise InputError(f"a corpus is read more than once, in one order (its first batch, "
                             f"a resumed scan), so it cannot be a {type(self.source).__name__}: "
                             "pass a list of texts, a file or a folder")

    def _files(self) -> list[Path]:
        return corpus_files(Path(self.source))

    def texts(self, reading: ReadProgress | None = None) -> Iterator[str]:
        """Every text, in order, read lazily: a text file's lines stripped, others as given.

        A list's blank strings, a file's blank lines and a JSON Lines file's blank texts are
        skipped: text ``i`` of a scan (``Batch.text_index``, a massive activation's ``text``)
        is the ``i``-th non-blank text given. ``reading`` counts what is read (``units``).
        """
        count = reading if reading is not None else ReadProgress({})  # counted, not read
        yield from self._listed_texts(count) if self._in_memory() else self._file_texts(count)

    def _listed_texts(self, reading: ReadProgress) -> Iterator[str]:
        items = 0
        for items, t in enumerate(self._listed(), start=1):
            if not isinstance(t, str):
                raise InputError(f"corpus item {items - 1} is a {type(t).__name__}, not a text")
            if t.strip():
                reading.read(ITEMS, len(t), items)
                yield t
        reading.file_ended(ITEMS, items)  # blank items at the end too

    def _file_texts(self, reading: ReadProgress) -> Iterator[str]:
        base: dict[str, int] = {}  # bytes of the files read before, per kind
        for f in self._files():
            k = kind(f)
            for text, position in file_texts(f, self.text_field):
                reading.read(k, len(text), base.get(k, 0) + position)
                yield text
            base[k] = base.get(k, 0) + f.stat().st_size
            reading.file_ended(k, base[k])

    def _in_memory(self) -> bool:
        return not isinstance(self.source, (str, Path)) or self.source == "builtin"

    def _listed(self) -> Iterable:
        """An in-memory corpus's items: the built-in texts, or the collection given."""
        return builtin_corpus() if isinstance(self.source, str) else self.source

    def units(self) -> dict[str, int]:
        """The corpus's size in ``progress`` units, per kind: its files' bytes, or a list's items.

        Known before reading it, without a pass over the texts: files by their sizes, per
        ``sources.kind``; a list (a dataset's column) by its length, blank items included
        (``texts`` counts them too), as ``ITEMS``.
        """
        return {ITEMS: len(self._listed())} if self._in_memory() else sizes(self._files())

    def progress(self) -> ReadProgress:
        """Counters for reading this corpus (``progress.ReadProgress``).

        With its ``units``, and for files each kind's probe (``sources.probes``: characters
        per byte at the start of its first file).
        """
        if self._in_memory():
            return ReadProgress(self.units())
        files = self._files()  # listed once for both
        return ReadProgress(sizes(files), probes(files, self.text_field))

    def segments(self, reading: ReadProgress | None = None,
                 cut: Callable[[], bool] | None = None) -> Iterator[Segment]:
        """Each ``Segment`` in order.

        A segment is the consecutive texts that first reach ``segment_chars`` characters (the
        last one may hold fewer). Batches never span two, so a process can skip the segments
        of others without tokenizing them (``row_batches``). When ``cut()`` says yes (asked
        once a text is longer than ``segment_chars``: whether the tokenizer's ids are kept
        by a cut between words, ``tokenize.Splitter``), a text longer than
        ``segment_chars`` is cut between words into parts of about that many characters, each
        a segment of its own (the texts before it, one more), so a corpus on one line is shared
        by the processes and a resumed scan skips the parts done untokenized.
        """
        first = 0
        for texts in groups(self.texts(reading), self.segment_chars):
            long = texts[-1]
            parts = (spans(long, self.segment_chars)
                     if len(long) > self.segment_chars and cut is not None and cut() else [])
            if len(parts) < 2:  # no text to cut, or one with no place to cut it
                yield Segment(first, texts)
                first += len(texts)
                continue
            if len(texts) > 1:
                yield Segment(first, texts[:-1])
            first += len(texts) - 1
            for span in parts:
                yield Segment(first, [long], span)
            first += 1

    def fingerprint(self) -> str:
        """Identifies the corpus in a saved scan state, wherever its files lie.

        A list: its length and a hash of its texts. Files: their names within the corpus (not
        its path), sizes, and the first and last ``sources.FINGERPRINT_ENDS`` bytes of each, hashed,
        so the same files copied or downloaded elsewhere resume a scan (before, a new path
        or modification time refused it); with any JSON Lines file, the field its texts come
        from too. An edit inside a file that keeps its size and both ends is not seen.
        """
        if not isinstance(self.source, (str, Path)):
            digest = hashlib.sha256()
            for text in self.source:  # text by text: a dataset's column is never joined whole
                digest.update(str(text).encode() + b"\0")
            return f"list of {len(self.source)} texts sha256:{digest.hexdigest()[:16]}"
        if self.source == "builtin":
            return "builtin"
        return files_fingerprint(Path(self.source), self._files(), self.text_field)


@dataclass(frozen=True)
class RowBatch:
    """One batch's rows of token ids before packing, and where they are in the corpus.

    Row ``r`` is text ``text_index[r]`` of the corpus from its token ``text_start[r]`` on,
    tokens counted from its character ``text_char[r]`` (0 unless the text was cut into
    parts, ``Segment``); the batch is number ``index`` of segment ``segment`` (``key``: the
    batch's identity in a saved scan state and in ``rs.scan``'s ``on_batch``).
    """

    rows: list[list[int]]
    text_index: tuple[int, ...]
    text_start: tuple[int, ...]
    segment: int
    index: int
    text_char: tuple[int, ...] = ()

    def __post_init__(self) -> None:
        """Rows count their tokens from their texts' first character unless told otherwise."""
        if not self.text_char:
            object.__setattr__(self, "text_char", (0,) * len(self.rows))

    @property
    def key(self) -> tuple[int, int]:
        """``(segment, index in the segment)``."""
        return self.segment, self.index

    def pack(self, model) -> Batch:
        """The padded ``Batch``, its rows' places kept and token strings converted on demand."""
        return pack(model, self.rows, self.text_index, self.text_start, names="lazy",
                    text_char=self.text_char)


def _rows(model, segment: Segment, seq_len: int,
          reading: ReadProgress | None = None) -> Iterator[tuple[list[int], int, int]]:
    """``(ids, text index, start)`` of each row of ``segment``'s texts (or of its part).

    A text's ids may come in several chunks (a long text's pieces, ``tokenize``); its rows
    are cut from their concatenation, ``seq_len`` ids each, the last possibly shorter. A
    part's rows start at its first token. ``reading`` counts the characters tokenized and
    the tokens they made.
    """
    first = segment.first
    current, buf, start = None, [], 0
    for t, chunk, chars in segment_chunks(model, segment):
        if reading is not None:
            reading.tokenized(chars, len(chunk))
        if t != current:
            if buf:
                yield buf, first + current, start
            current, buf, start = t, [], 0
        buf += chunk
        cut = 0
        while len(buf) - cut >= seq_len:
            yield buf[cut:cut + seq_len], first + t, start
            cut, start = cut + seq_len, start + seq_len
        buf = buf[cut:]
    if buf:
        yield buf, first + current, start


def segment_chunks(model, segment: Segment) -> Iterator[tuple[int, list[int], int]]:
    """``tokenize.token_chunks`` of ``segment``'s texts, or ``part_chunks`` of its part."""
    if segment.span is None:
        return token_chunks(model.tokenizer, segment.texts)
    return part_chunks(model.tokenizer, segment.texts[0], segment.span)


def _batch(part: list[tuple[list[int], int, int]], segment: int, index: int,
           char: int) -> RowBatch:
    rows, texts, starts = zip(*part, strict=True)
    return RowBatch(list(rows), texts, starts, segment, index, (char,) * len(rows))


class _Budget:
    """The tokens a scan may still take (``max_tokens``; unbounded without)."""

    def __init__(self, tokens: int | None) -> None:
        self.left = float("inf") if tokens is None else tokens

    def take(self, ids: list[int]) -> list[int]:
        """``ids``, cut to what is left, and taken."""
        ids = ids[:int(min(len(ids), self.left))]
        self.left -= len(ids)
        return ids

    def skip(self, tokens: int) -> None:
        """A segment of ``tokens`` is passed over: as many taken (up to what is left)."""
        self.left -= min(tokens, self.left)

    @property
    def spent(self) -> bool:
        """Whether nothing is left."""
        return self.left <= 0


def _windows(rows: Iterator[tuple[list[int], int, int]], size: int,
             budget: _Budget) -> Iterator[list[tuple[list[int], int, int]]]:
    """``rows`` (cut to ``budget``) in consecutive lists of ``size``, the last possibly shorter."""
    part: list = []
    for ids, t, start in rows:
        part.append((budget.take(ids), t, start))
        if len(part) == size or budget.spent:
            yield part
            part = []
        if budget.spent:
            return
    if part:
        yield part


def _segment_batches(model, number: int, segment: Segment, seq_len: int,
                     batch_size: int, budget: _Budget, order: str,
                     reading: ReadProgress | None) -> Iterator[RowBatch]:
    key = ORDERS[order]
    size = batch_size if key is None else batch_size * SORT_BATCHES
    char = 0 if segment.span is None else segment.span[0]
    index = 0
    for part in _windows(_rows(model, segment, seq_len, reading), size, budget):
        part = part if key is None else sorted(part, key=key)
        for i in range(0, len(part), batch_size):
            yield _batch(part[i:i + batch_size], number, index, char)
            index += 1


def _check_sizes(model, batch_size: int, seq_len: int, max_tokens: int | None,
                 order: str) -> None:
    if order not in ORDERS:
        raise InputError(f"order must be one of {sorted(ORDERS)}, not {order!r}")
    if batch_size < 1 or seq_len < 1:
        raise InputError(f"batch_size and seq_len must be positive, got {batch_size} and {seq_len}")
    if seq_len > model.anatomy.n_ctx:
        raise InputError(f"seq_len {seq_len} is longer than the model's context of "
                         f"{model.anatomy.n_ctx}; pass a smaller seq_len")
    if max_tokens is not None and max_tokens < 1:
        raise InputError(f"max_tokens must be positive, got {max_tokens}")


def row_batches(
    model, corpus: Corpus, *, batch_size: int, seq_len: int, max_tokens: int | None = None,
    own: Callable[[int], bool] | None = None, order: str = "length",
    reading: ReadProgress | None = None, ledger: Ledger | None = None,
) -> Iterator[RowBatch]:
    """The corpus's batches in order (``corpus_batches`` unpacked), at most ``max_tokens`` tokens.

    Each segment's rows (``Corpus.segments``) are grouped into batches of ``batch_size``, its
    last batch possibly smaller; ``order`` (``ORDERS``): ``"length"`` sorts the rows of each
    ``SORT_BATCHES`` batches longest first, ``"text"`` keeps the corpus order. The budget
    takes tokens in corpus order, so both orders read the same tokens.
    ``own(segment)``: only the batches of the segments it accepts
    (a process's share). The others are skipped untokenized, unless ``max_tokens`` is given
    and ``ledger`` (``ledger.Ledger``) has not counted them: then they are tokenized, to
    count where the budget ends, and recorded in it. ``reading``
    (``progress.ReadProgress``) counts what is read and tokenized.
    """
    _check_sizes(model, batch_size, seq_len, max_tokens, order)
    budget, empty = _Budget(max_tokens), True
    for number, segment in enumerate(corpus.segments(reading, lambda: can_cut(model.tokenizer))):
        empty = False
        mine = own is None or own(number)
        known = None if ledger is None or mine else ledger.known(number)
        if max_tokens is not None and known is not None:
            budget.skip(known)  # counted before: passed over untokenized
        elif mine or max_tokens is not None:
            left = budget.left
            batches = _segment_batches(model, number, segment, seq_len, batch_size, budget,
                                       order, reading)
            if mine:
                yield from batches
            else:
                for _ in batches:  # another's: counted, not kept
                    pass
            if ledger is not None and max_tokens is not None:
                ledger.record(number, left - budget.left)
        if budget.spent:
            return
    if empty:
        raise EmptyTextError("the corpus has no texts: give a file or folder with one text per line")


def corpus_batches(
    model, corpus: Corpus, *, batch_size: int, seq_len: int, max_tokens: int | None = None,
    order: str = "length",
) -> Iterator[Batch]:
    """The corpus's padded batches in order, at most ``max_tokens`` tokens in all.

    Token strings are converted when read (``pack(names="lazy")``); ``row_batches`` has
    each batch's place in the corpus and the meaning of ``order``.
    """
    for rows in row_batches(model, corpus, batch_size=batch_size, seq_len=seq_len,
                            max_tokens=max_tokens, order=order):
        yield rows.pack(model)
