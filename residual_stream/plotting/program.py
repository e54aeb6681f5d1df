"""The stream program as a diagram: the residual stream as a line, each operation on it a mark."""

from __future__ import annotations

import plotly.graph_objects as go

from ..program import Add, Embed, Mark, Norm, Read, Scale
from .labels import escape

STYLE = {  # op type -> (marker symbol, color, y offset, legend name)
    Embed: ("circle", "gray", 0.0, "embedding added"),
    Read: ("triangle-up", "royalblue", 0.6, "component reads (through its norm)"),
    Add: ("circle", "seagreen", -0.6, "write added (through its norm)"),
    Norm: ("square", "crimson", 0.0, "stream normalized"),
    Scale: ("diamond", "orange", 0.0, "stream scaled (α)"),
}


def _text(op) -> str:
    if isinstance(op, Embed):
        return f"x += {op.label}"
    if isinstance(op, Read):
        return f"{op.component} reads {op.norm or 'the raw stream'}"
    if isinstance(op, Add):
        return f"x += {op.via + '(' + op.component + ')' if op.via else op.component}"
    if isinstance(op, Norm):
        return f"x = {op.norm}(x)"
    return f"x = {op.alpha:.3g}·x"


def program_figure(anatomy, *, max_blocks: int = 3) -> go.Figure:
    """The first ``max_blocks`` blocks (and the end) of ``anatomy``'s stream program.

    An operation's block is where it stands, between ``Mark(L)`` and ``Mark(L + 1)`` (a
    DeepNorm ``Scale`` names none); before ``Mark(0)`` and after the last block is shown.
    """
    ops = [op for op, block in zip(anatomy.program, _blocks(anatomy.program), strict=True)
           if not isinstance(op, Mark) and (block < max_blocks or block == anatomy.n_layers)]
    fig = go.Figure(go.Scatter(x=[0, len(ops) + 1], y=[0, 0], mode="lines", hoverinfo="skip",
                               line={"color": "black", "width": 3}, name="residual stream"))
    for kind, (symbol, color, y, name) in STYLE.items():
        xs = [i + 1 for i, op in enumerate(ops) if isinstance(op, kind)]
        if not xs:
            continue
        texts = [escape(_text(ops[i - 1])) for i in xs]
        fig.add_trace(go.Scatter(x=xs, y=[y] * len(xs), mode="markers+text", name=name,
                                 marker={"symbol": symbol, "size": 16, "color": color},
                                 text=[escape(ops[i - 1].component) if kind in (Read, Add) else t
                                       for i, t in zip(xs, texts, strict=True)],
                                 textposition="top center" if y >= 0 else "bottom center",
                                 hovertext=texts, hoverinfo="text"))
        for x in xs:
            fig.add_shape(type="line", x0=x, x1=x, y0=0, y1=y, line={"color": color, "dash": "dot"})
    shown = min(max_blocks, anatomy.n_layers)
    fig.update_layout(title=f"Stream program ({anatomy.placement}, {anatomy.norm_kind}; first "
                            f"{shown} of {anatomy.n_layers} blocks)",
                      xaxis={"visible": False}, yaxis={"visible": False, "range": [-1.3, 1.3]},
                      height=360, legend={"orientation": "h"})
    return fig


def _blocks(program) -> list[int]:
    """Each operation's block by position: ``L`` after ``Mark(L)``; -1 before the first."""
    out, block = [], -1
    for op in program:
        if isinstance(op, Mark) and isinstance(op.point, int):
            block = op.point
        out.append(block)
    return out
