"""Stacked and ranked bars: a write split into subspaces; contributions to a logit or stream."""

from __future__ import annotations

import plotly.graph_objects as go
from torch import Tensor

from .labels import escape


def subspace_bars(names: tuple[str, ...], fractions: Tensor, labels: list[str], *,
                  title: str) -> go.Figure:
    """Stacked bars: ``fractions [bar, part]`` (each row sums to 1) for each labelled bar."""
    fig = go.Figure([
        go.Bar(name=escape(name), x=[escape(x) for x in labels], y=fractions[:, i].numpy(),
               hovertemplate=f"{escape(name)}: %{{y:.3%}}<extra></extra>")
        for i, name in enumerate(names)])
    fig.update_layout(barmode="stack", title=title, yaxis_title="fraction of the write's energy",
                      yaxis_range=[0, 1], xaxis_title="write / token")
    return fig


def contribution_bars(frame, value: str, *, title: str, top: int = 20, unit: str = "") -> go.Figure:
    """The ``top`` contributions by ``|value|`` from a frame with a ``label`` column."""
    f = frame.reindex(frame[value].abs().sort_values(ascending=False).index).head(top)
    fig = go.Figure(go.Bar(x=f[value], y=[escape(x) for x in f["label"]], orientation="h",
                           hovertemplate="%{y}: %{x:.4g}<extra></extra>"))
    fig.update_layout(title=title, xaxis_title=unit or value, yaxis_title="contribution",
                      yaxis_autorange="reversed", yaxis_dtick=1,  # every bar labelled
                      height=max(400, 160 + 22 * len(f)))
    return fig


def patching_bars(frame, *, title: str) -> go.Figure:
    """Grouped bars per write (``label``): its ``estimated`` and ``measured`` metric change.

    ``measured`` only if the frame has that column (NaN where a write was not measured).
    """
    fig = go.Figure()
    for column in ("estimated", "measured"):
        if column in frame:
            fig.add_trace(go.Bar(name=column, x=frame[column], y=[escape(x) for x in frame["label"]],
                                 orientation="h",
                                 hovertemplate=f"%{{y}} {column}: %{{x:.4g}}<extra></extra>"))
    fig.update_layout(title=title, xaxis_title="change of the metric", yaxis_title="write patched",
                      yaxis_autorange="reversed", yaxis_dtick=1, barmode="group",
                      height=max(400, 160 + 26 * len(frame)))
    return fig
