"""``rs.scan``: stream a corpus through a model, batch by batch, into accumulators.

Per batch: tokenize (``corpus``, in a reader thread: ``reader``), run one forward pass, let
every accumulator add its sums (``adding``; on a GPU a replayed growth batch adds them while
the next batch replays, and the scan flushes before it saves, ends a segment or calls back).
When every statistic asked for has a reducer (all of them at their default settings), the
batch takes the lean pass (``lean``): reduced inside the forward pass, one block's tensors at
a time (plus what a reducer keeps: the contribution buffer of ``flow`` and ``subspaces``, the
points of ``lens``). Otherwise (an accumulator without one, such as per-head flow) one trace
of the batch is captured (``trace_batch``; float32 copies, whatever the model's
dtype), the reducers are fed from it and it is dropped. Memory is one batch's worth plus the
accumulators, whatever the corpus length.

A batch is named ``(segment, index)``: the corpus is cut into segments of texts by their
characters alone (``Corpus.segments``, 4 Mi characters by default; a longer text cut into
parts of about that size between words, each a segment), and batches never span two. So
batch ``(s, i)`` is the same batch in every run and in every process, and a segment can be
skipped without tokenizing it.

**Resuming.** With ``state=PATH`` the accumulators and the name of the next batch are saved
atomically (temporary file, flushed to disk, then renamed) after the first batch that ends
``save_seconds`` (60) after the last save, or after every ``save_every`` batches when that is
given, and when the scan ends. A save costs 1–51 ms per statistic (its sums copied to the
host and written; 85 ms for all six: ``benchmarks/state_save.py``) and a GPU batch of
SmolLM2 at 32×512 about 31 ms, so saving after every batch, as before, would cost a GPU scan
up to three times its forward. A rerun with the same arguments skips the segments and
batches already in the saved sums (without tokenizing them; the state keeps the segments'
token counts a budget needs, ``ledger``) and continues: an interruption loses no batch and
counts none twice (a batch whose update was not saved yet is simply done again). Ctrl-C or
SIGTERM during such a scan finishes the batch under way and saves the state before it stops
(``signals``). A state saved for other arguments is refused with a message, never mixed in
(``state``).

**Several processes.** Process ``rank`` of ``world_size`` takes the segments ``s`` with
``s % world_size == rank`` and tokenizes no other (with ``max_tokens``, the token counts of
the segments before its own come from ``ledger``: counted by their own processes and
exchanged by the reader threads, a round of ``world_size`` segments at a time); at the end
every process gathers every accumulator state and merges them in rank order (``torch.distributed``, gloo
on the CPU, nccl on the GPU).
"""

from __future__ import annotations

import os
import threading
import time
import weakref
from collections.abc import Callable, Iterable, Sequence
from contextlib import closing
from pathlib import Path

from ..errors import EmptyTextError, InputError, need_model
from .accumulators import Accumulator
from .adding import batch_adder
from .base import merged
from .batching import check_sizes, row_batches
from .calibration import calibrate
from .corpus import Corpus
from .lean import points
from .ledger import Ledger, Share, agreed, check_processes, dist_exchange
from .progress import ReadProgress, ScanBar
from .reader import prefetched
from .scan_result import ScanResult, frames, replaced_in
from .signals import Deferred
from .specs import make_accumulators
from .state import resume, save_state, scan_config, scan_settings

__all__ = ["ScanResult", "frames", "scan"]


def _save_due(save_every: int | None, save_seconds: float) -> Callable[[int], bool]:
    """``due(run)``: whether the state is to be saved after this run's ``run``-th batch.

    Every ``save_every`` batches when given, else once ``save_seconds`` have passed since the
    last save (or the start); the clock restarts after each due save, so a slow save does not
    eat the interval.
    """
    if save_every is not None and (isinstance(save_every, bool) or not isinstance(save_every, int)
                                   or save_every < 1):
        raise InputError(f"save_every must be a whole number of batches ≥ 1 (or None to save by "
                         f"time), not {save_every!r}")
    if not (isinstance(save_seconds, (int, float)) and 0 <= save_seconds < float("inf")):
        raise InputError(f"save_seconds must be a finite number of seconds ≥ 0, not {save_seconds!r}")
    if save_every is not None:
        return lambda run: run % save_every == 0
    last = _clock()

    def due(run: int) -> bool:
        nonlocal last
        now = _clock()
        if now - last < save_seconds:
            return False
        last = now
        return True
    return due


