"""Segment token counts (``streaming.ledger``): a budget needs no other segment tokenized.

References: the batches and the tokenizer calls of a single process reading the whole corpus
in order (``row_batches`` without a ledger, which tokenizes every segment up to the budget),
and each segment's token count from tokenizing its texts by hand.
"""

from __future__ import annotations

import threading

import pytest
from spies import counting_twin, segment_inputs

from residual_stream.streaming import Corpus, row_batches
from residual_stream.streaming.corpus import Segment
from residual_stream.streaming.ledger import Ledger, count_shares

TEXTS = [f"text number {i} " * (1 + i % 3) for i in range(12)]
LONG = [*TEXTS[:3], " ".join(TEXTS * 2), *TEXTS[3:5]]  # one text cut into parts


def _by_hand(model, segments: list[Segment]) -> list[int]:
    """Each segment's tokens: its texts tokenized one by one (a part: as the text's slice)."""
    counts = []
    for s in segments:
        if s.span is None:
            counts.append(sum(len(model.tokenizer.tokenizer(t)["input_ids"]) for t in s.texts))
        else:  # bytes: a part's characters, with the BOS in the first part
            counts.append(len(s.texts[0][slice(*s.span)].encode()) + (s.span[0] == 0))
    return counts


@pytest.mark.parametrize("texts", [TEXTS, LONG], ids=["texts", "a-long-text-in-parts"])
def test_a_ledger_lets_each_share_skip_the_others_untokenized(texts):
    model = counting_twin()
    corpus = Corpus(texts, segment_chars=40)
    kw = dict(batch_size=2, seq_len=8, max_tokens=150)
    full = Ledger()
    whole = list(row_batches(model, corpus, ledger=full, **kw))
    segments = list(corpus.segments(cut=lambda: True))
    last = whole[-1].segment  # where the budget ends
    assert full.counts[:last] == _by_hand(model, segments)[:last] and len(full.counts) == last + 1
    shares = []
    for rank in range(2):
        model.tokenizer.seen = []
        shares += list(row_batches(model, corpus, own=lambda s, r=rank: s % 2 == r,
                                   ledger=Ledger(full.counts), **kw))
        mine = [t for s, seg in enumerate(segments[:last + 1]) if s % 2 == rank for t in segment_inputs(seg)]
        assert model.tokenizer.seen == mine  # its own segments up to the budget, no other
    assert sorted(shares, key=lambda b: b.key) == whole


@pytest.mark.parametrize("world", [3, 4])
def test_processes_count_their_own_segments_and_share_the_counts(world):
    """``count_shares`` on ``world`` threads standing in for processes, gathering through a
    barrier: every ledger equals the single reader's, and each counts only its own share."""
    corpus = Corpus(LONG, segment_chars=40)
    segments = list(corpus.segments(cut=lambda: True))
    models = [counting_twin() for _ in range(world)]
    reference = Ledger()
    for _ in row_batches(models[0], corpus, batch_size=2, seq_len=8, max_tokens=200,
                         ledger=reference):
        pass
    slots: list = [None] * world
    barrier = threading.Barrier(world)

    def gather_for(rank: int):
        def gather(value):
            slots[rank] = value
            barrier.wait()
            out = list(slots)
            barrier.wait()  # every rank has read this round before the next is written
            return out
        return gather

    for m in models:
        _probed(m)
    ledgers = [Ledger() for _ in range(world)]
    threads = [threading.Thread(target=count_shares, args=(models[r], corpus, 200, r, world,
                                                           ledgers[r], gather_for(r)))
               for r in range(world)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    counted = len(ledgers[0].counts)
    assert all(ledger.counts == ledgers[0].counts for ledger in ledgers)
    last_round = (counted - 1) // world * world  # rounds of ``world`` until the budget is in
    assert sum(ledgers[0].counts[:last_round]) < 200 <= ledgers[0].total()
    assert ledgers[0].counts == _by_hand(models[0], segments)[:counted]
    assert reference.counts[:-1] == ledgers[0].counts[:len(reference.counts) - 1]
    for rank, m in enumerate(models):
        assert m.tokenizer.seen == [t for s, seg in enumerate(segments[:counted])
                                    if s % world == rank for t in segment_inputs(seg)]
    again = Ledger(ledgers[0].counts)  # a resumed scan's: nothing left to count, no gather
    count_shares(models[0], corpus, 200, 0, world, again, lambda value: pytest.fail("gathered"))
    assert again.counts == ledgers[0].counts
    count_shares(models[0], corpus, 200, 0, 2, Ledger(), lambda value: pytest.fail("gathered"))


def _probed(model) -> None:
    """Make the tokenizer's cutting probe now, so that it is not among the texts counted."""
    from residual_stream.streaming.tokenize import Splitter

    assert Splitter.of(model.tokenizer) is not None
    model.tokenizer.seen = []
