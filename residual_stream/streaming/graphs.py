"""Replayed lean passes: one CUDA graph per batch shape, so a scan launches its kernels once.

On a GPU a small model's forward pass is bound by the host: Python and kernel launches, not
the device, set its pace, and every reduction a statistic adds inside it adds host time in
proportion (SmolLM2-135M, 8×128 tokens in bf16 on an H200: an eager plain forward takes
19–21 ms of which the device is busy 3.6 ms; the same forward replayed as a CUDA graph,
4.4 ms).
A lean pass whose reducers never wait for the device (``Accumulator.replayable``: their
reducer takes ``sums_for(..., replayable=True)``) is therefore captured once per
``(batch, pos)`` shape and replayed for every later batch of that shape:

* the batch is copied into static buffers on the device (``sampling.StaticBatch``: tokens,
  mask, rows' texts, and each sampled statistic's chosen tokens in a fixed-capacity
  ``TokenChoice``); the capture ran on those buffers, so the replay reads the new batch and
  leaves the reducers' tensors (norms, sums, massive-activation candidates) holding its
  values;
* ``into`` then reduces them into the accumulators exactly as after an eager pass, naming
  the batch (``rebind``: its rows' texts, starts and token strings). Where every reducer
  can copy its tensors (``snapshot``: growth's, a few MB), a batch's ``into`` waits for the
  next ``add``: its checks and host reads (``fetch``) run before the next replay is queued
  and its ``into`` after, so the host's part of a batch (10.7 ms of a 32×512 growth batch
  on an H200, session 33) overlaps the device's next replay instead of leaving it idle;
  one stream orders everything, so ``into`` reads the copies before anything overwrites
  them. ``flush`` adds the waiting batch (``rs.scan`` flushes before each state save,
  segment end and ``on_batch`` call, and at its end);
* a batch whose fixed-size massive-activation search overflowed (``overflowed``), or whose
  sampled tokens outgrow their fixed choice (``sampling.capacity``), is done by the eager
  lean pass, so the results never depend on the replay; a stream that
  is not finite raises ``NonFiniteError`` as the eager pass does.

A scan's batches are right-padded (masked positions, which change no statistic) to the
narrowest of ``seq_len``, its half, quarter ... (``WIDTH_HALVINGS`` of them, each rounded up
to a multiple of 8 and at least ``MIN_WIDTH``) that holds them (``padded_width``), so
length-sorted batches (``batching.ORDERS``) of short texts run at about their own width while
a scan captures a few widths. A batch with no padding at all has a graph of its own, captured
with no mask given to the model (``StaticBatch.dense``): inside a capture Hugging Face cannot
look at a mask, so it builds the whole causal mask and its SDPA loses the causal kernel
(cuDNN attention 2.9 against 1.2 ms a 32×512 batch of SmolLM2 on an H200).
Capturing costs three eager passes of the first batch of each
shape (two warm-ups and the capture); at most ``MAX_SHAPES`` shapes are kept: full batches
at every width and the first short ones. Past that, a shape (a later segment's short last
batch: one batch in ~60 at 32×512 with the default segments) takes the eager pass. Each
kept graph holds its own memory pool; as the widths halve, all of them together hold at
most about twice the widest one's. A shape whose capture fails (a model that waits for the
device inside its forward pass, say) is warned about once and takes the eager pass. Without
CUDA (``emulate``) the same buffers, reducers and checks run eagerly, so the CPU tests
exercise everything but the graph itself.
"""

from __future__ import annotations

import dataclasses
import warnings
from collections.abc import Callable

import torch

from .base import copies
from .lean import check_finite, lean_forward
from .sampling import StaticBatch, unpadded

MAX_SHAPES = 8
WIDTH_HALVINGS = 5  # replayed widths: seq_len and up to 5 halvings of it ...
MIN_WIDTH = 16  # ... each rounded up to a multiple of 8, none under 16 positions


@dataclasses.dataclass
class Pending:
    """A replayed batch whose sums are not yet added to the accumulators (``Replayed.held``)."""

    batch: object  # the batch as given (its rows' texts and token strings)
    sums: dict     # its reducers, or copies of them (``snapshot``) that the next replay leaves alone
    finite: list   # its points' coordinate sums (``check_finite``)
    mask: object   # its (padded) mask on the device


