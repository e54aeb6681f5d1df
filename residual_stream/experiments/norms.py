"""Experiment 5: LayerNorm against RMSNorm: invariances, checked; speed, measured.

LayerNorm is invariant to re-centering (adding ``c·1``) and re-scaling (``x → a·x``); RMSNorm
only to re-scaling. Both are checked numerically on random inputs (max abs change of the
output), at the same ε: at ε 0 the invariances are exact; at ε 1e-5 re-scaling changes both
norms' outputs alike (about 2e-5), as ε inside the root does not scale.

Speed: ``torch.nn.LayerNorm`` against ``torch.nn.RMSNorm`` on ``[tokens, d]`` inputs, eager
and (when asked) ``torch.compile``, on the CPU and on the GPU when there is one,
timed side by side in this process (median of repeats). The source article quotes RMSNorm
7–64 % faster, about 15 % in a modern GPU transformer; here it is reported, never asserted.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import pandas as pd
import plotly.graph_objects as go
import torch


@dataclass(frozen=True, eq=False)
class NormComparison:
    """Invariance errors and timings."""

    invariances: pd.DataFrame
    timings: pd.DataFrame

    def to_frame(self) -> pd.DataFrame:
        """The timings table (``device, mode, d_model, layernorm_ms, rmsnorm_ms, speedup``)."""
        return self.timings

    def figure(self) -> go.Figure:
        """RMSNorm's speed-up over LayerNorm per setting."""
        t = self.timings
        fig = go.Figure(go.Bar(x=[f"{r.device} {r.mode} d={r.d_model}" for r in t.itertuples()],
                               y=t.speedup, hovertemplate="%{x}: ×%{y:.2f}<extra></extra>"))
        fig.update_layout(title="RMSNorm speed-up over LayerNorm (time LN / time RMS)",
                          yaxis_title="speed-up", xaxis_title="setting")
        return fig


INVARIANCE_EPS = (1e-5, 0.0)  # as models use it (the twins, Llama's 1e-5), and the exact maths


def _invariances(d: int, seed: int) -> pd.DataFrame:
    """Max output change of each norm, in float64, under ``x + 3`` and ``x · 7``, per ε.

    Both norms at the same ε: ε inside the root makes re-scaling inexact for both alike
    (about 2e-5 at ε 1e-5 on unit-variance inputs), and exact at ε 0.
    """
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(64, d, generator=g, dtype=torch.float64)
    rows = []
    for eps in INVARIANCE_EPS:
        for name, norm in (("layernorm", torch.nn.LayerNorm(d, eps=eps)),
                           ("rmsnorm", torch.nn.RMSNorm(d, eps=eps))):
            norm = norm.double()
            with torch.no_grad():
                base = norm(x)
                rows.append({"norm": name, "eps": eps,
                             "recentering_change": float((norm(x + 3.0) - base).abs().max()),
                             "rescaling_change": float((norm(x * 7.0) - base).abs().max())})
    return pd.DataFrame(rows)


def _time(fn, x: torch.Tensor, repeats: int) -> float:
    for _ in range(3):
        fn(x)
    sync = torch.cuda.synchronize if x.is_cuda else (lambda: None)
    times = []
    for _ in range(repeats):
        sync()
        t = time.perf_counter()
        fn(x)
        sync()
        times.append(time.perf_counter() - t)
    return sorted(times)[len(times) // 2] * 1e3


def layernorm_vs_rmsnorm(*, d_models: tuple[int, ...] = (576, 2048), tokens: int = 4096,
                         repeats: int = 20, compile: bool = False, seed: int = 0) -> NormComparison:
    """Experiment 5 (module docstring)."""
    devices = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])
    modes = ["eager"] + (["compile"] if compile else [])
    rows = []
    for device in devices:
        for d in d_models:
            x = torch.randn(tokens, d, device=device)
            ln, rms = torch.nn.LayerNorm(d).to(device), torch.nn.RMSNorm(d, eps=1e-5).to(device)
            for mode in modes:
                f_ln, f_rms = (ln, rms) if mode == "eager" else (torch.compile(ln), torch.compile(rms))
                with torch.inference_mode():
                    t_ln, t_rms = _time(f_ln, x, repeats), _time(f_rms, x, repeats)
                rows.append({"device": device, "mode": mode, "d_model": d, "tokens": tokens,
                             "layernorm_ms": t_ln, "rmsnorm_ms": t_rms, "speedup": t_ln / t_rms})
    return NormComparison(_invariances(d_models[0], seed), pd.DataFrame(rows))
