"""Heatmaps: any labelled matrix, survival, and the logit lens."""

from __future__ import annotations

import numpy as np
import pandas as pd
import plotly.graph_objects as go

from ..analyses.composition import TITLES
from ..errors import InputError, as_index, check_choice
from .labels import escape, readable, token_labels


def heatmap(frame: pd.DataFrame, *, title: str, x_title: str, y_title: str,
            colorbar: str = "", diverging: bool = False) -> go.Figure:
    """A heatmap of ``frame`` (rows → y, columns → x), labels escaped."""
    z = frame.to_numpy(dtype=float)
    limit = np.nanmax(np.abs(z)) if diverging and np.isfinite(z).any() else None
    fig = go.Figure(go.Heatmap(
        z=z, x=[escape(c) for c in frame.columns], y=[escape(r) for r in frame.index],
        colorscale="RdBu" if diverging else "Viridis", zmid=0 if diverging else None,
        zmin=-limit if limit else None, zmax=limit, colorbar={"title": colorbar},
        hovertemplate=f"{y_title}: %{{y}}<br>{x_title}: %{{x}}<br>{colorbar}: %{{z:.4g}}<extra></extra>"))
    fig.update_layout(title=title, xaxis_title=x_title, yaxis_title=y_title,
                      yaxis_autorange="reversed")
    return fig


def survival_figure(result, measure: str = "retention") -> go.Figure:
    """Survival of every write across later points: ``retention``, ``share`` or ``norm``."""
    frame = pd.DataFrame(getattr(result, measure).numpy(), index=list(result.sources))
    units = {"retention": "norm now / norm when added", "share": "signed share of ‖x‖²",
             "norm": "‖contribution‖"}
    return heatmap(frame, title=f"Survival of each write ({measure})",
                   x_title="point (stream entering block L)", y_title="write",
                   colorbar=units[measure], diverging=measure == "share")


def lens_figure(result, batch: int, str_tokens: list[str]) -> go.Figure:
    """Logit lens for one text: KL to the final distribution per point and token, top tokens."""
    n = int(result.attention_mask[batch].sum())
    kl = result.kl[:, batch, :n].numpy()
    text = [[escape(t) for t in row[:n]] for row in (p[batch] for p in result.top_tokens)]
    fig = go.Figure(go.Heatmap(
        z=kl, x=token_labels(str_tokens[:n]), y=list(range(kl.shape[0])), text=text,
        texttemplate="%{text}", colorscale="Viridis_r", colorbar={"title": "KL (nats)"},
        hovertemplate="point %{y}<br>%{x}<br>lens top-1: %{text}<br>KL %{z:.3f}<extra></extra>"))
    fig.update_layout(title="Logit lens: top-1 token and KL(final ‖ lens)",
                      xaxis_title="token", yaxis_title="point (stream entering block L)")
    return fig


def patching_figure(result, measure: str = "share") -> go.Figure:
    """Stream patching per stream point (rows) and token (columns, the first text's).

    ``measure``: ``"share"``, the metric's part of the way from the clean run's value to the
    reference's, or ``"change"``, its difference from the clean run's.
    """
    check_choice("measure", measure, ("share", "change"))
    z = result.share() if measure == "share" else result.metric - result.metric_clean
    labels = [f"{p} {escape(readable(t))}" for p, t in zip(result.positions, result.tokens, strict=True)]
    title = ("Patching the stream: share of the way to the reference run's metric" if measure == "share"
             else "Patching the stream: change of the metric from the clean run")
    if getattr(result, "method", "patch") == "attribution":
        title += " (estimated to first order: attribution patching)"
    fig = go.Figure(go.Heatmap(
        z=z.numpy(), x=labels, y=list(result.points), colorscale="RdBu", zmid=0,
        colorbar={"title": "share" if measure == "share" else "Δ metric"},
        hovertemplate="point %{y}<br>token %{x}<br>%{z:.3f}<extra></extra>"))
    fig.update_layout(title=title, xaxis_title="token patched", yaxis_title="point (stream entering block L)",
                      yaxis_autorange="reversed")
    return fig


def path_patching_figure(result, measure: str = "share", top: int | None = 30) -> go.Figure:
    """Path patching: each sender (rows) into each receiver (columns).

    ``measure``: ``"share"`` (the part of the way from the clean run's metric to the
    reference's) or ``"change"`` (the metric's change). ``top``: only the senders whose
    largest ``|value|`` over receivers is among the ``top`` largest, in the result's order
    (None: all). A pair without a path (``connected`` False) is blank.
    """
    check_choice("measure", measure, ("share", "change"))
    if top is not None and (as_index(top) is None or as_index(top) < 1):
        raise InputError(f"top is how many senders to show (1 or more), or None for all; not {top!r}")
    z = (result.share() if measure == "share" else result.metric - result.metric_clean).numpy()
    z = np.where(result.connected.numpy(), z, np.nan)
    rows = np.arange(len(z))
    if top is not None and top < len(z):
        largest = np.nan_to_num(np.abs(z), nan=-1.0).max(1)
        rows = np.sort(np.argsort(-largest, kind="stable")[:top])
    frame = pd.DataFrame(z[rows], index=[result.senders[i] for i in rows], columns=list(result.receivers))
    shown = "" if len(rows) == len(z) else f", the {len(rows)} largest of {len(z)} senders"
    fig = heatmap(frame, title=f"Path patching: {measure} of the metric{shown}", x_title="receiver",
                  y_title="sender", colorbar="share" if measure == "share" else "Δ metric", diverging=True)
    fig.update_layout(height=max(400, 160 + 22 * len(rows)))
    return fig


def composition_figure(result, kind: str = "k", level: str = "layer", *, name: str = "") -> go.Figure:
    """Composition scores of one ``kind``, readers (rows) × writers (columns) (``Composition.matrix``).

    ``level="layer"``: the largest score of each pair of layers. Blank where the reader reads
    before the write is added. The title gives the random baseline, against which a score is
    read, whether the norms between writer and reader are folded in (``through_norms``), and
    ``name`` (a model's label) if given.
    """
    frame = result.matrix(kind, level)
    folded = "writes as they reach the reader" if result.through_norms else "weights alone"
    reduced = ", largest per layer pair" if level == "layer" else ""
    fig = heatmap(frame, title=f"{TITLES[kind]} composition{reduced} "
                               f"({folded}; random baseline {result.baseline[kind]:.3f})"
                               + (f": {escape(name)}" if name else ""),
                  x_title="writer", y_title="reader", colorbar="score")
    if level == "head":
        fig.update_layout(height=max(400, 160 + 4 * len(frame)))
    return fig
