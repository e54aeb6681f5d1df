"""How far a scan has read its corpus, and how many tokens the whole corpus should hold.

Without ``max_tokens`` a scan does not know its corpus's token count until it has read it
all. ``ReadProgress`` estimates it as it goes, from two ratios each measured where it is
exact: tokens per character where texts are tokenized (``batching._rows``), and characters
per *unit* where texts are read (``Corpus.texts``). A unit is a byte of the corpus's files
(compressed bytes for ``.gz``), or an item of a list of texts (before session 15 a character,
which took a pass over the list to count), and ``totals`` is their count for the whole
corpus, per kind of file (``sources.kind``: plain or JSON Lines, gzipped or not), known
before reading (``Corpus.units``). So::

    tokens ≈ tokens per character × Σ_kind characters per unit(kind) × units(kind)

which becomes exact once every text has been read and tokenized. A kind not read yet counts
at the characters per unit measured at the start of its first file (``Corpus.probes``): a
gzipped file holds 3 to 4 times a plain one's characters per byte, so a folder mixing them
was estimated at half its tokens until the reading reached the other kind, before session
15. A process of ``N`` holds about ``1/N`` of it (its share of the segments). The scan's
progress bar shows it as its total, so the bar gives a percentage and a time left.
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

    def estimate(self, world_size: int = 1) -> int | None:
        """The tokens a process of ``world_size`` should scan in all; None before any are known.

        A kind with neither a reading nor a probe counts at the mean of the others' ratios.
        """
        ratios = {kind: self.chars_per_unit(kind) for kind in self.totals}
        known = [r for r in ratios.values() if r]
        if not (self.tokens and self.chars_tokenized and known):
            return None
        fallback = sum(known) / len(known)
        chars = sum((ratios[kind] or fallback) * total for kind, total in self.totals.items())
        return round(self.tokens / self.chars_tokenized * chars / world_size)


class ScanBar:
    """The scan's progress bar: tokens and tokens/s, with a total that gives the time left.

    The total is this process's part of ``max_tokens``, or else of the corpus's tokens as
    estimated while it is read (``reading``: ``progress.ReadProgress``, fed by the reader).
    """

    def __init__(self, name: str, reading: Callable[[], ReadProgress], max_tokens: int | None,
                 tokens: int, show: bool, rank: int, world_size: int) -> None:
        """A bar for process ``rank`` of ``world_size``, from ``tokens`` already scanned.

        ``reading``: makes the counters for the corpus (``Corpus.progress``), called only
        when the bar is shown without ``max_tokens``.
        """
        share = None if max_tokens is None else -(-max_tokens // world_size)
        self.reading = reading() if show and share is None else None
        self.world_size = world_size
        self.bar = tqdm(total=share, initial=tokens, unit="tok", unit_scale=True, disable=not show,
                        desc=f"scan {name}" + (f" [{rank}/{world_size}]" if world_size > 1 else ""))

    def update(self, n: int, tokens: int) -> None:
        """``n`` more tokens scanned, ``tokens`` in all; the estimated total follows the reading."""
        estimate = None if self.reading is None else self.reading.estimate(self.world_size)
        if estimate is not None:
            self.bar.total = max(estimate, tokens)
        self.bar.update(n)

    def close(self) -> None:
        """Close the bar; with an estimated total, at the tokens scanned: this part is done."""
        if self.reading is not None:
            self.bar.total = self.bar.n
        self.bar.close()
