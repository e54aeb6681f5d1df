"""Activation patching of the residual stream: where, in depth and position, a behaviour lives.

The stream at point ``L`` (what enters block ``L``; ``n_layers``: the last block's output, as
``Trace.stream``) of a clean run is replaced at one token by the same point of a ``reference``
run (usually a corrupted prompt: another name, another fact) and the model runs on; a
``metric`` of the logits (a logit difference) is measured on each patched run. Every later
write reads the patched state, so ``metric_share`` near 1 at ``(L, p)`` says the whole
difference between the runs passes through the stream at that point and token.

Patched runs are stacked along the batch (``batch_size`` of them per forward pass), and a
patch that changes nothing is not run: where the reference's state equals the clean one (in
a causal model, every token before the first that differs), its metric is the clean run's.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
import pandas as pd
import torch
from jaxtyping import Bool, Float
from torch import Tensor

from ..capture import model_logits
from ..errors import InputError, OutOfRangeError, as_index, batch_count, layer_index, listed
from ..hookio import first_input, first_output, with_first_input, with_first_output
from ..memory import pass_bytes
from ..skipping import skipping
from .ablation_args import checked_patching, metric_values, position_mask, reference_metric, text_shares
from .results import CompactRepr

ALL = slice(None)      # every row of a pass: one copy of the batch
STACK_BUDGET = 2**30   # bytes of stacked logits and activations a default batch_size allows
MAX_STACK = 16         # copies stacked per pass by default
SKIP_CLEAN_BLOCKS = True  # patched passes take the blocks before the first edit from the trace


class Shares:
    """What every patching result shares: the metric's share of the way from clean to reference.

    Fields it reads: ``metric [rows, columns]``, ``metric_clean``, ``metric_reference`` and,
    for a metric returning one value per text, ``per_text [rows, columns, batch]``,
    ``per_text_clean`` and ``per_text_reference`` (None otherwise).
    """

    def text_share(self) -> Float[Tensor, "row column batch"]:
        """Each text's ``(metric − clean) / (reference − clean)`` (NaN where its two runs agree).

        ``InputError`` when the metric returned one number for all texts.
        """
        return text_shares(self.per_text, self.per_text_clean, self.per_text_reference)

    def share(self) -> Float[Tensor, "row column"]:
        """``(metric − clean) / (reference − clean)``: the part of the way to the reference's value.

        All NaN when the two runs have the same metric (no difference to locate).
        """
        gap = self.metric_reference - self.metric_clean
        return (self.metric - self.metric_clean) / gap if gap else torch.full_like(self.metric, float("nan"))

    def long_frame(self, columns: dict[str, object], per_text: bool) -> pd.DataFrame:
        """The grid as a long frame: ``columns`` (one value per cell, row-major), then the metric's.

        ``metric, metric_change, metric_share``; ``per_text=True``: a row per cell and text
        (``text``; the shares each text's own).
        """
        frame = pd.DataFrame(columns)
        if not per_text:
            return frame.assign(metric=self.metric.flatten().numpy(),
                                metric_change=(self.metric - self.metric_clean).flatten().numpy(),
                                metric_share=self.share().flatten().numpy())
        share, b = self.text_share(), self.per_text.shape[-1]
        frame = frame.loc[frame.index.repeat(b)].reset_index(drop=True)
        frame["text"] = list(range(b)) * (len(frame) // b)
        return frame.assign(metric=self.per_text.flatten().numpy(),
                            metric_change=(self.per_text - self.per_text_clean).flatten().numpy(),
                            metric_share=share.flatten().numpy())


@dataclass(frozen=True, eq=False, repr=False)
class StreamPatching(Shares, CompactRepr):
    """The metric with the stream patched at each ``(point, position)``.

    ``metric [point, position]``: the metric of the run patched there; ``metric_clean`` and
    ``metric_reference``: of the two runs themselves. ``points``: stream points (``Trace.stream``'s
    numbering); ``positions``: token indices into each row (negative: from its last real token);
    ``tokens``: the first row's token at each position. ``run [point, position]``: whether that
    patch needed a forward pass (False: the two states were equal there, the metric is the clean
    one's). ``method``: ``"patch"`` (each metric measured) or ``"attribution"`` (each estimated to
    first order from one backward pass, ``rs.attribution_patching``; ``run`` is then all False).
    With a metric returning one value per text: ``per_text [point, position, batch]``,
    ``per_text_clean`` and ``per_text_reference`` ``[batch]``, and the fields above their means
    over texts (None otherwise).
    """

    points: tuple[int, ...]
    positions: tuple[int, ...]
    tokens: tuple[str, ...]
    metric: Float[Tensor, "point position"]
    metric_clean: float
    metric_reference: float
    run: Bool[Tensor, "point position"]
    method: str = "patch"
    per_text: Float[Tensor, "point position batch"] | None = None
    per_text_clean: Float[Tensor, " batch"] | None = None
    per_text_reference: Float[Tensor, " batch"] | None = None

    def to_frame(self, per_text: bool = False) -> pd.DataFrame:
        """Long frame: ``point, position, token, metric, metric_change, metric_share``.

        And ``run`` for measured patching (an estimate runs no patch). ``per_text=True``: a
        row per text too (``text``; the shares each text's own), for a per-text metric.
        """
        n, m = self.metric.shape
        columns = {"point": np.repeat(self.points, m), "position": list(self.positions) * n,
                   "token": list(self.tokens) * n}
        frame = self.long_frame(columns, per_text)
        if self.method == "patch":
            frame["run"] = np.repeat(self.run.flatten().numpy(), len(frame) // self.run.numel())
        return frame


def grid_axes(trace, points, positions) -> tuple[tuple[int, ...], tuple[int, ...], list[Tensor], tuple]:
    """``(points, positions, masks, tokens)`` of a patching grid, checked (see ``patch_stream``)."""
    return (_points(trace, points), *position_axis(trace, positions))


def position_axis(trace, positions) -> tuple[tuple[int, ...], list[Tensor], tuple]:
    """``(positions, masks, tokens)`` of a patching, checked.

    Each position's ``[batch, pos]`` mask of real tokens, and the first row's token there
    (``""`` past its end).
    """
    pos, masks = _positions(trace, positions)
    first = trace.str_tokens[0]
    return pos, masks, tuple(first[p] if -len(first) <= p < len(first) else "" for p in pos)


def _points(trace, points) -> tuple[int, ...]:
    n = trace.anatomy.n_layers
    if points is None:
        return tuple(range(n + 1))
    if isinstance(points, (str, bytes)) or (isinstance(points, Tensor) and points.dtype == torch.bool):
        raise InputError(f"points are stream points 0..{n} as ints, one or a list, not {points!r}")
    items = listed(points, f"points are stream points 0..{n} (what enters block L; {n}: the last "
                           f"block's output), one or a list, not {points!r}",
                   "points is empty: name stream points, or leave it out (None) for all")
    out = []
    for p in items:
        i = as_index(p)
        try:
            out.append(layer_index(i + n + 1 if i is not None and -n - 1 <= i < 0 else p, n + 1,
                                   "a stream point", n, " (negative: from the end)"))
        except OutOfRangeError:
            raise OutOfRangeError(f"a stream point is in 0..{n} (what enters block L; {n}: the last "
                                  f"block's output; negative from the end), not {p!r}") from None
    return tuple(out)


def _positions(trace, positions) -> tuple[tuple[int, ...], list[Tensor]]:
    """The positions and, for each, its ``[batch, pos]`` mask of real tokens."""
    if positions is None:
        real = trace.attention_mask.bool().cpu()
        at = torch.arange(real.shape[1])
        return tuple(range(real.shape[1])), [(at == i) & real for i in range(real.shape[1])]
    if isinstance(positions, Tensor) and positions.dtype == torch.bool:
        raise InputError("positions here are token indices (one patch each), not a mask")
    wrong = ("positions are token indices in each row (-1: its last real token), one or a list; "
             f"not {positions!r}")
    items = listed(positions, wrong, wrong)
    if any(as_index(p) is None for p in items):
        raise InputError(wrong)
    return tuple(as_index(p) for p in items), [position_mask(trace, p) for p in items]


def copy_rows(trace, copy: int) -> slice:
    """The rows of copy ``copy`` when copies of ``trace``'s batch are stacked along the batch."""
    b = trace.tokens.shape[0]
    return slice(copy * b, (copy + 1) * b)


def in_rows(output, rows: slice, new: Tensor):
    """A module's ``output`` (a tensor, or a tuple or list led by one), ``rows`` of its first set to ``new``.

    The module's tensor itself is never written to: a copy is, unless ``rows`` is every row.
    """
    if rows != ALL:
        full = first_output(output).clone()
        full[rows] = new
        new = full
    return with_first_output(output, new)


def stack_size(trace, batch_size: object, what: str, columns: Tensor | None = None) -> int:
    """Copies of the batch stacked per pass: ``batch_size`` checked, or a default for None.

    The default: as many as keep what each copy adds to the pass (``memory.pass_bytes``: its
    logits, at ``columns`` only if given, and a block's largest activations) within
    ``STACK_BUDGET`` bytes in the model's dtype (at most ``MAX_STACK``, at least one).
    """
    if batch_size is not None:
        return batch_count(batch_size, what)
    per_copy = pass_bytes(trace.anatomy, tuple(trace.tokens.shape), trace.model.dtype.itemsize,
                          None if columns is None else len(columns))
    return max(1, min(MAX_STACK, STACK_BUDGET // per_copy))


def logit_columns(trace, metric: Callable, logits_at, clean: Tensor) -> Tensor | None:
    """The positions whose logits the patched passes compute: those of ``logits_at`` in any row.

    ``logits_at``: as ``positions`` (token indices in each row, negative from its last real
    token; or a ``[batch, pos]`` bool mask); None: every position. The metric must read the
    logits there only. Checked on the clean run: with every other position NaN, and again
    with the clean logits negated there, the metric must give ``clean`` (its value on the
    clean logits), or ``InputError``. A read the two fills cannot show (a comparison false
    either way) goes unseen.
    """
    if logits_at is None:
        return None
    try:
        mask = position_mask(trace, logits_at)
    except InputError as e:
        raise InputError(f"logits_at: {e}") from None
    columns = mask.any(0).nonzero().squeeze(1)
    rows, logits = trace.tokens.shape[0], trace.logits.float()
    elsewhere = torch.ones(logits.shape[1], dtype=torch.bool, device=logits.device)
    elsewhere[columns.to(logits.device)] = False
    for what, fill in (("NaN", lambda x: torch.full_like(x, float("nan"))), ("changed", torch.neg)):
        shown = logits.clone()
        shown[:, elsewhere] = fill(logits[:, elsewhere])
        seen = metric_values(metric, shown, rows, len(clean))
        if not torch.allclose(seen, clean, rtol=0, atol=0, equal_nan=True):
            is_mask = isinstance(logits_at, Tensor) and logits_at.dtype == torch.bool
            raise InputError(
                f"the metric reads logits outside logits_at={'a mask' if is_mask else repr(logits_at)} "
                f"(positions {columns.tolist()}): with the other positions {what} it gives "
                f"{seen.tolist()}, not {clean.tolist()}. "
                "Name every position it reads (weighting every position by a mask, NaN × 0 is NaN: index "
                "the named ones instead), or leave logits_at out")
    return columns


def spread_logits(logits: Tensor, columns: Tensor | None, trace) -> Tensor:
    """One copy's logits as the metric takes them: float32 ``[batch, pos, vocab]`` on the trace's device.

    ``logits`` at ``columns`` only (``[batch, len(columns), vocab]``) are put in their places
    and every other position is NaN; full-width logits (``columns`` None, or a model whose
    unembedding could not be narrowed) are copied as they are.
    """
    device = trace.tokens.device
    if columns is None or logits.shape[1] == trace.tokens.shape[1]:
        return logits.to(device, torch.float32, copy=True)
    out = torch.full((*trace.tokens.shape, logits.shape[-1]), float("nan"), device=device)
    out[:, columns.to(device)] = logits.to(device, torch.float32)
    return out


def _stream_edit(trace, reference, point: int, where: Tensor, rows: slice) -> tuple:
    """The edit writing ``reference``'s stream at ``point`` into ``rows`` of the pass, at ``where``.

    A pre-hook on block ``L``'s input for ``L < n_layers``, a hook on the last block's output
    for ``n_layers`` (the points ``capture`` records).
    """
    a = trace.anatomy
    value = reference.captured.resid[point]

    def swap(x: Tensor) -> Tensor:
        part = x[rows]
        return torch.where(where.to(x.device)[..., None], value.to(x.device, x.dtype), part)

    def pre(module, args, kwargs):
        x = first_input(args, kwargs)
        return with_first_input(args, kwargs, in_rows(x, rows, swap(x)))

    def post(module, args, output):
        return in_rows(output, rows, swap(first_output(output)))

    return (a.modules.layers[point], pre, True) if point < a.n_layers else (a.modules.layers[-1], post)


def stacked_logits(trace, edits: list[tuple], copies: int, skip: int = 0,
                   columns: Tensor | None = None) -> Tensor:
    """The logits of one pass over ``copies`` stacked copies of ``trace``'s batch with ``edits``.

    ``[copies · batch, pos, vocab]`` in the model's dtype; copy ``c`` is rows ``copy_rows(trace,
    c)``, each edit confined to its copy's rows. ``skip``: blocks ``0..skip-1``, which no edit
    changes, return the clean stream at point ``skip`` from the trace instead of computing it
    (``skipping``; not with ``SKIP_CLEAN_BLOCKS`` False). ``columns``: only those positions are
    unembedded (``model_logits``; ``spread_logits`` puts them back in place).
    """
    model = trace.model
    tokens = trace.tokens.to(model.device).repeat(copies, 1)
    mask = trace.attention_mask.to(model.device).repeat(copies, 1)

    def probe() -> None:
        model_logits(model.module, trace.anatomy, tokens[:1, :1], mask[:1, :1])

    with skipping(trace, skip if SKIP_CLEAN_BLOCKS else 0, copies, probe):
        return model_logits(model.module, trace.anatomy, tokens, mask, edits, columns)


def patch_stream(trace, reference, metric: Callable[[Tensor], Tensor | float], *,
                 points: int | Sequence[int] | None = None,
                 positions: int | Sequence[int] | None = None,
                 batch_size: int | None = None, logits_at=None) -> StreamPatching:
    """Patch the clean ``trace``'s stream with ``reference``'s at each point and token; measure ``metric``.

    ``reference``: a trace of the same model and ``[batch, pos]`` shape, real tokens in the same
    places (a corrupted prompt). ``metric``: a function of the logits ``[batch, pos, vocab]``
    (float32, pads included) returning one number, as ``ablation_check``'s, or one per text
    (``[batch]``: per-text results, ``StreamPatching.per_text``, besides their means). ``points``: stream
    points ``0..n_layers`` (what enters block L; ``n_layers``: the last block's output; negative
    from the end; default all); ``positions``: token indices in each row (negative from its last
    real token; default every position, each patched in the rows where it is a real token).
    ``batch_size``: patched runs stacked per forward pass; default as many as keep their logits
    and the pass's largest activations within 1 GiB, at most 16 (memory grows with it: that
    many copies of the batch's activations and logits). ``logits_at``: the positions the
    metric reads (as ``positions``; ``-1`` for a metric of each text's last token): patched
    passes unembed only those, and the metric gets NaN elsewhere (checked on the clean run
    first, ``logit_columns``); default every position.
    """
    checked_patching(trace, reference, metric, "patch_stream", "the stream")
    pts, pos, masks, tokens = grid_axes(trace, points, positions)
    rows = trace.tokens.shape[0]
    clean = metric_values(metric, trace.logits.float().clone(), rows)
    columns = logit_columns(trace, metric, logits_at, clean)
    stack = stack_size(trace, batch_size, "patched runs", columns)
    out = clean.expand(len(pts), len(pos), len(clean)).clone()
    run = torch.zeros(len(pts), len(pos), dtype=torch.bool)
    todo = []
    for i, point in enumerate(pts):
        mine, theirs = trace.captured.resid[point], reference.captured.resid[point]
        for j, where in enumerate(masks):
            w = where.to(mine.device)
            if not torch.equal(mine[w], theirs[w]):
                todo.append((i, j))
                run[i, j] = True
    for start in range(0, len(todo), stack):
        chunk = todo[start:start + stack]
        stacked = len(chunk) > 1
        edits = [_stream_edit(trace, reference, pts[i], masks[j], copy_rows(trace, c) if stacked else ALL)
                 for c, (i, j) in enumerate(chunk)]
        logits = stacked_logits(trace, edits, len(chunk), skip=min(pts[i] for i, _ in chunk), columns=columns)
        for c, (i, j) in enumerate(chunk):
            mine = spread_logits(logits[c * rows:(c + 1) * rows], columns, trace)
            out[i, j] = metric_values(metric, mine, rows, len(clean))
    reference_values = reference_metric(metric, reference.logits.float().clone(), rows, clean)
    return grid_result(pts, pos, tokens, out, clean, reference_values, run, "patch")


def grid_result(points, positions, tokens, out: Tensor, clean: Tensor, reference: Tensor, run: Tensor,
                method: str) -> StreamPatching:
    """A ``StreamPatching`` from ``[point, position, k]`` values, ``k`` 1 or one per text."""
    per_text = len(clean) > 1
    return StreamPatching(points, positions, tokens, out.mean(-1), float(clean.mean()),
                          float(reference.mean()), run, method, out if per_text else None,
                          clean if per_text else None, reference if per_text else None)
