"""How far a scan has read its corpus, and how many tokens the whole corpus should hold.

Without ``max_tokens`` a scan does not know its corpus's token count until it has read it
all. ``ReadProgress`` estimates it as it goes, from two ratios each measured where it is
exact: tokens per character where texts are tokenized (``corpus._rows``), and characters
per *unit* where texts are read (``Corpus.texts``). A unit is a byte of the corpus's files
(compressed bytes for ``.gz``), or an item of a list of texts (before session 15 a character,
which took a pass over the list to count), and ``total`` is their count for the whole corpus,
known before reading (``Corpus.units``). So::

    tokens ≈ tokens per character × characters per unit × total

which becomes exact once every text has been read and tokenized. A process of ``N`` holds
about ``1/N`` of it (its share of the segments). The scan's progress bar shows it as its
total, so the bar gives a percentage and a time left.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from tqdm.auto import tqdm


@dataclass
class ReadProgress:
    """Counters the reader thread advances; ``estimate`` reads them from the scan's thread."""

    total: int  # units in the whole corpus
    units: int = 0  # units read so far
    chars_read: int = 0
    chars_tokenized: int = 0
    tokens: int = 0

    def read(self, chars: int, units: int) -> None:
        """A text of ``chars`` characters was read; ``units`` have been read in all."""
        self.chars_read += chars
        self.units = units

    def tokenized(self, chars: int, tokens: int) -> None:
        """``chars`` characters of text were tokenized into ``tokens`` tokens."""
        self.chars_tokenized += chars
        self.tokens += tokens

    def estimate(self, world_size: int = 1) -> int | None:
        """The tokens a process of ``world_size`` should scan in all; None before any are known."""
        if not (self.tokens and self.chars_tokenized and self.chars_read and self.units):
            return None
        whole = self.tokens / self.chars_tokenized * (self.chars_read / self.units) * self.total
        return round(whole / world_size)


class ScanBar:
    """The scan's progress bar: tokens and tokens/s, with a total that gives the time left.

    The total is this process's part of ``max_tokens``, or else of the corpus's tokens as
    estimated while it is read (``reading``: ``progress.ReadProgress``, fed by the reader).
    """

    def __init__(self, name: str, units: Callable[[], int], max_tokens: int | None, tokens: int,
                 show: bool, rank: int, world_size: int) -> None:
        """A bar for process ``rank`` of ``world_size``, from ``tokens`` already scanned.

        ``units``: the corpus's size in units (``Corpus.units``), asked for only when the
        bar is shown without ``max_tokens``.
        """
        share = None if max_tokens is None else -(-max_tokens // world_size)
        self.reading = ReadProgress(units()) if show and share is None else None
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
