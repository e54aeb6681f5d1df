"""Walk the stream program over the stream itself (not over contributions).

Cheaper than a decomposition: one running ``[batch, pos, d_model]`` tensor. At each
operation it reports the stream as that operation sees it, and for an ``Add`` the write
before and after its own norm (sandwich models). At every ``Mark`` the running stream is
reset to the captured one, so each step is local to its block and rounding never
accumulates across blocks. Used by the conservation checks and by norm-growth measures.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch
from torch import Tensor

from .program import Add, Embed, Mark, Norm, Op, Read, Scale

if TYPE_CHECKING:
    from .capture import Captured
    from .trace import Trace


@dataclass(frozen=True, eq=False)
class Step:
    """The stream ``x`` as ``op`` sees it; for ``Add``, the write as produced and as added.

    For ``Embed``, ``write`` and ``added`` are the embedding.
    """

    op: Op
    x: Tensor
    write: Tensor | None = None
    added: Tensor | None = None


def component_of(name: str) -> tuple[int, str]:
    """``"L3.mlp"`` → ``(3, "mlp")``."""
    layer, kind = name.split(".", 1)
    return int(layer[1:]), kind


def walk_stream(trace: Trace, captured: Captured | None = None) -> Iterator[Step]:
    """Yield a ``Step`` per program operation (see the module docstring)."""
    cap = captured or trace.captured
    yield from walk_ops(trace.anatomy.program, torch.zeros_like(cap.resid[0]), cap,
                        trace.anatomy.norms, trace.attn_write)


def walk_ops(ops, x: Tensor, cap: Captured, norms: dict, attn_write: Callable[[int], Tensor]
             ) -> Iterator[Step]:
    """Walk ``ops`` (a whole program or one block's segment) from the stream ``x``.

    ``attn_write(layer)`` gives an attention's output (from per-head writes, or captured
    whole); everything else comes from ``cap``.
    """
    for op in ops:
        if isinstance(op, Add):
            layer, kind = component_of(op.component)
            w = attn_write(layer) if kind == "attn" else cap.mlp_out[layer]
            added = w if op.via is None else norms[op.via].apply_frozen(w, cap.norm_scale[op.via])
            yield Step(op, x, w, added)
            x = x + added
            continue
        if isinstance(op, Embed):
            e = cap.embeds[op.label]
            yield Step(op, x, e, e)
            x = x + e
            continue
        yield Step(op, x)
        if isinstance(op, Norm):
            x = norms[op.norm].apply_frozen(x, cap.norm_scale[op.norm])
        elif isinstance(op, Scale):
            x = x * op.alpha
        elif isinstance(op, Mark) and op.point != "final":
            x = cap.resid[op.point]


def read_inputs(trace: Trace, captured: Captured | None = None) -> dict[str, Tensor]:
    """What every component reads: the stream at its read point through its norm (frozen scale)."""
    cap = captured or trace.captured
    out = {}
    for step in walk_stream(trace, cap):
        if isinstance(step.op, Read):
            norm = step.op.norm
            out[step.op.component] = step.x if norm is None else \
                trace.anatomy.norms[norm].apply_frozen(step.x, cap.norm_scale[norm])
    return out
