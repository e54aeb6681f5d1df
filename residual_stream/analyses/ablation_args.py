"""The arguments of ``ablation_check``, checked: writes, reference, positions and metric.

Each function returns what the check uses or raises the library's error saying what to pass.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable

import torch
from torch import Tensor

from ..errors import InputError, NotAvailableError, UnknownNameError, as_index, listed, need_trace
from .flow import component_label


def checked_writes(trace, writes: object) -> tuple[tuple[str, ...], list[str]]:
    """The writes to ablate (default every component) and the component each belongs to."""
    a = trace.anatomy
    names = [c.name for c in a.components]
    if isinstance(writes, str):
        raise InputError(f"writes is a list of component names, e.g. [{writes!r}], not a string")
    if writes is None:
        return tuple(names), names
    writes = tuple(listed(writes, f"writes is a list of component or head names (['L0.attn', 'L1H2']), "
                                  f"not {writes!r}", "writes is empty: name the writes to ablate, or leave "
                                  "it out (None) for every component", indices=False))
    for w in writes:
        if w in names or a.head(w):
            continue
        raise UnknownNameError(f"no component {w!r} to ablate; components are {names[:4]}... "
                               f"and heads L0H0…L{a.n_layers - 1}H{a.n_heads - 1}")
    return writes, [component_label(w) for w in writes]


def checked_patching(trace, reference, metric: object, fn: str, what: str) -> None:
    """The checks every patching of ``what`` from a ``reference`` run makes of its arguments."""
    need_trace(trace, fn)
    if reference is None:
        raise InputError(f"{fn} takes {what} from a reference run: "
                         "reference=rs.trace(model, corrupted_texts), as many tokens as the trace")
    checked_metric(metric)
    a = trace.anatomy
    if not a.has_lm_head:
        raise NotAvailableError(f"the metric reads logits; {a.lm_head_note or 'this model has no LM head'}")
    reference_trace(trace, reference, "patch", what)


def reference_trace(trace, reference, mode: str, what: str = "each write"):
    """The trace whose writes replace: ``reference`` (checked) or, without one, ``trace``.

    ``what`` names what is patched in the messages ("the stream").
    """
    if reference is None:
        if mode == "patch":
            raise InputError("mode='patch' takes each write from a reference run: "
                             "reference=rs.trace(model, corrupted_texts), as many tokens as the trace")
        return trace
    if mode == "zero":
        raise InputError("reference gives the means of mode='mean' or the values of mode='patch'; "
                         "mode='zero' uses none")
    if not hasattr(reference, "captured") or not hasattr(reference, "model"):
        raise InputError("reference is a trace of the same loaded model, e.g. "
                         f"rs.trace(model, other_texts), not {type(reference).__name__}")
    if reference.model is not trace.model:
        raise InputError("reference is a trace of another loaded model object (a second rs.load, "
                         "or another model): trace both with the same model")
    if mode == "patch" and reference.tokens.shape != trace.tokens.shape:
        raise InputError(f"patching takes {what} at the same position: the reference is "
                         f"{list(reference.tokens.shape)} tokens [batch, pos], the trace "
                         f"{list(trace.tokens.shape)}; give both texts of the same token length")
    if mode == "patch" and not torch.equal(reference.attention_mask.cpu(), trace.attention_mask.cpu()):
        rows = (trace.attention_mask != reference.attention_mask.to(trace.attention_mask.device)).any(1)
        row = int(rows.nonzero()[0, 0])
        mine, theirs = (int(t.attention_mask[row].sum()) for t in (trace, reference))
        raise InputError(f"patching takes {what} at the same position, real tokens only: row {row} "
                         f"is {mine} real tokens in the trace and {theirs} in the reference (a pad's "
                         "write would be patched in); give each row texts of the same token length")
    return reference


def position_mask(trace, positions) -> Tensor | None:
    """``[batch, pos]`` bool: where writes are replaced (None: everywhere).

    ``positions``: indices into each row's real tokens (negative from its last real token:
    ``-1`` is each row's last), one or a list; or a ``[batch, pos]`` bool tensor.
    """
    if positions is None:
        return None
    mask = trace.attention_mask.bool().cpu()
    if isinstance(positions, Tensor) and positions.dtype == torch.bool:
        if positions.shape != mask.shape:
            raise InputError(f"positions as a mask is bool [batch, pos] = {list(mask.shape)}, not "
                             f"{list(positions.shape)}")
        return positions.cpu() & mask
    items = [positions] if as_index(positions) is not None else positions
    try:
        index = [as_index(p) for p in items]
    except TypeError:
        index = [None]
    if not index or None in index:
        raise InputError("positions are token indices in each row (-1: its last real token), one or "
                         f"a list, or a bool mask [batch, pos]; not {positions!r}")
    lengths = mask.sum(1)
    out = torch.zeros_like(mask)
    for i in index:
        i_in = max(min(i, mask.shape[1]), -mask.shape[1] - 1)  # out of range either way, not overflowing
        at = lengths + i_in if i < 0 else torch.full_like(lengths, i_in)
        if bool(((at < 0) | (at >= lengths)).any()):
            raise InputError(f"position {i} is outside a row of {int(lengths.min())} real tokens: use "
                             f"-{int(lengths.min())}..{int(lengths.min()) - 1}, or a bool mask")
        out[torch.arange(len(at)), at] = True
    return out


def checked_metric(metric: object) -> None:
    """``InputError`` unless ``metric`` is a function (of the logits)."""
    if not callable(metric):
        raise InputError(f"metric is a function of the logits, e.g. lambda logits: logits[0, -1, 5], "
                         f"not a {type(metric).__name__}")


def _numbers(got: object) -> Tensor | None:
    """A metric's result as float64 (detached), or None when it is not numbers."""
    if isinstance(got, Tensor):
        got = got.detach()  # a metric through a parameter of the user's
    if isinstance(got, complex) or isinstance(got, Tensor) and got.is_complex():
        return None  # its imaginary part would be dropped
    try:
        return torch.as_tensor(got, dtype=torch.float64)
    except (TypeError, ValueError, RuntimeError):
        return None


