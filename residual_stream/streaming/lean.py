"""The lean pass: statistics reduced inside the forward pass, one block at a time.

A trace keeps every block's stream, writes and scales until the forward pass ends. A
statistic that needs no per-head writes, logits or patterns (``growth``) does not have to
wait: when the stream entering block ``L`` arrives, the program segment between ``Mark(L−1)``
and ``Mark(L)`` is walked over what block ``L−1`` captured (its input, attention output, MLP
output, norm scales), every reducer takes what it needs, and those tensors are dropped.
Memory is one block's captured tensors whatever the depth; the arithmetic is the walk's.

Reducers get ``point(L, x)`` for the stream at each ``Mark`` and ``step(step, scales)`` for
every operation of the walk (``walk.Step``), in program order, as ``walk_stream`` yields them.
One with ``needs_logits`` (the lens) first gets ``logits(final)``, the model's own logits, so
it can reduce each point as it arrives instead of keeping them all: the lean pass runs one
plain forward pass for them (in the model's dtype; a trace has them, in float32), then the
pass itself without the unembedding. One with ``late_logits`` (a lens on sampled tokens,
which keeps its few tokens' points) gets them from the pass itself, after its last point,
so no second pass runs; when it is the only one, the model's head unembeds its tokens alone
(``chosen``, ``capture.unembedding_of_tokens``: ``1/k`` of the ``[tokens, vocab]`` logits).
``into(acc)`` adds a batch's sums to its accumulator.

When every reducer sets ``native_dtype`` (it widens what it reads itself: ``growth``), the
hooks keep the model's own tensors, with no float32 copy of each: in bf16 that is a third
of the captured bytes written and half of those read, on a pass that the GPU spends mostly
moving memory. The walk still adds in float32 (``walk.plus``).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import Tensor

from ..capture import Captured, capture, model_logits, unembedding_of_tokens
from ..errors import NonFiniteError
from ..fusion import acc_dtype
from ..program import Add, Mark, Norm, Read
from ..walk import walk_ops, walk_stream


def segments(program) -> list[list]:
    """The program cut after each ``Mark(L)``: segment ``L`` ends at ``Mark(L)``; the last is the tail."""
    out, current = [], []
    for op in program:
        current.append(op)
        if isinstance(op, Mark) and op.point != "final":
            out.append(current)
            current = []
    out.append(current)
    return out


def feed_trace(trace, reducers: Sequence) -> None:
    """Feed ``reducers`` from a finished trace: the logits, every point, every step of the walk."""
    for r in reducers:
        if getattr(r, "needs_logits", False) or getattr(r, "late_logits", False):
            r.logits(trace.logits)
    for L in range(trace.anatomy.n_layers + 1):
        for r in reducers:
            r.point(L, trace.stream(L))
    for step in walk_stream(trace):
        for r in reducers:
            r.step(step, trace.captured.norm_scale)


def reduce_trace(acc, trace) -> None:
    """Add one batch from a finished trace to ``acc`` through its own reducer (``sums_for``)."""
    sums = acc.sums_for(trace.model, trace.batch)
    feed_trace(trace, [sums])
    sums.into(acc)


@dataclass(frozen=True)
class Points:
    """The stream of one batch at some points: what a calibration reads of a trace, lean.

    Quacks like a ``Trace`` for ``stream(point)``, ``attention_mask`` and ``anatomy``.
    """

    anatomy: object
    attention_mask: Tensor
    streams: dict[int, Tensor]

    def stream(self, point: int) -> Tensor:
        """The stream entering block ``point`` (``[batch, pos, d_model]``, float32)."""
        if point not in self.streams:
            raise IndexError(f"point {point} was not kept (kept: {sorted(self.streams)})")
        return self.streams[point]


class _KeepPoints:
    """A reducer that keeps the stream at chosen points."""

    def __init__(self, wanted) -> None:
        self.wanted, self.streams = set(wanted), {}

    def point(self, point: int, x: Tensor) -> None:
        """Keep ``x`` if ``point`` is wanted."""
        if point in self.wanted:
            self.streams[point] = x

    def step(self, step, scales) -> None:
        """Nothing."""


def points(model, batch, wanted: Sequence[int] | None = None) -> Points:
    """One lean pass of ``model`` over ``batch`` keeping the stream at ``wanted`` points only.

    ``wanted`` defaults to the last block's output (what a PCA calibration reads).
    """
    keep = _KeepPoints([model.anatomy.n_layers] if wanted is None else wanted)
    lean_pass(model, batch, [keep])
    return Points(model.anatomy, batch.attention_mask.to(model.device), keep.streams)


class _Stream(dict):
    """``Captured.resid`` that walks and evicts the previous block when a new point arrives."""

    def __init__(self, on_point) -> None:
        super().__init__()
        self.on_point = on_point

    def __setitem__(self, point: int, x: Tensor) -> None:
        super().__setitem__(point, x)
        self.on_point(point)


def lean_pass(model, batch, reducers: Sequence) -> None:
    """One forward pass of ``model`` over ``batch``, feeding ``reducers`` block by block.

    Raises ``NonFiniteError`` (naming the first point) if the stream holds NaN or inf on real
    tokens; the check costs one device sync at the end of the pass.
    """
    check_finite(lean_forward(model, batch, reducers), batch.attention_mask.to(model.device))


def lean_forward(model, batch, reducers: Sequence) -> list[Tensor]:
    """``lean_pass`` without its check: returns each point's per-token coordinate sums.

    Nothing here waits for the device unless a reducer does, so a CUDA graph can capture it
    (``streaming.graphs``); ``check_finite`` the returned sums afterwards.
    """
    anatomy = model.anatomy
    segs = segments(anatomy.program)
    cap = Captured()
    finite: list[Tensor] = []  # per point: Σ_i x_i per token

    def attn_write(layer: int) -> Tensor:
        return cap.attn_out[layer]

    def walk(seg: list, x: Tensor) -> None:
        for step in walk_ops(seg, x, cap, anatomy.norms, attn_write):
            for r in reducers:
                r.step(step, cap.norm_scale)

    def on_point(point: int) -> None:
        x = cap.resid[point]
        walk(segs[point], cap.resid[point - 1] if point else torch.zeros_like(x))
        for r in reducers:
            r.point(point, x)
        finite.append(_coordinate_sums(reducers, point, x))  # NaN/inf propagate: checked at the end
        for store in (cap.resid, cap.attn_out, cap.mlp_out):  # block point − 1 is done
            dict.pop(store, point - 1, None)
        if point == 0:
            cap.embeds.clear()

    tokens = batch.tokens.to(model.device)
    # A replayed batch known to have no padding gives the model no mask: Hugging Face cannot
    # check a mask inside a graph's capture, so it would build the full [pos, pos] mask and
    # its SDPA would lose the causal kernel (cuDNN attention 2.9 ms against 1.2 ms, 32×512).
    mask = None if getattr(batch, "dense", False) else batch.attention_mask.to(model.device)
    _give_logits(model, tokens, mask, reducers)
    late = [r for r in reducers if getattr(r, "late_logits", False)]
    # one reducer's sampled tokens: the head unembeds those only, not [tokens, vocab]
    chosen = getattr(late[0], "chosen", lambda: None)() if len(late) == 1 else None
    fired: list = []
    edits = [] if chosen is None else unembedding_of_tokens(model.module, chosen, tokens.shape, fired)
    cap.resid = _Stream(on_point)
    try:
        native = all(getattr(r, "native_dtype", False) for r in reducers)
        capture(model.module, anatomy, tokens, mask, heads=False, logits="native" if late else False,
                out=cap, dtype=None if native else torch.float32, edits=edits,
                scales=scales_read(anatomy.program, reducers))
        walk(segs[-1], cap.resid[anatomy.n_layers])
        for r in late:
            r.logits(cap.logits, taken=bool(fired))
    finally:  # cap → its stream → on_point → cap is a cycle: break it, or the reducers (and
        cap.resid = {}  # their buffers) would wait for the garbage collector
    return finite


def _give_logits(model, tokens: Tensor, mask: Tensor | None, reducers: Sequence) -> None:
    """Hand the model's own logits to the reducers that need them (one plain forward pass)."""
    wants = [r for r in reducers if getattr(r, "needs_logits", False)]
    if wants:
        final = model_logits(model.module, model.anatomy, tokens, mask)
        for r in wants:
            r.logits(final)


