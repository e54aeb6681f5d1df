"""Batches of a corpus: its segments tokenized, cut into rows, grouped into batches.

Each segment's texts (``Corpus.segments``) get the ids ``rs.trace`` gives them, a group of
texts per call (the fast tokenizers' batch path: with packing, 2.3× the batches per second
of one call a text on short lines and 1.7× on documents, one core, SmolLM2's tokenizer) and
a long text in pieces (``tokenize``). They are cut into rows of at most ``seq_len`` tokens,
and each segment's rows into batches of ``batch_size``, its last batch possibly smaller.

With ``order="length"`` (the default) the rows of each window of ``SORT_BATCHES`` batches
are sorted longest first before they are cut into batches, so a batch pads its rows to about
their own length: on the built-in corpus of one-sentence texts at 32 rows a batch, 0.87 of
the padded positions are real tokens against 0.44 in corpus order. ``order="text"`` keeps
the corpus order. Either way batch ``(segment, index)`` is the same batch in every run and
every process, which makes resuming and sharding exact, and a process can skip a segment
without tokenizing it (``row_batches(share=...)``, ``ledger``): the reading of a corpus is
shared by the processes that scan it. Each row keeps its text's index in the corpus and its
first token's position in that text (in a part, counted from the part's first character,
``text_char``), so no statistic depends on the order (sampled tokens are chosen by those
two). ``row_batches`` gives each batch's rows unpacked (``RowBatch``); ``corpus_batches``
packs them.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass

from ..errors import EmptyTextError, InputError, as_index
from ..inputs import Batch, pack
from .corpus import Corpus, Segment
from .ledger import Ledger, Share
from .progress import ReadProgress
from .tokenize import can_cut, part_chunks, token_chunks

SORT_BATCHES = 32  # order="length": batches whose rows are sorted together
ORDERS = {  # a batch order: how the rows of a window are sorted (None: kept in corpus order)
    "length": lambda row: -len(row[0]),  # longest first; sorted() keeps ties in corpus order
    "text": None,
}


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
    def bounded(self) -> bool:
        """Whether there is a budget at all."""
        return self.left != float("inf")

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
                     batch_size: int, budget: _Budget, order: str, reading: ReadProgress | None,
                     rows: Iterable[tuple[list[int], int, int]] | None = None) -> Iterator[RowBatch]:
    """Segment ``number``'s batches (its ``rows`` when tokenized already)."""
    key = ORDERS[order]
    size = batch_size if key is None else batch_size * SORT_BATCHES
    char = 0 if segment.span is None else segment.span[0]
    rows = _rows(model, segment, seq_len, reading) if rows is None else rows
    index = 0
    for part in _windows(iter(rows), size, budget):
        part = part if key is None else sorted(part, key=key)
        for i in range(0, len(part), batch_size):
            yield _batch(part[i:i + batch_size], number, index, char)
            index += 1


def segment_tokens(model, segment: Segment) -> int:
    """How many tokens ``segment``'s texts (or part) hold: one tokenization, nothing kept."""
    return sum(len(ids) for _, ids, _ in segment_chunks(model, segment))


def check_sizes(model, batch_size: int, seq_len: int, max_tokens: int | float | None,
                order: str) -> tuple[int, int, int | None]:
    """``(batch_size, seq_len, max_tokens)`` as ints; ``InputError`` if no scan can run them.

    Each must be a whole number (``1e3`` is 1000; ``16.7`` and ``True`` are refused, by name),
    and ``order`` one of ``ORDERS``.
    """
    if order not in ORDERS:
        raise InputError(f"order must be one of {sorted(ORDERS)}, not {order!r}")
    batch_size, seq_len = whole("batch_size", batch_size), whole("seq_len", seq_len)
    max_tokens = None if max_tokens is None else whole("max_tokens", max_tokens)
    if batch_size < 1 or seq_len < 1:
        raise InputError(f"batch_size and seq_len must be positive, got {batch_size} and {seq_len}")
    if seq_len > model.anatomy.n_ctx:
        raise InputError(f"seq_len {seq_len} is longer than the model's context of "
                         f"{model.anatomy.n_ctx}; pass a smaller seq_len")
    if max_tokens is not None and max_tokens < 1:
        raise InputError(f"max_tokens must be positive, got {max_tokens}")
    return batch_size, seq_len, max_tokens


