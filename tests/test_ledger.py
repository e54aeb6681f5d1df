"""Segment token counts and shares (``streaming.ledger``): a budget needs no other segment tokenized.

References: the batches and the tokenizer calls of a single process reading the whole corpus
in order (``row_batches`` without a share, which tokenizes every segment up to the budget),
and each segment's token count from tokenizing its texts by hand.
"""

from __future__ import annotations

import threading

import pytest
from spies import counting_twin, segment_inputs

from residual_stream.errors import InputError
from residual_stream.streaming import Corpus, row_batches
from residual_stream.streaming.corpus import Segment
from residual_stream.streaming.ledger import Ledger, Share, agreed

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
        shares += list(row_batches(model, corpus, share=Share(rank, 2), ledger=Ledger(full.counts),
                                   **kw))
        mine = [t for s, seg in enumerate(segments[:last + 1]) if s % 2 == rank for t in segment_inputs(seg)]
        assert model.tokenizer.seen == mine  # its own segments up to the budget, no other
    assert sorted(shares, key=lambda b: b.key) == whole


def _barrier_exchanges(world: int) -> list:
    """``world`` stand-ins for ``dist_exchange`` (threads standing in for processes)."""
    slots: list = [None] * world
    barrier = threading.Barrier(world, timeout=60)

    def exchange_for(rank: int):
        def exchange(count):
            slots[rank] = count
            barrier.wait()
            out = list(slots)
            barrier.wait()  # every rank has read this round before the next is written
            return out
        return exchange
    return [exchange_for(r) for r in range(world)]


