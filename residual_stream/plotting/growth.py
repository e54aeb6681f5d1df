"""Norm growth and relative update sizes against depth."""

from __future__ import annotations

import numpy as np
import plotly.graph_objects as go

from .labels import escape


def norm_growth_figure(result, *, relative_depth: bool = False, name: str = "") -> go.Figure:
    """Mean and median stream norm with a 5–95 % band, and the first token separately."""
    n = len(result.mean)
    x = [i / (n - 1) for i in range(n)] if relative_depth else list(range(n))
    label = escape(name or result.model_name)
    fig = go.Figure([
        go.Scatter(x=x + x[::-1], y=list(result.p95.numpy()) + list(result.p5.numpy())[::-1],
                   fill="toself", line={"width": 0}, opacity=0.25, name=f"{label} 5–95 %",
                   hoverinfo="skip"),
        go.Scatter(x=x, y=result.mean.numpy(), name=f"{label} mean", mode="lines+markers"),
        go.Scatter(x=x, y=result.median.numpy(), name=f"{label} median", line={"dash": "dot"}),
        go.Scatter(x=x, y=result.first_token.numpy(), name=f"{label} first token",
                   line={"dash": "dash"}),
    ])
    fig.update_layout(
        title=f"Stream norm by depth (fit: ×{result.fit_growth:.3f} per layer, R² {result.fit_r2:.2f})",
        xaxis_title="relative depth" if relative_depth else "point (stream entering block L)",
        yaxis_title="‖x‖ (L2 norm)", yaxis_type="log", hovermode="x unified")
    return fig


def update_size_figure(result, *, relative_depth: bool = False, name: str = "") -> go.Figure:
    """Relative update ``‖write‖ / ‖stream before it‖`` of every attention and MLP."""
    n = len(result.update_attn)
    x = [(i + 0.5) / n for i in range(n)] if relative_depth else list(range(n))
    label = escape(name or result.model_name)
    fig = go.Figure([
        go.Scatter(x=x, y=result.update_attn.numpy(), name=f"{label} attention", mode="lines+markers"),
        go.Scatter(x=x, y=result.update_mlp.numpy(), name=f"{label} MLP", mode="lines+markers"),
    ])
    fig.update_layout(title="Relative update size", yaxis_type="log",
                      xaxis_title="relative depth" if relative_depth else "layer",
                      yaxis_title="‖write‖ / ‖stream before it‖", hovermode="x unified")
    return fig


KL_ROUNDING = 1e-6  # nats: a scan's KL below this is float32 rounding (the model's own output)


def lens_depth_figure(summary, *, name: str = "") -> go.Figure:
    """The logit lens against depth from its per-point summary (a scan's ``lens`` result).

    KL to the final distribution with a band of ±2 standard errors clustered by text
    (``kl_se_texts``; on the log axis its lower edge is floored at a tenth of the KL), and
    top-1 agreement on the right axis. Over one text the error is unknown and the band is
    left out (zero width). Points whose KL is 0 but for rounding (``KL_ROUNDING``; the final
    one, the model's own output) are left off the log axis, where 0 cannot be drawn.
    """
    shown = summary["kl"].to_numpy() > KL_ROUNDING  # the final point's is 0 but for rounding
    x = list(summary["point"][shown])
    kl = summary["kl"].to_numpy()[shown]
    se = np.nan_to_num(summary["kl_se_texts"].to_numpy()[shown])  # NaN over one text: no band
    low = np.maximum(kl - 2 * se, kl / 10)
    label = escape(name)
    fig = go.Figure([
        go.Scatter(x=x + x[::-1], y=list(kl + 2 * se) + list(low)[::-1], fill="toself",
                   line={"width": 0}, opacity=0.25, name=f"{label} KL ± 2 s.e.", hoverinfo="skip"),
        go.Scatter(x=x, y=kl, name=f"{label} KL(final ‖ lens)", mode="lines+markers"),
        go.Scatter(x=list(summary["point"]), y=summary["top1_agreement"],
                   name=f"{label} top-1 agreement", yaxis="y2", line={"dash": "dot"}),
    ])
    fig.update_layout(title="Logit lens over the corpus", xaxis_title="point (stream entering block L)",
                      yaxis={"title": "KL (nats)", "type": "log"}, hovermode="x unified",
                      yaxis2={"title": "top-1 agreement", "overlaying": "y", "side": "right",
                              "range": [0, 1]})
    return fig