_clock = time.monotonic  # a test steps it by hand


def _all_gather(value) -> list:
    """Every process's ``value``, in rank order (``torch.distributed``'s default group)."""
    import torch.distributed as dist

    out: list = [None] * dist.get_world_size()
    dist.all_gather_object(out, value)
    return out


def _gather(accs: dict[str, Accumulator], tokens: int, batches: int, resumed: int,
            replaced: Sequence[str] = ()) -> tuple[dict, int, int, int, tuple[str, ...]]:
    """Merge every process's accumulators, in rank order, on every process; sum the counts.

    And join the processes' warnings of bytes read as U+FFFD (``replaced``), each once.
    """
    states = _all_gather({"tokens": tokens, "batches": batches, "resumed": resumed,
                          "stats": {n: a.state_dict() for n, a in accs.items()}, "replaced": list(replaced)})
    return (merged(accs, [s["stats"] for s in states]),
            *(sum(s[k] for s in states) for k in ("tokens", "batches", "resumed")),
            replaced_in(s["replaced"] for s in states))


def _share(rank: int, world_size: int, start: int, max_tokens: int | None,
           ledger: Ledger) -> tuple[Share, Ledger, threading.Event, Callable[[], None]]:
    """This process's share of the segments from ``start`` on, its ledger, the reader's stop.

    With a budget over several processes, the segments' counts are exchanged a round at a
    time by the reader threads (``ledger.dist_exchange``) over a gloo group of their own,
    made here by every process at once, starting from the ledger the processes agree on
    (``ledger.agreed``). The last item closes that group once the reader is done.
    """
    stop = threading.Event()
    if world_size == 1 or max_tokens is None:
        return Share(rank, world_size, start), ledger, stop, lambda: None
    import torch.distributed as dist

    ledger = agreed(_all_gather(ledger.counts))
    group = dist.new_group(backend="gloo")
    return (Share(rank, world_size, start, dist_exchange(group, stop)), ledger, stop,
            lambda: dist.destroy_process_group(group))


def _read_batches(model, corpus: Corpus, batch_size: int, seq_len: int, max_tokens: int | None,
                  order: str, done: tuple[int, int], share: Share,
                  reading: ReadProgress | None = None, ledger: Ledger | None = None):
    """``(key, batch)`` of this process's batches not yet in the saved sums, packed.

    ``share`` holds this process's segments (``s ≡ rank (mod world_size)``, from the first
    not done); the others are skipped untokenized (``row_batches``; with ``max_tokens``,
    their counts come from ``ledger`` and ``share.exchange``). Run by the reader thread
    (``reader.prefetched``).
    """
    for rows in row_batches(model, corpus, batch_size=batch_size, seq_len=seq_len,
                            max_tokens=max_tokens, share=share, order=order, reading=reading,
                            ledger=ledger):
        if rows.key >= done:
            yield rows.key, rows.pack(model)


def _prepare(model, corpus: Corpus, accs: dict[str, Accumulator], batch_size: int, seq_len: int,
             max_tokens: int | None, order: str) -> None:
    """Fix data-dependent choices (the PCA of ``subspaces``) from the scan's first batch.

    Every process does, from a lean pass that keeps the last block's output (``lean.points``),
    unless a resumed state holds them. A corpus with no tokens is refused before anything
    runs: without a calibration that reads the corpus's first row only (in corpus order,
    one row a batch), not the first window of batches that length order sorts.
    """
    wanted = not all(a.calibrated for a in accs.values())  # a resumed state has its own
    first = next(row_batches(model, corpus, batch_size=batch_size if wanted else 1,
                             seq_len=seq_len, max_tokens=max_tokens,
                             order=order if wanted else "text"), None)
    if first is None:
        raise EmptyTextError("the corpus's texts tokenize to nothing: give texts with some words")
    calibration = points(model, first.pack(model)) if wanted else None
    for acc in accs.values():
        acc.prepare(model, calibration)