def scales_read(program, reducers: Sequence) -> set[str]:
    """The norms whose per-token scale a lean pass keeps: what the walk and ``reducers`` read.

    The walk maps the stream through each stream ``Norm`` and a write through its ``Add``'s
    ``via`` norm; a reading norm's scale (``Read.norm``: a pre-norm block's) is kept only
    for a reducer with ``reads_scales`` (read attribution). The rest are never computed:
    a pre-norm model's growth scan keeps none but the final norm's.
    """
    kept = {op.norm for op in program if isinstance(op, Norm)}
    kept |= {op.via for op in program if isinstance(op, Add) and op.via is not None}
    if any(getattr(r, "reads_scales", False) for r in reducers):
        kept |= {op.norm for op in program if isinstance(op, Read) and op.norm is not None}
    return kept


def _coordinate_sums(reducers: Sequence, point: int, x: Tensor) -> Tensor:
    """``Σ_i x_i`` per token of the stream at ``point``, for the finiteness check.

    A reducer that has taken them anyway offers them (``coordinate_sums(point)``: growth,
    for the centering share), so the stream is not read once more for them.
    """
    for r in reducers:
        if hasattr(r, "coordinate_sums"):
            return r.coordinate_sums(point)
    return x.sum(-1, dtype=acc_dtype(x))


def check_finite(sums: list[Tensor], mask: Tensor) -> None:
    """Raise ``NonFiniteError`` naming the first point whose real tokens' sums are not finite.

    ``sums`` holds each point's per-token coordinate sums (``lean_forward``); ``mask`` the
    batch's attention mask. One device sync for the batch.
    """
    mask = mask.bool()
    flags = (torch.stack(sums).isfinite() | ~mask).flatten(1).all(-1)
    if not bool(flags.all()):
        first = int((~flags).nonzero()[0, 0])
        raise NonFiniteError(f"NaN/inf first appears in the stream entering block {first} "
                             f"(point {first}). Check the weights before it or run in float32.")
