"""Corpora for scanning: texts read lazily and grouped into segments.

A corpus is a list of texts, a file, a folder of files (in name order) or ``"builtin"`` (the
shipped corpus). A file is plain text (one text per non-empty line) or JSON Lines (a text in
each record's ``text_field``), either compressed or not (``sources``, ``packing``). Texts are read lazily, a
segment at a time, so a corpus of any size streams through in constant memory.

The texts are grouped into *segments* by their characters alone (``Corpus.segments``:
``SEGMENT_CHARS``, 4 Mi, by default; a longer text is cut between words into parts of
about that size, each a segment, whose ids join to the text's). A segment is what a process
owns and what a resumed scan skips, so it never depends on the tokenizer's output: the same
corpus gives the same segments in every run and every process. ``batching`` tokenizes them
into rows and batches.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import NamedTuple

from ..errors import InputError, check_choice
from .hf_datasets import StreamColumn, TextColumn, advice, column_of
from .progress import ReadProgress
from .sources import (
    builtin_corpus,
    corpus_files,
    file_texts,
    files_fingerprint,
    has_fields,
    kind,
    ordered_and_reread,
    probes,
    sizes,
)
from .tokenize import groups, spans
from .utf8 import ENCODING_ERRORS, kept, replace_surrogates, warn_item_replaced

SEGMENT_CHARS = 1 << 22  # characters per segment (~1M tokens of English), at least a text
TEXT_FIELD = "text"  # a JSON Lines record's text field unless another is named
ITEMS = "items"  # the progress unit of an in-memory corpus: one of its items


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
    """Where the texts come from (see the module docstring).

    ``encoding_errors``: what a file's bytes that are not UTF-8 do (``utf8``): ``"strict"``
    stops the reading at the first with an error naming it; ``"replace"`` reads each run of
    them as U+FFFD, warning once per file, as it does a list's lone surrogates (warning at the first).
    """

    # a collection read the same every time (checked). Its items are checked as they are read, each
    # bad one named (a dataset column's null rows skipped), not by the hint: beartype checks one
    # item drawn at random, so Iterable[str] failed a column with nulls now and then
    source: str | Path | Iterable
    segment_chars: int = SEGMENT_CHARS
    text_field: str = TEXT_FIELD  # a JSON Lines record's field (a Parquet file's column) holding its text
    encoding_errors: str = "strict"  # EncodingErrors, checked here (so a typo is told its choices)

    def __post_init__(self) -> None:
        """Refuse a segment size that is not a positive number of characters, an empty field.

        And a ``text_field`` other than ``"text"`` for a corpus with no JSON Lines
        (``_check_text_field``): it would be ignored.
        """
        if not isinstance(self.segment_chars, int) or isinstance(self.segment_chars, bool) \
                or self.segment_chars < 1:
            raise InputError(f"segment_chars must be a positive number of characters, got "
                             f"{self.segment_chars!r}")
        if not isinstance(self.text_field, str) or not self.text_field:
            raise InputError(f"text_field must name a JSON field, got {self.text_field!r}")
        check_choice("encoding_errors", self.encoding_errors, ENCODING_ERRORS)
        if isinstance(self.source, str) and not self.source.strip():  # Path("") would be "."
            raise InputError("the corpus is an empty name: give 'builtin', a file, a folder or a list "
                             "of texts")
        column = column_of(self.source, self.text_field)  # a dataset's column checked
        if column is None and not ordered_and_reread(self.source):
            instead = advice(self.source) or "pass a list of texts, a file or a folder"
            raise InputError(f"a corpus is read more than once, in one order (its first batch, "
                             f"a resumed scan), so it cannot be {_a(type(self.source).__name__)}: "
                             f"{instead}")
        if column is not None:
            if column.dataset is not self.source and self.text_field != TEXT_FIELD:  # dataset["text"]
                raise InputError(f"text_field={self.text_field!r} names a dataset's column, but the "
                                 "corpus is a column already: leave text_field out, or give the dataset")
        elif self.text_field != TEXT_FIELD:
            self._check_text_field()

    def _check_text_field(self) -> None:
        """``InputError`` for a ``text_field`` given where no text comes from a JSON field.

        A list of texts, the built-in corpus, or files of plain text only (``.txt``,
        ``.txt.gz``): the field would be ignored. Files are listed for it (``corpus_files``).
        """
        given = f"text_field={self.text_field!r} (--text-field) names the JSON Lines field " \
            "(or Parquet or Arrow column) that holds each record's text"
        if self._in_memory():
            what = "the built-in corpus" if isinstance(self.source, str) else "a list of texts"
            raise InputError(f"{given}, but the corpus is {what}, which has no fields: leave "
                             "text_field out")
        kinds = {kind(f) for f in self._files()}
        if kinds and not any(has_fields(k) for k in kinds):
            raise InputError(f"{given}, but the corpus {str(self.source)!r} holds plain text "
                             f"({', '.join(sorted(kinds))}: one text per line, no fields): leave "
                             "text_field out, or give JSON Lines (.jsonl), Parquet or Arrow files")

    def _files(self) -> list[Path]:
        return corpus_files(Path(self.source), self.text_field)

    def texts(self, reading: ReadProgress | None = None) -> Iterator[str]:
        """Every text, in order, read lazily: a text file's lines stripped, others as given.

        A list's blank strings, a file's blank lines and a JSON Lines file's blank texts are
        skipped: text ``i`` of a scan (``Batch.text_index``, a massive activation's ``text``)
        is the ``i``-th non-blank text given. ``reading`` counts what is read (``units``).
        """
        count = reading if reading is not None else ReadProgress({})  # counted, not read
        yield from self._listed_texts(count) if self._in_memory() else self._file_texts(count)

    def _listed_texts(self, reading: ReadProgress) -> Iterator[str]:
        items, replaced = 0, False
        for items, t in enumerate(self._listed(), start=1):
            if not isinstance(t, str):
                record = " (a record? pass its texts, or a datasets.Dataset with text_field=)" \
                    if isinstance(t, Mapping) else ""
                raise InputError(f"corpus item {items - 1} is {_a(type(t).__name__)}, not a text{record}")
            try:
                t.encode("utf-8")
            except UnicodeEncodeError as e:  # lone surrogates: bytes decoded with surrogateescape
                if self.encoding_errors == "strict":
                    raise InputError(f"corpus item {items - 1} is not valid Unicode at character "
                                     f"{e.start} (bytes that are not UTF-8?): give it as UTF-8, or "
                                     "read them as U+FFFD with encoding_errors='replace'") from None
                t = replace_surrogates(t)
                if not replaced:  # once a reading, as a file's first
                    replaced = kept(warn_item_replaced(items - 1, e.start), reading.replaced)
            if t.strip():
                reading.read(ITEMS, len(t), items)
                yield t
        reading.file_ended(ITEMS, items)  # blank items at the end too

    def _file_texts(self, reading: ReadProgress) -> Iterator[str]:
        base: dict[str, int] = {}  # bytes of the files read before, per kind
        for f in self._files():
            k = kind(f)
            for text, position in file_texts(f, self.text_field, self.encoding_errors, reading.replaced):
                reading.read(k, len(text), base.get(k, 0) + position)
                yield text
            base[k] = base.get(k, 0) + f.stat().st_size
            reading.file_ended(k, base[k])

    def _in_memory(self) -> bool:
        return not isinstance(self.source, (str, Path)) or self.source == "builtin"

    def _listed(self) -> Iterable:
        """An in-memory corpus's items: the built-in texts, the collection given, or a dataset's column.

        A ``datasets.Dataset``'s is its ``text_field`` column (``hf_datasets.TextColumn``), and
        so is one of its columns (``dataset["text"]``), read as its dataset's.
        """
        column = column_of(self.source, self.text_field)
        if column is not None:
            return column
        return builtin_corpus() if isinstance(self.source, str) else self.source

    def units(self) -> dict[str, int]:
        """The corpus's size in ``progress`` units, per kind: its files' bytes, or a list's items.

        Known before reading it, without a pass over the texts: files by their sizes, per
        ``sources.kind``; a list (a dataset's column) by its length, blank items included
        (``texts`` counts them too), as ``ITEMS``; a streamed dataset's not at all (``{}``).
        """
        if not self._in_memory():
            return sizes(self._files())
        listed = self._listed()
        return {ITEMS: len(listed)} if not isinstance(listed, StreamColumn) else {}  # a stream: unknown

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

        A list: its length and a hash of its texts; a dataset, its column's name, its rows and the
        hash of its texts, so the same texts in the same order resume however the dataset was
        made (``datasets``' own fingerprints follow its transforms, not its texts); a streamed
        dataset, its column, source and the hash of its first texts (``StreamColumn``). Files: their
        names within the corpus (not its path), sizes, and the first and last
        ``sources.FINGERPRINT_ENDS`` bytes of each, hashed, so the same files copied or
        downloaded elsewhere resume a scan (before, a new path or modification time refused
        it); with any JSON Lines file, the field its texts come from too. An edit inside a
        file that keeps its size and both ends is not seen.
        ``encoding_errors="replace"`` is part of it (the texts may differ); ``"strict"`` adds
        nothing, so states saved before it existed still resume.
        """
        replaced = "; bytes that are not UTF-8 read as U+FFFD" if self.encoding_errors == "replace" else ""
        if isinstance(self.source, str) and self.source == "builtin":  # hashed: a release may change it
            return f"builtin {_texts_hash(builtin_corpus())}"  # UTF-8: nothing to replace
        if not isinstance(self.source, (str, Path)):
            listed = self._listed()
            named = isinstance(listed, (TextColumn, StreamColumn))
            what = listed if named else f"list of {len(listed)} texts"
            hashed = listed.head() if isinstance(listed, StreamColumn) else listed
            return f"{what} {_texts_hash(hashed)}{replaced}"
        return files_fingerprint(Path(self.source), self._files(), self.text_field) + replaced


def _a(noun: str) -> str:
    """``noun`` with its article: ``a list``, ``an IterableDataset``."""
    return f"{'an' if noun[:1].lower() in 'aeiou' else 'a'} {noun}"


def _texts_hash(texts: Iterable) -> str:
    """``sha256:`` and 16 hex digits over the texts, hashed text by text (never joined whole)."""
    digest = hashlib.sha256()
    for text in texts:
        digest.update(str(text).encode("utf-8", "surrogatepass") + b"\0")  # bad items: refused later
    return f"sha256:{digest.hexdigest()[:16]}"