def metric_values(metric: Callable[[Tensor], Tensor | float], logits: Tensor, rows: int,
                  expect: int | None = None) -> Tensor:
    """``metric(logits)`` as float64 ``[1]`` (one number) or ``[rows]`` (one per text).

    ``expect``: the count a first call returned (a metric must keep to one form); else
    ``InputError`` saying what to return. The first call's (the clean run's) values must not be
    all NaN or infinite: every effect is measured from them (a text whose value is NaN has NaN
    results).
    """
    got = metric(logits)
    value = _numbers(got)
    ok = value is not None and (value.numel() == 1 or tuple(value.shape) == (rows,))
    if not ok or (expect is not None and value.numel() != expect):
        shape = type(got).__name__ if value is None else tuple(value.shape)
        raise InputError("metric takes the logits [batch, pos, vocab] and returns one number, or one per "
                         f"text ([{rows}]) for per-text results, every call the same; it returned {shape}")
    if expect is None and not bool(value.isfinite().any()):
        raise InputError(f"metric returned {value.reshape(-1)[:4].tolist()} on the clean logits: every "
                         "effect is measured from that value, so it must be finite (for one text at least); "
                         "check the metric (a log of 0, a division by 0, a NaN logit)")
    return value.reshape(-1)


class NoGapWarning(UserWarning):
    """The metric gave the reference run the clean run's value: every share of the way is NaN."""


def reference_metric(metric: Callable[[Tensor], Tensor | float], logits: Tensor, rows: int,
                     clean: Tensor) -> Tensor:
    """``metric_values`` on the reference run's ``logits``, checked against the clean run's ``clean``.

    Where they are equal for every text there is no difference to locate: each share of the way
    from clean to reference (``metric_share``) is NaN, so a ``NoGapWarning`` says why, and what
    a metric that returns a constant, or reads only logits where the two texts agree, gives.
    """
    values = metric_values(metric, logits, rows, len(clean))
    if torch.equal(values, clean):
        shown = ", ".join(f"{v:.6g}" for v in clean[:4].tolist()) + (", …" if len(clean) > 4 else "")
        warnings.warn(f"the metric gives the reference run the clean run's value ({shown}), so every "
                      "metric_share is NaN: check that it reads the logits where the two texts differ "
                      "(a metric returning a constant reads none)", NoGapWarning, stacklevel=3)
    return values


PER_TEXT = ("per-text results need a metric returning one value per text ([batch]), e.g. "
            "logits[rows, last, a] - logits[rows, last, b] without .mean()")


def text_shares(values: Tensor | None, clean: Tensor | None, reference: Tensor | None) -> Tensor:
    """Each text's ``(values − clean) / (reference − clean)``, ``values [..., batch]``.

    NaN where a text's two runs agree; ``InputError`` (``PER_TEXT``) when ``values`` is None
    (the metric returned one number for all texts).
    """
    if values is None:
        raise InputError(PER_TEXT)
    gap = reference - clean
    return (values - clean) / gap.where(gap != 0, torch.nan)
