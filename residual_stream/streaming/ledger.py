"""Each segment's token count, so that a token budget needs no segment tokenized twice.

With ``max_tokens`` a scan takes tokens in corpus order, so the budget left at segment ``s``
is ``max_tokens`` less the tokens of every segment before it. A process that skips a segment
(another's share, or one a resumed scan has done) used to tokenize it all the same, only to
count its tokens: under ``torchrun`` every process tokenized the whole budget's text, and a
resumed scan every segment it had done. A ``Ledger`` holds the counts once known:

* ``row_batches`` records each segment it tokenizes and skips a known one untokenized;
* a scan's saved state keeps the ledger, so a resumed scan tokenizes nothing it has done;
* ``count_shares``: before a scan of ``COUNT_FROM`` (3) or more processes with a budget, each
  process counts its own segments, a round of ``world_size`` segments at a time, and the
  counts are gathered (``all_gather_object``) until the budget is reached: each process
  tokenizes its own share twice (counted, then scanned) and no other's, ``2/N`` of the
  budget's text instead of all of it. Two processes gain nothing by it (``2/2``), and
  counting as they read lets their reading overlap the model, so they do that.

A count is a fact about the corpus and the tokenizer (the segment's ids, ``Corpus.segments``),
whoever counts it; the scan's state checks that both are the same (``state.scan_config``).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator

from tqdm.auto import tqdm

from .corpus import Corpus, Segment, segment_chunks
from .tokenize import can_cut

COUNT_FROM = 3  # processes from which a scan with a budget counts the shares first


class Ledger:
    """The token counts of segments ``0, 1, …, len(counts) - 1``, in corpus order."""

    def __init__(self, counts: Iterable[int] = ()) -> None:
        """Counts known already (a saved state's)."""
        self.counts = [int(c) for c in counts]

    def known(self, segment: int) -> int | None:
        """Segment ``segment``'s tokens, or None when not counted yet."""
        return self.counts[segment] if segment < len(self.counts) else None

    def record(self, segment: int, tokens: int) -> None:
        """Segment ``segment`` holds ``tokens``; kept when it is the next one to count."""
        if segment == len(self.counts):
            self.counts.append(int(tokens))

    def total(self) -> int:
        """Tokens of the segments counted."""
        return sum(self.counts)


def segment_tokens(model, segment: Segment) -> int:
    """How many tokens ``segment``'s texts (or part) hold: one tokenization, nothing kept."""
    return sum(len(ids) for _, ids, _ in segment_chunks(model, segment))


def _rounds(segments: Iterator[Segment], size: int) -> Iterator[list[Segment]]:
    """``segments`` in consecutive lists of ``size``, the last possibly shorter (never empty)."""
    while batch := [s for _, s in zip(range(size), segments, strict=False)]:
        yield batch


def count_shares(model, corpus: Corpus, max_tokens: int | None, rank: int, world_size: int,
                 ledger: Ledger, gather: Callable[[int | None], list], show: bool = False) -> None:
    """Count segments into ``ledger`` until they hold ``max_tokens``, each process its own.

    Every process calls this with the same arguments but ``rank``; in each round of
    ``world_size`` segments process ``r`` counts segment ``r`` of the round and ``gather``
    (``torch.distributed.all_gather_object`` or a stand-in) hands every process every count.
    Rounds the ledger already holds are skipped by all without a gather. Nothing to do for
    fewer than ``COUNT_FROM`` processes (they count as they read) or without a budget.
    ``show``: a progress bar of the tokens counted.
    """
    if world_size < COUNT_FROM or max_tokens is None:
        return
    segments = corpus.segments(cut=lambda: can_cut(model.tokenizer))
    with tqdm(total=max_tokens, initial=min(ledger.total(), max_tokens), unit="tok",
              unit_scale=True, disable=not show, desc=f"count [{rank}/{world_size}]") as bar:
        for number, group in enumerate(_rounds(iter(segments), world_size)):
            if ledger.total() >= max_tokens:
                return
            first = number * world_size
            if ledger.known(first + len(group) - 1) is not None:
                continue
            mine = segment_tokens(model, group[rank]) if rank < len(group) else None
            for offset, tokens in enumerate(gather(mine)[:len(group)]):
                ledger.record(first + offset, tokens)
            bar.update(min(ledger.total(), max_tokens) - bar.n)