def _shared(world: int, corpus: Corpus, ledgers: list[Ledger], start: int = 0, **kw):
    """Every rank's batches and tokenizer inputs, the ranks on threads exchanging their counts."""
    models = [counting_twin() for _ in range(world)]
    for m in models:
        _probed(m)
    exchanges, out, errors = _barrier_exchanges(world), [None] * world, []

    def run(rank: int) -> None:
        try:
            out[rank] = list(row_batches(models[rank], corpus, ledger=ledgers[rank],
                                         share=Share(rank, world, start, exchanges[rank]), **kw))
        except BaseException as e:  # noqa: BLE001 - reported below
            errors.append(e)

    threads = [threading.Thread(target=run, args=(r,)) for r in range(world)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not errors, errors
    return out, [m.tokenizer.seen for m in models]


@pytest.mark.parametrize("world", [2, 3, 4])
@pytest.mark.parametrize("texts", [TEXTS, LONG], ids=["texts", "a-long-text-in-parts"])
def test_processes_tokenize_only_their_own_segments_and_exchange_the_counts(world, texts):
    """Rounds of ``world`` segments: each rank tokenizes its own, once, and learns the others'
    counts from the exchange; the ranks' batches together are the single reader's."""
    corpus = Corpus(texts, segment_chars=40)
    segments = list(corpus.segments(cut=lambda: True))
    kw = dict(batch_size=2, seq_len=8, max_tokens=200)
    reference = Ledger()
    whole = list(row_batches(counting_twin(), corpus, ledger=reference, **kw))
    ledgers = [Ledger() for _ in range(world)]
    batches, seen = _shared(world, corpus, ledgers, **kw)
    assert sorted((b for share in batches for b in share), key=lambda b: b.key) == whole
    counted = len(ledgers[0].counts)  # whole rounds up to the one where the budget ends
    assert counted == min(len(segments), (whole[-1].segment // world + 1) * world)
    assert all(ledger.counts == ledgers[0].counts for ledger in ledgers)
    assert ledgers[0].counts == _by_hand(counting_twin(), segments)[:counted]
    assert sum(ledgers[0].counts[:whole[-1].segment]) < 200 <= sum(ledgers[0].counts[:whole[-1].segment + 1])
    for rank in range(world):  # its own segments of those rounds, each once; no other
        assert seen[rank] == [t for s, seg in enumerate(segments[:counted])
                              if s % world == rank for t in segment_inputs(seg)]


def test_a_resumed_share_exchanges_only_the_rounds_not_counted():
    """Ranks resumed from segment 4 with the counts of the first two rounds: nothing before
    segment 4 is tokenized, no known round is exchanged, and the batches are the rest of the
    single reader's."""
    corpus = Corpus(LONG, segment_chars=40)
    segments = list(corpus.segments(cut=lambda: True))
    kw = dict(batch_size=2, seq_len=8, max_tokens=200)
    whole = list(row_batches(counting_twin(), corpus, **kw))
    counts = _by_hand(counting_twin(), segments)
    batches, seen = _shared(2, corpus, [Ledger(counts[:4]), Ledger(counts[:4])], start=4, **kw)
    assert sorted((b for share in batches for b in share), key=lambda b: b.key) == \
        [b for b in whole if b.segment >= 4]
    last = whole[-1].segment
    for rank in range(2):
        assert seen[rank] == [t for s, seg in enumerate(segments[:last // 2 * 2 + 2])
                              if s >= 4 and s % 2 == rank for t in segment_inputs(seg)]
    again = list(row_batches(counting_twin(), corpus, ledger=Ledger(counts), **kw,
                             share=Share(0, 2, 0, lambda count: pytest.fail("exchanged"))))
    assert again == [b for b in whole if b.segment % 2 == 0]  # every round known: no exchange


def test_processes_start_from_the_longest_saved_ledger():
    assert agreed([[5, 7], [5, 7, 9, 2], [5]]).counts == [5, 7, 9, 2]
    with pytest.raises(InputError, match="delete the state files"):
        agreed([[5, 7], [5, 8, 9]])


def _probed(model) -> None:
    """Make the tokenizer's cutting probe now, so that it is not among the texts counted."""
    from residual_stream.streaming.tokenize import Splitter

    assert Splitter.of(model.tokenizer) is not None
    model.tokenizer.seen = []


EXCHANGE_SCRIPT = """
import os, sys, threading, time
import torch.distributed as dist
from residual_stream.streaming.ledger import ExchangeLeft, dist_exchange
dist.init_process_group("gloo")
rank, group, stop = dist.get_rank(), dist.new_group(backend="gloo"), threading.Event()
exchange = dist_exchange(group, stop)
print(exchange(10 + rank), exchange(None if rank else 0))
if rank == 0:  # rank 1 will not come: the reader is told to stop after 0.5 s
    start = time.perf_counter()
    threading.Timer(0.5, stop.set).start()
    try:
        exchange(1)
        print("exchanged")
    except ExchangeLeft:
        print("left after", stop.is_set(), time.perf_counter() - start)
dist.barrier()
sys.stdout.flush()
os._exit(0)  # rank 0's abandoned exchange is never completed
"""


def test_the_gloo_exchange_hands_counts_over_and_leaves_when_told_to_stop():
    """Two processes over gloo: counts (and None) come back in rank order; a reader waiting
    for a process that will not come leaves when its ``stop`` is set."""
    import os
    import subprocess
    import sys

    env = dict(os.environ, MASTER_ADDR="127.0.0.1", MASTER_PORT="29541", WORLD_SIZE="2")
    procs = [subprocess.Popen([sys.executable, "-c", EXCHANGE_SCRIPT], env=dict(env, RANK=str(r)),
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for r in range(2)]
    outs = [p.communicate(timeout=120) for p in procs]
    assert [p.returncode for p in procs] == [0, 0], [err[-2000:] for _, err in outs]
    exchanged, left = outs[0][0].split("\n")[:2]
    assert exchanged == "[10, 11] [0, None]" and left.startswith("left after ")
    told, seconds = left.split()[-2:]
    assert told == "True" and float(seconds) < 10  # not before it was told to stop; not stuck
    assert outs[1][0].split("\n")[:1] == ["[10, 11] [0, None]"]


def test_a_failed_scan_stops_its_waiting_reader_before_closing_the_exchange(monkeypatch):
    """Rank 0 of 2 fails in its first batch while its reader waits in the second round's
    exchange: the reader is told to stop, leaves that wait, and only then is the exchange's
    group closed (``runner._share``'s last item), not a wait's timeout later or never."""
    import residual_stream as rs
    from residual_stream.streaming import runner
    from residual_stream.streaming.ledger import ExchangeLeft

    events, entered = [], threading.Event()

    def fake_share(rank, world_size, start, max_tokens, ledger):
        stop = threading.Event()

        def exchange(count):
            if not events:  # round 0: rank 1's count comes at once
                events.append("round 0")
                return [count, count]
            entered.set()  # round 1: rank 1 will not come
            events.append(("left", stop.wait(timeout=10)))
            raise ExchangeLeft("stopped")
        return Share(rank, world_size, start, exchange), ledger, stop, lambda: events.append("closed")

    def fail(key, tokens):
        assert entered.wait(timeout=30)
        raise RuntimeError("a batch failed")

    monkeypatch.setattr(runner, "_share", fake_share)
    monkeypatch.setattr(runner, "check_processes", lambda rank, world_size: None)  # no group here
    model = rs.twin(norm="rmsnorm", placement="pre", n_layers=1, d_model=16, n_heads=2, n_ctx=32)
    with pytest.raises(RuntimeError, match="a batch failed"):
        rs.scan(model, Corpus(TEXTS, segment_chars=40), "growth", batch_size=2, seq_len=8,
                max_tokens=10_000, rank=0, world_size=2, progress=False, on_batch=fail)
    assert events == ["round 0", ("left", True), "closed"]
