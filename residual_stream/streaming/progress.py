"""How far a scan has read its corpus, and how many tokens the whole corpus should hold.

Without ``max_tokens`` a scan does not know its corpus's token count until it has read it
all. ``ReadProgress`` estimates it as it goes, from two ratios each measured where it is
exact: tokens per character where texts are tokenized (``batching._rows``), and characters
per *unit* where texts are read (``Corpus.texts``). A unit is a byte of the corpus's files
(compressed bytes for a compressed file), or an item of a list of texts (before session 15 a character,
which took a pass over the list to count), and ``totals`` is their count for the whole
corpus, per kind of file (``sources.kind``: plain or JSON Lines, plain or compressed), known
before reading (``Corpus.units``). So::

    tokens ≈ tokens per character × Σ_kind characters per unit(kind) × units(kind)

which becomes exact once every text has been read and tokenized. A kind not read yet counts at
the characters per unit measured at the start of its first file (``Corpus.probes``; a Parquet
or Arrow file's first batch of rows): a gzipped file holds 3 to 4 times a plain one's
characters per byte, so a folder mixing them was estimated at half its tokens until the reading
reached the other kind, before session 15. With a budget the total is the smaller of the budget
and the estimate. A process of ``N`` scans the segments ``s ≡ rank (mod N)``, so its part is
estimated from the corpus's characters cut into segments (``share_of``): a corpus of one
segment is all rank 0's and none of the others'. The scan's progress bar (``ScanBar``) shows it
as its total, so the bar gives a percentage and a time left, and at the end its total
becomes the tokens scanned.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from tqdm.auto import tqdm

TRUSTED_UNITS = 1 << 23  # units of a kind read before its reading's ratio counts, a block or not


@dataclass
class ReadProgress:
    """Counters the reader thread advances; ``estimate`` reads them from the scan's thread."""

    totals: dict[str, int]  # units in the whole corpus, per kind
    probes: dict[str, float] = field(default_factory=dict)  # characters per unit, from a start
    units: dict[str, int] = field(default_factory=dict)  # units read so far, per kind
    chars_read: dict[str, int] = field(default_factory=dict)
    ended: dict[str, tuple[int, int]] = field(default_factory=dict)  # (chars, units) at a file's end
    chars_tokenized: int = 0
    tokens: int = 0
    replaced: list[str] = field(default_factory=list)  # warnings of bytes read as U+FFFD (``utf8``)

    def read(self, kind: str, chars: int, units: int) -> None:
        """A text of ``chars`` characters was read; ``units`` of its kind have been read in all."""
        self.chars_read[kind] = self.chars_read.get(kind, 0) + chars
        self.units[kind] = units

    def file_ended(self, kind: str, units: int) -> None:
        """A file of ``kind`` was read to its end: ``units`` of the kind in all, exactly."""
        self.units[kind] = units
        self.ended[kind] = (self.chars_read.get(kind, 0), units)

    def tokenized(self, chars: int, tokens: int) -> None:
        """``chars`` characters of text were tokenized into ``tokens`` tokens."""
        self.chars_tokenized += chars
        self.tokens += tokens

    def chars_per_unit(self, kind: str) -> float | None:
        """``kind``'s characters per unit; None while nothing tells.

        A file's position is known a read block at a time (8 KiB; 128 KiB of a gzip file's
        compressed bytes) ahead of the texts read from it, so what is read measures the
        ratio low by up to a block: it counts once ``TRUSTED_UNITS`` are read. Until then: the
        files of the kind read to their end (exact), else its probe, else what is read.
        """
        units, chars = self.units.get(kind, 0), self.chars_read.get(kind, 0)
        measured = chars / units if units and chars else None
        if units >= TRUSTED_UNITS:
            return measured
        if self.ended.get(kind, (0, 0))[0]:
            done_chars, done_units = self.ended[kind]
            return done_chars / done_units
        return self.probes.get(kind, measured)

    def estimate(self, world_size: int = 1, rank: int = 0, max_tokens: int | None = None,
                 segment_chars: int | None = None) -> int | None:
        """The tokens process ``rank`` of ``world_size`` should scan in all; None before any are known.

        At most ``max_tokens`` of the corpus's, taken in corpus order; a process's part of them
        from their characters cut into segments of ``segment_chars`` (``share_of``; without it,
        ``1/world_size``). A kind with neither a reading nor a probe counts at the mean of the
        others' ratios.
        """
        ratios = {kind: self.chars_per_unit(kind) for kind in self.totals}
        known = [r for r in ratios.values() if r]
        if not (self.tokens and self.chars_tokenized and known):
            return None
        fallback = sum(known) / len(known)
        chars = sum((ratios[kind] or fallback) * total for kind, total in self.totals.items())
        per_char = self.tokens / self.chars_tokenized
        if max_tokens is not None:
            chars = min(chars, max_tokens / per_char)
        if world_size > 1:
            chars = (share_of(chars, segment_chars, rank, world_size) if segment_chars
                     else chars / world_size)
        tokens = round(per_char * chars)
        return tokens if max_tokens is None else min(tokens, max_tokens)