def whole(name: str, value) -> int:
    """``value`` as an int when it is a whole number (an int, or a float such as ``1e3``).

    Else ``InputError`` naming ``name``.
    """
    index = as_index(value)  # an int, numpy's or torch's (not a bool)
    if index is not None:
        return index
    if isinstance(value, float) and value.is_integer():
        return int(value)
    raise InputError(f"{name} must be a whole number, not {value!r}")


def row_batches(
    model, corpus: Corpus, *, batch_size: int, seq_len: int, max_tokens: int | None = None,
    share: Share | None = None, order: str = "length",
    reading: ReadProgress | None = None, ledger: Ledger | None = None,
) -> Iterator[RowBatch]:
    """The corpus's batches in order (``corpus_batches`` unpacked), at most ``max_tokens`` tokens.

    Each segment's rows (``Corpus.segments``) are grouped into batches of ``batch_size``, its
    last batch possibly smaller; ``order`` (``ORDERS``): ``"length"`` sorts the rows of each
    ``SORT_BATCHES`` batches longest first, ``"text"`` keeps the corpus order. The budget
    takes tokens in corpus order, so both orders read the same tokens.
    ``share`` (``ledger.Share``): only the batches of a process's segments. The others are
    skipped untokenized, unless ``max_tokens`` is given and ``ledger`` (``ledger.Ledger``)
    has not counted them: then their counts come from the other processes through
    ``share.exchange``, a round at a time, or without one they are tokenized here to count
    them; either way they are recorded in ``ledger``. ``reading``
    (``progress.ReadProgress``) counts what is read and tokenized.
    """
    batch_size, seq_len, max_tokens = check_sizes(model, batch_size, seq_len, max_tokens, order)
    share, ledger = share or Share(), Ledger() if ledger is None else ledger
    exchanging = max_tokens is not None and share.exchange is not None
    segments = corpus.segments(reading, lambda: can_cut(model.tokenizer))
    budget, number = _Budget(max_tokens), 0
    for group in _rounds(segments, share.world_size if exchanging else 1):
        rows = None
        if exchanging and ledger.known(number + len(group) - 1) is None:
            rows = _exchanged(model, group, number, share, ledger, seq_len, reading)
        for segment in group:
            yield from _segment(model, number, segment, share, ledger, budget, seq_len,
                                batch_size, order, reading, rows)
            number += 1
            if budget.spent:
                return
    if number == 0:
        raise EmptyTextError("the corpus has no texts: give a file or folder with one text per line")


def _segment(model, number: int, segment: Segment, share: Share, ledger: Ledger, budget: _Budget,
             seq_len: int, batch_size: int, order: str, reading: ReadProgress | None,
             rows: list | None) -> Iterator[RowBatch]:
    """Segment ``number``'s batches when ``share`` owns it; the budget moved past it either way."""
    mine = share.owns(number)
    known = None if mine else ledger.known(number)
    if budget.bounded and known is not None:
        budget.skip(known)  # counted before: passed over untokenized
    elif mine or budget.bounded:
        left = budget.left
        batches = _segment_batches(model, number, segment, seq_len, batch_size, budget, order,
                                   reading, rows if mine else None)
        if mine:
            yield from batches
        else:
            for _ in batches:  # another's: counted, not kept
                pass
        if budget.bounded:
            ledger.record(number, left - budget.left)


def _rounds(segments: Iterable[Segment], size: int) -> Iterator[list[Segment]]:
    """``segments`` in consecutive lists of ``size``, the last possibly shorter (never empty)."""
    segments = iter(segments)
    while group := [s for _, s in zip(range(size), segments, strict=False)]:
        yield group


def _exchanged(model, group: list[Segment], first: int, share: Share, ledger: Ledger,
               seq_len: int, reading: ReadProgress | None) -> list | None:
    """This process's rows of the round ``group`` (segments ``first`` on), if it owns one there.

    It tokenizes its segment of the round, hands its count to ``share.exchange`` and
    records every process's count in ``ledger``, before any of the round is batched.
    """
    number = first + share.rank
    rows, count = None, None
    if share.rank < len(group):
        if share.owns(number):
            rows = list(_rows(model, group[share.rank], seq_len, reading))
            count = sum(len(ids) for ids, _, _ in rows)
        else:  # done by a resumed scan, not counted: counted only
            count = ledger.known(number)
            count = segment_tokens(model, group[share.rank]) if count is None else count
    for offset, tokens in enumerate(share.exchange(count)[:len(group)]):
        ledger.record(first + offset, tokens)
    return rows


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