def _check_state_and_callback(state: object, on_batch: object) -> None:
    """``InputError`` for a state that is not a path or an ``on_batch`` that cannot be called."""
    if state is not None and not isinstance(state, (str, os.PathLike)):
        raise InputError(f"state is a file path (str or Path), not a {type(state).__name__}")
    if on_batch is not None and not callable(on_batch):
        raise InputError(f"on_batch is a function on_batch(key, tokens), not a {type(on_batch).__name__}")


def scan(
    model,
    corpus: str | Path | Iterable | Corpus,  # items checked as read (Corpus.source), not by the hint
    stats: str | Accumulator | Sequence[str | Accumulator] = ("growth",),
    *,
    batch_size: int = 8,
    seq_len: int | None = None,
    max_tokens: int | float | None = None,
    order: str = "length",
    state: str | Path | None = None,
    save_every: int | None = None,
    save_seconds: float = 60.0,
    progress: bool = True,
    rank: int = 0,
    world_size: int = 1,
    on_batch: Callable[[tuple[int, int], int], None] | None = None,
    graphs: bool | str = "auto",
    calibration: ScanResult | str | Path | None = None,
) -> ScanResult:
    """Scan ``corpus`` with ``model`` and return the statistics over every token.

    Args:
        model: A loaded model (``rs.load``).
        corpus: Texts, a text file (one text per line), a JSON Lines file (a text in each
            record's ``"text"``), either compressed (``.gz``, ``.xz``, ``.bz2``, ``.zst``), a
            Parquet or Arrow file (its ``"text"`` column), a folder of such files, a
            ``datasets`` dataset, streamed or not (its ``"text"`` column), or ``"builtin"``; or a ``Corpus``
            (another field or column, segment size, reading bytes that are not UTF-8 as U+FFFD).
        stats: Names from ``residual_stream.streaming.STATS``: ``growth`` (norms, updates,
            massive activations), ``survival``, ``read_attribution``, ``subspaces``, ``lens``,
            ``composition``; or specs with options, ``"lens:every=16"`` (the lens on one
            token in 16), ``"survival:granularity=head"`` (``specs.parse_spec``); or
            accumulators. Results and the saved state are keyed by spec (the name alone when
            every option is at its default).
        batch_size: Rows per forward pass.
        seq_len: Tokens per row (default: the model's context, at most 128).
        max_tokens: Stop after this many tokens (the last row is cut to fit); a whole number
            (``1e6`` is one million).
        order: ``"length"``: each batch takes rows of about one length (the rows of every
            ``batching.SORT_BATCHES`` batches sorted longest first), so little of it is
            padding; ``"text"``: rows in corpus order. The results are the same up to the
            order of float sums (``subspaces``' PCA, fixed from the first batch, aside).
        state: File to save the scan state to and resume from.
        save_every: Save the state after every this many batches (default: by time).
        save_seconds: Without ``save_every``, save the state after the first batch that ends
            this long after the last save (``0``: after every batch). A resumed scan redoes
            the batches after the last save; the state is saved at the end in any case.
        progress: Show a progress bar with tokens/s, and with a time left: out of the
            corpus's tokens as estimated while it is read, at most ``max_tokens`` (this
            process's part of them under ``torchrun``), ending at the tokens scanned
            (``streaming.progress``).
        rank: This process's index among ``world_size`` (set by ``torchrun``; see
            ``python -m residual_stream.scan``).
        world_size: Number of processes sharing the batches; results are merged across them.
        on_batch: Called as ``on_batch((segment, index), tokens_so_far)`` after each batch is
            added (and saved, when a save is due); a batch is named by its segment of the corpus
            (``Corpus.segments``) and its index there.
        graphs: Replay each batch shape's lean pass from a CUDA graph (``"auto"``: on a CUDA
            device when every statistic can be: all but per-head survival and read
            attribution; see ``streaming.graphs``).
        calibration: A scan (``ScanResult`` or saved ``.pt`` path) whose ``subspaces`` basis this
            scan takes instead of fixing its own from its first batch, so that scans of a
            corpus's parts merge (``merge_scans``; ``streaming.calibration``).
    """
    need_model(model, "scan")
    corpus = corpus if isinstance(corpus, Corpus) else Corpus(corpus)
    accs = make_accumulators(stats)
    seq_len = min(model.anatomy.n_ctx, 128) if seq_len is None else seq_len
    batch_size, seq_len, max_tokens = check_sizes(model, batch_size, seq_len, max_tokens, order)
    check_processes(rank, world_size)  # all as asked, before any reading
    _check_state_and_callback(state, on_batch)
    path = Path(state) if state is not None else None
    settings = scan_settings(model, corpus, list(accs), batch_size, seq_len, max_tokens, order, rank,
                             world_size)
    config = None if path is None else scan_config(model, settings)  # a state's: it hashes the weights
    save_due = _save_due(save_every, save_seconds)
    done, tokens, added, ledger = resume(path, config, accs)
    calibrate(model, accs, calibration)  # before the model runs, if given
    resumed = tokens
    share, ledger, stop, close = _share(rank, world_size, done[0], max_tokens, ledger)
    try:  # the exchange's group is closed however the scan ends
        _prepare(model, corpus, accs, batch_size, seq_len, max_tokens, order)
        add = batch_adder(model, accs, graphs, seq_len)
        bar = ScanBar(model.name, corpus.progress, max_tokens, tokens, progress, rank, world_size,
                      corpus.segment_chars)
        counts = bar.reading or ReadProgress({})  # what is read, and its bytes read as U+FFFD
        reading = prefetched(_read_batches(model, corpus, batch_size, seq_len, max_tokens, order, done,
                                           share, counts, ledger), stop=stop)
        start, run, segment = time.perf_counter(), 0, done[0]

        def save() -> None:  # the state as it stands when called, every batch added
            add.flush()
            save_state(path, config, done, tokens, added, accs, ledger)

        # Ctrl-C, SIGTERM: the batch ends, is saved; leaving stops the reader, its exchange too
        with closing(reading) as batches, Deferred(path is not None) as signals:
            for key, batch in batches:
                if key[0] != segment:  # the segment before ended, and its texts (or part of one)
                    segment = key[0]
                    add.flush()
                    for acc in accs.values():
                        acc.segment_done()
                add(batch)
                n = int(batch.attention_mask.sum())
                tokens, done, run, added = tokens + n, (key[0], key[1] + 1), run + 1, added + 1
                bar.update(n, tokens)
                if path is not None and save_due(run):
                    save()
                if on_batch is not None:
                    add.flush()
                    on_batch(key, tokens)
                signals.stop_if_asked(save)
            signals.stop_if_asked(save)  # one that came while the reader had no batch left
        add.flush()
        bar.close()
    finally:
        close()  # after the reader has left
    for acc in accs.values():  # the scan's last segment ended (or the token budget did)
        acc.segment_done()
    if path is not None:
        save()
    replaced = tuple(counts.replaced)  # each file once (``utf8.kept``)
    if world_size > 1:
        accs, tokens, added, resumed, replaced = _gather(accs, tokens, added, resumed, replaced)
    seconds = time.perf_counter() - start
    return ScanResult({n: a.result() for n, a in accs.items()}, tokens, added, seconds,
                      model.name, accs, resumed, config or settings, weakref.ref(model), replaced=replaced)