@dataclasses.dataclass
class Entry:
    """One captured batch shape: its static batch, its captured run and graph, its reducers."""

    batch: object          # the static batch (its tensors are the graph's input buffers)
    run: Callable          # the captured function: () → (sums by name, finite sums)
    graph: object | None   # torch.cuda.CUDAGraph, or None when emulating
    sums: dict             # what the capture's reducers hold (replays overwrite their tensors)
    finite: list


def on_one_device(module: torch.nn.Module, device: torch.device) -> bool:
    """Whether every parameter and buffer of ``module`` is on ``device`` (none offloaded)."""
    tensors = [*module.parameters(), *module.buffers()]
    return all(t.device == device for t in tensors)


def padded_width(positions: int, seq_len: int | None) -> int:
    """Positions a replayed batch of ``positions`` is padded to.

    The narrowest of ``widths(seq_len)`` that holds it; ``positions`` itself without a
    ``seq_len`` or past it.
    """
    if seq_len is None:
        return positions
    return next((w for w in widths(seq_len) if w >= positions), positions)


def widths(seq_len: int) -> list[int]:
    """A scan's replayed widths, narrowest first: ``seq_len`` and its halvings (see above)."""
    halved = {-(-seq_len // 2**k // 8) * 8 for k in range(1, WIDTH_HALVINGS + 1)}
    return sorted({w for w in halved if MIN_WIDTH <= w < seq_len} | {seq_len})


def padded_batch(batch, width: int | None):
    """``batch`` right-padded with masked positions to ``padded_width`` of ``width``."""
    extra = padded_width(batch.tokens.shape[1], width) - batch.tokens.shape[1]
    if extra <= 0:
        return batch
    pad = torch.nn.functional.pad
    return dataclasses.replace(batch, tokens=pad(batch.tokens, (0, extra), value=0),
                               attention_mask=pad(batch.attention_mask, (0, extra), value=0))


class Replayed:
    """Lean passes of ``accs`` on ``model``, replayed from a CUDA graph per batch shape."""

    def __init__(self, model, accs: dict, *, width: int | None = None,
                 emulate: bool | None = None) -> None:
        """Replay ``accs`` on ``model``.

        ``width``: a scan's ``seq_len``; each batch is right-padded to it or one of its
        halvings (``padded_width``), so batches of about one length share a shape; padding
        is masked and changes no statistic. ``None``: one shape per batch shape.
        """
        self.model, self.accs, self.width = model, accs, width
        self.emulate = model.device.type != "cuda" if emulate is None else emulate
        self.entries: dict[tuple, Entry] = {}
        self.replays = self.fallbacks = 0
        self.pending: Pending | None = None  # replayed, its ``into`` not yet run (``add``)

    @staticmethod
    def usable(model, accs: dict) -> bool:
        """Whether every statistic can be replayed (lean and replayable) on a CUDA model.

        The model must sit whole on its one device: a model spread over devices or offloaded
        by accelerate (``device_map``) moves weights inside its forward pass, which a graph
        captured on one stream cannot replay.
        """
        return (model.device.type == "cuda" and on_one_device(model.module, model.device)
                and all(a.lean and a.replayable for a in accs.values()))

    def add(self, batch) -> None:
        """Add one batch to the accumulators, replaying (or first capturing) its shape's graph.

        Where every reducer can be kept (``snapshot``), the batch's ``into`` waits for the next
        ``add`` (or ``flush``), so that the host runs it while the device replays that batch:
        its sums are copied as the replay ends, and its checks read (one wait) before the next
        replay is queued. Otherwise it is added at once.
        """
        padded = padded_batch(batch, self.width)
        shape = (*padded.tokens.shape, unpadded(padded))  # with or without padding: two graphs
        if shape not in self.entries and len(self.entries) < MAX_SHAPES:
            self.entries[shape] = self._capture(padded)
        entry = self.entries.get(shape)
        checked = self._checked()  # the batch replayed before: its checks, read while the device is idle
        if entry is None or not entry.batch.refill(padded):  # past MAX_SHAPES, not captured, or
            self._into(checked)  # more sampled tokens than a fixed choice holds: added eagerly
            if entry is not None:
                self.fallbacks += 1
            return self._eager(batch)
        if entry.graph is None:
            entry.sums, entry.finite = entry.run()
        else:
            entry.graph.replay()
        this = self.held(entry, batch)
        self._into(checked)  # on the host while the device replays this batch
        self.pending = this
        if this.sums is entry.sums:  # not kept apart from the next replay: added now
            self.flush()

    @staticmethod
    def held(entry: Entry, batch) -> Pending:
        """``batch``, just replayed by ``entry``: its sums copied (``snapshot``) where all can be."""
        if all(hasattr(s, "snapshot") for s in entry.sums.values()):
            *finite, mask = copies([*entry.finite, entry.batch.attention_mask])
            return Pending(batch, {n: s.snapshot() for n, s in entry.sums.items()}, finite, mask)
        return Pending(batch, entry.sums, entry.finite, entry.batch.attention_mask)

    def flush(self) -> None:
        """Add the batch replayed last, if it waits (before the accumulators are read or saved)."""
        self._into(self._checked())

    def _checked(self) -> tuple[Pending, bool] | None:
        """The waiting batch and whether it overflowed; ``NonFiniteError`` if its stream was not finite."""
        p, self.pending = self.pending, None
        if p is None:
            return None
        if any(s.overflowed() for s in p.sums.values()):
            return p, True  # too many massive-activation candidates: redone exactly, eagerly
        check_finite(p.finite, p.mask)
        for s in p.sums.values():  # what its ``into`` reads back, read before the next replay
            s.rebind(p.batch, p.batch.tokens.shape[1])
            if hasattr(s, "fetch"):
                s.fetch()
        return p, False

    def _into(self, checked: tuple[Pending, bool] | None) -> None:
        if checked is None:
            return
        p, overflowed = checked
        if overflowed:
            self.fallbacks += 1
            return self._eager(p.batch)
        self.replays += 1
        for name, s in p.sums.items():
            s.into(self.accs[name])

    def __call__(self, batch) -> None:
        """``add(batch)``."""
        self.add(batch)

    def _eager(self, batch) -> None:
        from .adding import add_batch  # the scan's own eager step (adding imports this module)

        add_batch(self.model, batch, self.accs)

    def _capture(self, batch) -> Entry | None:
        static = StaticBatch.on(batch, self.model.device)

        def run():
            shared: dict = {}  # survival and read attribution share one reducer, as eagerly
            sums = {n: a.sums_for(self.model, static, shared, replayable=True)
                    for n, a in self.accs.items()}
            return sums, lean_forward(self.model, static, list(dict.fromkeys(sums.values())))

        if self.emulate:  # one warm-up, as ``record`` runs first: it makes the fixed choices
            run()
            return Entry(static, run, None, {}, [])
        try:
            graph, (sums, finite) = record(run, self.model.device)
        except Exception as e:  # noqa: BLE001 - a model or reducer that cannot be captured
            warnings.warn(f"could not capture the lean pass of shape {tuple(batch.tokens.shape)} "
                          f"as a CUDA graph ({type(e).__name__}: {e}); batches of this shape "
                          "take the eager pass (pass graphs=False to skip trying)",
                          RuntimeWarning, stacklevel=3)
            return None
        return Entry(static, run, graph, sums, finite)


def record(fn: Callable, device: torch.device) -> tuple[object, object]:
    """``(graph, fn())``: ``fn`` captured into a new ``torch.cuda.CUDAGraph`` (not yet replayed).

    ``fn`` first runs twice on a side stream, so that libraries' handles, compiled kernels
    (``fusion``) and allocations exist before the capture.
    """
    side = torch.cuda.Stream(device)
    side.wait_stream(torch.cuda.current_stream(device))
    with torch.cuda.stream(side):
        for _ in range(2):
            fn()
    torch.cuda.current_stream(device).wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = fn()
    return graph, out