def share_of(chars: int | float, segment_chars: int, rank: int,
             world_size: int) -> int | float:
    """The characters of ``chars`` in segments of ``segment_chars`` that process ``rank`` owns.

    Segment ``s`` goes to process ``s mod world_size``: whole rounds of ``world_size``
    segments give each process one, and the last round's characters fill its first segments.
    """
    rounds, rest = divmod(chars, segment_chars * world_size)
    return rounds * segment_chars + min(segment_chars, max(0.0, rest - rank * segment_chars))


def count(n: int | float | None) -> str:
    """A token count as the bar shows it: ``?`` unknown, an integer below 1000, else ``1.23k``."""
    if n is None:
        return "?"
    return str(int(n)) if n < 1000 else tqdm.format_sizeof(n, divisor=1000)


_WITH_TOTAL = "{l_bar}{bar}| {n_fmt}/{total_fmt} [{elapsed}<{remaining}, {rate_fmt}{postfix}]"
_NO_TOTAL = "{desc}: {n_fmt}{unit} [{elapsed}, {rate_fmt}{postfix}]"


class _TokenBar(tqdm):
    """``tqdm`` that writes token counts as ``count`` does (its ``unit_scale`` makes ``6.00``).

    The rate keeps ``unit_scale``'s ``59.7tok/s``, ``1.23Mtok/s``.
    """

    @property
    def format_dict(self) -> dict:
        """tqdm's, the counts written by ``count`` and a format with or without a total."""
        d = super().format_dict
        total = d["total"] if d["total"] and d["n"] < d["total"] + 0.5 else None  # as tqdm reads it
        d.update(n_fmt=count(d["n"]), total_fmt=count(total),
                 bar_format=_WITH_TOTAL if total else _NO_TOTAL)
        return d


class ScanBar:
    """The scan's progress bar: tokens and tokens/s, with a total that gives the time left.

    Under ``torchrun`` only process 0 shows one (``[rank 0 of N]``): the processes share a
    terminal, and their bars, each redrawn in place, overwrote each other on one line. The
    segments are dealt in turn, so its share tells the scan's progress and time left. The
    total is this process's estimated part of the corpus's tokens (``reading``:
    ``progress.ReadProgress``, fed by the reader; ``ReadProgress.estimate``), at most
    ``max_tokens``: until an estimate is known, ``max_tokens`` for one process and none for
    several (a process's part of a budget depends on the segments before its own). When the
    scan ends the total becomes the tokens scanned: the bar ends at 100 %, the corpus read
    or the budget spent.
    """

    def __init__(self, name: str, reading: Callable[[], ReadProgress], max_tokens: int | None,
                 tokens: int, show: bool, rank: int, world_size: int,
                 segment_chars: int | None = None) -> None:
        """A bar for process ``rank`` of ``world_size``, from ``tokens`` already scanned.

        ``reading``: makes the counters for the corpus (``Corpus.progress``), called only
        when the bar is shown; ``segment_chars``: the corpus's segment size, which decides
        how its tokens are shared among processes.
        """
        show = show and rank == 0  # the others' bars would overwrite it on the one terminal line
        self.reading = reading() if show else None
        self.max_tokens, self.rank, self.world_size = max_tokens, rank, world_size
        self.segment_chars = segment_chars
        self.bar = _TokenBar(total=max_tokens if world_size == 1 else None, initial=tokens,
                             unit="tok", unit_scale=True, disable=not show,
                             desc=f"scan {name}" + (f" [rank 0 of {world_size}]" if world_size > 1 else ""))

    def update(self, n: int, tokens: int) -> None:
        """``n`` more tokens scanned, ``tokens`` in all; the estimated total follows the reading."""
        estimate = None if self.reading is None else self.reading.estimate(
            self.world_size, self.rank, self.max_tokens, self.segment_chars)
        if estimate is not None:
            self.bar.total = max(estimate, tokens)
        self.bar.update(n)

    def close(self) -> None:
        """Close the bar at the end of the scan: its total is the tokens scanned, 100 %."""
        self.bar.total = self.bar.n
        self.bar.close()
