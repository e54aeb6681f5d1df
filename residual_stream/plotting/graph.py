"""The read-write graph: components by layer, edges weighted by read attribution."""

from __future__ import annotations

import pandas as pd
import plotly.graph_objects as go

from .labels import escape

EMBED_Y = {"embed": 0.5, "pos_embed": 0.0, "type_embed": 1.0}  # at x = -1, one point each
BIAS_Y = -0.5  # a block's norm biases (post-norm, sandwich): a row of their own


def _position(node: str, n_layers: int) -> tuple[float, float]:
    """Attention at (L, 0), MLP at (L + ½, 1), a norm's bias below, after its sublayer."""
    if not node.startswith("L"):
        return -1.0, EMBED_Y.get(node, 0.5)
    layer, _, kind = node.partition(".")
    if kind in ("attn", "mlp"):
        return int(layer[1:]) + (0.5 if kind == "mlp" else 0.0), 1.0 if kind == "mlp" else 0.0
    return int(layer[1:]) + (0.75 if "mlp" in kind else 0.25), BIAS_Y


def read_write_graph(matrix: pd.DataFrame, *, threshold: float = 0.05,
                     highlight: str | None = None, title: str = "Read-write graph") -> go.Figure:
    """Components by layer, with an edge ``source → reader`` wherever ``|share| ≥ threshold``.

    Nodes sit at x = layer (attention below, MLPs above, norm biases under both, embeddings
    at -1, each at its own height); edge width follows
    the mean |share| of ``source`` in ``reader``'s read. ``highlight`` colors the edges into and
    out of one node (whom it reads from, who reads it).
    """
    n_layers = 1 + max((int(n[1:].split(".")[0]) for n in matrix.index if n.startswith("L")),
                       default=0)
    nodes = list(dict.fromkeys([*matrix.columns, *matrix.index]))
    nodes = [n for n in nodes if n.startswith(("L", "embed", "pos_embed", "type_embed"))]
    xy = {n: _position(n, n_layers) for n in nodes}
    traces = []
    for reader in matrix.index:
        for source in matrix.columns:
            w = float(matrix.at[reader, source])
            if abs(w) < threshold or source not in xy or reader not in xy:
                continue
            hot = highlight in (reader, source)
            (x0, y0), (x1, y1) = xy[source], xy[reader]
            traces.append(go.Scatter(
                x=[x0, x1], y=[y0, y1], mode="lines", showlegend=False,
                line={"width": 1 + 8 * min(abs(w), 1), "color": "crimson" if hot else "gray"},
                opacity=0.9 if hot else 0.35,
                hovertemplate=f"{escape(source)} → {escape(reader)}: {w:.3f}<extra></extra>"))
    traces.append(go.Scatter(
        x=[xy[n][0] for n in nodes], y=[xy[n][1] for n in nodes],
        mode="markers+text" if len(nodes) <= 24 else "markers",  # labels collide beyond that
        text=[escape(n) for n in nodes], textposition="top center", showlegend=False,
        marker={"size": 14, "color": ["crimson" if n == highlight else "steelblue" for n in nodes]},
        customdata=nodes, hovertemplate="%{customdata}<extra></extra>"))
    fig = go.Figure(traces)
    fig.update_layout(title=f"{title} (edges with mean |share| ≥ {threshold:g})",
                      xaxis_title="layer", yaxis={"tickvals": [BIAS_Y, 0, 0.5, 1],
                                                  "ticktext": ["norm biases", "attention",
                                                               "embeddings", "MLP"]})
    return fig
