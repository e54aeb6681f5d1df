"""Walk the stream program over the stream itself (not over contributions).

Cheaper than a decomposition: one running ``[batch, pos, d_model]`` stream. At each
operation it reports the stream as that operation sees it, and for an ``Add`` the write
before and after its own norm (sandwich models). At every ``Mark`` the running stream is
reset to the captured one, so each step is local to its block and rounding never
accumulates across blocks. Used by the conservation checks and by norm-growth measures.

The running stream is kept as a sum not yet made (``Step.terms``: the stream at the last
``Mark``, then each write added since): ``Step.x`` adds the terms up when something reads it,
in order, once per step, so a walk whose consumers read only norms never writes a
``[batch, pos, d_model]`` sum (``streaming.growth`` reduces the terms in one fused kernel).

The captured tensors are float32, except on a lean pass whose reducers take the model's own
16-bit tensors (``lean.lean_forward``): there every addition, norm and scale of the walk is
still computed in float32 (``total``, ``wide``), so the steps are the same numbers.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

import torch
from torch import Tensor

from .fusion import WIDE, fused, wide
from .program import Add, Embed, Mark, Norm, Op, Read, Scale

if TYPE_CHECKING:
    from .capture import Captured
    from .trace import Trace

MAX_TERMS = 4  # a longer pending sum (a program with many writes between marks) is made then
Reset = Literal["marks", "norms", "none"]  # where a walk goes on from the captured stream


def summed(terms: Sequence[Tensor]) -> Tensor:
    """``terms[0] + terms[1] + …`` left to right, each addition in at least float32.

    Pure tensor code: what ``total`` runs, and what a fused reduction of the terms inlines.
    """
    return functools.reduce(lambda a, b: wide(a) + wide(b), terms)


_summed16 = fused(lambda *terms: summed(terms))


def total(terms: Sequence[Tensor]) -> Tensor:
    """``summed(terms)``; with a 16-bit term, in one kernel on a GPU."""
    if len(terms) == 1 or all(t.dtype in WIDE for t in terms):
        return summed(terms)
    return _summed16(*terms)


def plus(x: Tensor, w: Tensor) -> Tensor:
    """``x + w`` in at least float32: a 16-bit operand is widened (in the same kernel on a GPU)."""
    return total((x, w))


class Pending:
    """A stream held as a sum not yet made: ``terms``, added up by ``value()`` once, on demand."""

    __slots__ = ("_terms", "_value")

    def __init__(self, terms: Sequence[Tensor]) -> None:
        self._terms, self._value = tuple(terms), None

    @property
    def terms(self) -> tuple[Tensor, ...]:
        """What the sum is made of (one term, the sum itself, once ``value()`` has run)."""
        return self._terms if self._value is None else (self._value,)

    def value(self) -> Tensor:
        """``total(terms)``, computed on the first call and kept."""
        if self._value is None:
            self._value = total(self._terms)
        return self._value

    def plus(self, w: Tensor) -> Pending:
        """This sum with ``w`` added last (made first, past ``MAX_TERMS`` terms)."""
        terms = self.terms
        return Pending((*terms, w) if len(terms) < MAX_TERMS else (self.value(), w))


@dataclass(frozen=True, eq=False)
class Step:
    """The stream as ``op`` sees it; for ``Add``, the write as produced and as added.

    ``x`` is the stream (made from ``stream``'s terms on first read, shared by the steps that
    see the same stream); ``terms`` what it is the sum of. For ``Embed``, ``write`` and
    ``added`` are the embedding.
    """

    op: Op
    stream: Pending
    write: Tensor | None = None
    added: Tensor | None = None

    @property
    def x(self) -> Tensor:
        """The stream ``op`` sees."""
        return self.stream.value()

    @property
    def terms(self) -> tuple[Tensor, ...]:
        """``x`` as a sum not yet made (left to right, as ``total`` adds them)."""
        return self.stream.terms


def component_of(name: str) -> tuple[int, str]:
    """``"L3.mlp"`` → ``(3, "mlp")``."""
    layer, kind = name.split(".", 1)
    return int(layer[1:]), kind


HEAD = re.compile(r"L(0|[1-9][0-9]*)H(0|[1-9][0-9]*)")  # a head's label, as contributions spell it


def head_of(name: object, channel: bool = False) -> tuple[int, int, str | None] | None:
    """``"L3H5"`` → ``(3, 5, None)``; with ``channel``, ``"L3H5.k"`` → ``(3, 5, "k")`` too; else None.

    Spelled exactly as labels are (no leading zeros, ASCII digits), so a name that parses
    is one a result can hold.
    """
    if not isinstance(name, str):
        return None
    m = re.fullmatch(HEAD.pattern + (r"(?:\.([qkv]))?" if channel else ""), name)
    return None if m is None else (int(m[1]), int(m[2]), m[3] if channel else None)


def walk_stream(trace: Trace, captured: Captured | None = None, *, reset: Reset = "marks"
                ) -> Iterator[Step]:
    """Yield a ``Step`` per program operation (see the module docstring).

    ``captured``: another pass of the trace's batch (default the trace's own); every write
    comes from it, each attention's from its per-head ``z`` or, for a pass captured with
    ``heads=False``, from its output projection's output (what an intervention hook on it
    returned). ``reset="none"``: never go on from a captured stream, so the walk is the
    program run over the captured writes alone, in float32 (what a decomposition sums to).
    ``"norms"``: also after every whole-stream norm, from its captured input, so each step is
    local to one operation and a 16-bit model's rounding, which a norm can magnify, never
    carries over.
    """
    cap = captured or trace.captured
    if not cap.z:  # attention outputs kept whole
        attn_write = cap.attn_out.__getitem__
    else:  # from heads: the trace's own views, over this pass
        over = trace if cap is trace.captured else type(trace)(trace.model, trace.batch, cap)
        attn_write = over.attn_write
    yield from walk_ops(trace.anatomy.program, torch.zeros_like(cap.resid[0]), cap,
                        trace.anatomy.norms, attn_write, reset=reset)


def final_stream(steps: Iterable[Step]) -> Tensor:
    """The stream after the final norm (at ``Mark("final")``), from a walk's steps."""
    return next(s.x for s in steps if isinstance(s.op, Mark) and s.op.point == "final")


