"""Each segment's token count, and a process's share of the segments.

With ``max_tokens`` a scan takes tokens in corpus order, so the budget left at segment ``s``
is ``max_tokens`` less the tokens of every segment before it. A process that skips a segment
(another's, or one a resumed scan has done) must know its count all the same. A ``Ledger``
holds the counts once known, and ``row_batches`` (``batching``) takes them from it:

* one process records each segment as it tokenizes it;
* a scan's saved state keeps the ledger, so a resumed scan tokenizes nothing it has done;
* several processes (``Share`` with an ``exchange``) tokenize their own segments only. Round
  ``k`` is segments ``kN … kN + N - 1``, one for each of the ``N`` processes: each tokenizes
  its own, keeps its rows, and the round's counts are exchanged (``exchange``, one integer a
  process over a gloo group of the reader thread's own) before any of the round is batched.
  So each process tokenizes its own share once, while the model runs, and no other's.

A count is a fact about the corpus and the tokenizer (the segment's ids, ``Corpus.segments``),
whoever counts it; the scan's state checks that both are the same (``state.scan_config``).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from ..errors import InputError, as_index

Exchange = Callable[[int | None], list]  # a process's count in, every process's out (rank order)
POLL_S = 0.001  # how often a process waiting for the others' counts checks it is still wanted


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


@dataclass(frozen=True)
class Share:
    """Process ``rank`` of ``world_size``'s segments: ``s ≡ rank (mod world_size)``, from ``start`` on.

    ``start``: the first segment not done (a resumed scan's). ``exchange``: how the
    processes hand each other their counts (``dist_exchange``, or a stand-in); without one,
    a scan with a budget tokenizes every segment it does not own to count it.
    """

    rank: int = 0
    world_size: int = 1
    start: int = 0
    exchange: Exchange | None = None

    def owns(self, segment: int) -> bool:
        """Whether ``segment`` is this process's to batch."""
        return segment % self.world_size == self.rank and segment >= self.start


def check_processes(rank: int, world_size: int) -> None:
    """``InputError`` unless process ``rank`` of ``world_size`` can share a scan.

    Whole numbers with ``0 ≤ rank < world_size``; with more than one process, the running
    ``torch.distributed`` group's own rank and size (two processes that both claimed rank 0
    scanned the even segments twice and the odd ones never).
    """
    r, w = as_index(rank), as_index(world_size)
    if r is None or w is None or w < 1 or not 0 <= r < w:
        raise InputError(f"rank {rank!r} of world_size {world_size!r}: world_size must be a whole "
                         "number ≥ 1 and rank one of 0 … world_size - 1")
    if world_size == 1:
        return
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()):
        raise InputError(f"world_size {world_size} needs a torch.distributed process group: run "
                         "the scan under torchrun (python -m residual_stream.scan) or call "
                         "torch.distributed.init_process_group first")
    if (dist.get_rank(), dist.get_world_size()) != (rank, world_size):
        raise InputError(f"rank {rank} of {world_size} is not this process's place in its group "
                         f"(rank {dist.get_rank()} of {dist.get_world_size()}): pass "
                         "torch.distributed.get_rank() and get_world_size()")


def dist_exchange(group, stop: threading.Event) -> Exchange:
    """An ``Exchange`` over the ``torch.distributed`` process group ``group`` (gloo, CPU tensors).

    Each call all-gathers one int64 a process (-1 for none) and waits for it polling, so that
    a reader told to ``stop`` (its scan has ended early) leaves the wait instead of blocking
    on processes that will not come: it raises ``ExchangeLeft``.
    """
    import torch
    import torch.distributed as dist

    size = dist.get_world_size(group)

    def exchange(count: int | None) -> list:
        mine = torch.tensor([-1 if count is None else int(count)], dtype=torch.int64)
        out = [torch.empty_like(mine) for _ in range(size)]
        work = dist.all_gather(out, mine, group=group, async_op=True)
        while not work.is_completed():
            if stop.is_set():
                raise ExchangeLeft("the scan ended before the other processes' counts came")
            time.sleep(POLL_S)
        work.wait()
        return [None if int(t) < 0 else int(t) for t in out]

    return exchange


class ExchangeLeft(RuntimeError):
    """A reader left a counts exchange because its scan had ended."""


def agreed(counts: list[list[int]]) -> Ledger:
    """The ledger every process starts from: the longest of their saved ones.

    Each process saves its state at its own times, so their ledgers are prefixes of one
    another (every count is the same fact); the rounds of counts exchanged must start at the
    same segment everywhere.
    """
    longest = max(counts, key=len)
    for c in counts:
        if c != longest[:len(c)]:
            raise InputError("the processes' saved token counts disagree, so their states were "
                             "not saved by one scan: delete the state files and scan again")
    return Ledger(longest)