def walk_ops(ops, x: Tensor, cap: Captured, norms: dict, attn_write: Callable[[int], Tensor],
             *, reset: Reset = "marks") -> Iterator[Step]:
    """Walk ``ops`` (a whole program or one block's segment) from the stream ``x``.

    ``attn_write(layer)`` gives an attention's output (from per-head writes, or captured
    whole); everything else comes from ``cap``. ``reset``: where to go on from the captured
    stream (``walk_stream``).
    """
    stream = Pending((x,))
    for op in ops:
        if isinstance(op, (Add, Embed)):
            if isinstance(op, Add):
                layer, kind = component_of(op.component)
                w = attn_write(layer) if kind == "attn" else cap.mlp_out[layer]
                added = w if op.via is None else \
                    norms[op.via].apply_frozen(wide(w), cap.norm_scale[op.via])
            else:
                w = added = cap.embeds[op.label]
            yield Step(op, stream, w, added)
            stream = stream.plus(added)
            continue
        yield Step(op, stream)
        if isinstance(op, Norm):
            before = cap.norm_in[op.norm] if reset == "norms" and not norms[op.norm].constant else \
                stream.value()  # (a multiplier has no module, no captured input)
            stream = Pending((norms[op.norm].apply_frozen(wide(before), cap.norm_scale[op.norm]),))
        elif isinstance(op, Scale):
            stream = Pending((wide(stream.value()) * op.alpha,))
        elif isinstance(op, Mark) and op.point != "final" and reset != "none":
            stream = Pending((cap.resid[op.point],))


def read_inputs(trace: Trace, captured: Captured | None = None) -> dict[str, Tensor]:
    """What every component reads: the stream at its read point through its norm (frozen scale).

    ``captured`` as in ``walk_stream``.
    """
    cap = captured or trace.captured
    out = {}
    for step in walk_stream(trace, cap):
        if isinstance(step.op, Read):
            norm = step.op.norm
            out[step.op.component] = step.x if norm is None else \
                trace.anatomy.norms[norm].apply_frozen(step.x, cap.norm_scale[norm])
    return out
