"""Norm growth: how the stream's size evolves with depth, and how big each update is.

In a pre-norm model the stream is never normalized, so its norm can grow layer after
layer; each sublayer's relative update ``‖write‖ / ‖stream before it‖`` then shrinks. In a
post-norm model every block renormalizes, so the stream's norm is set by the last norm's
γ and β. Measured here, per point (the stream entering block L; the last point is after the
last block, before any final norm):

* the stream's L2 norm over tokens: mean, median, 5th and 95th percentiles (the first token
  of each row excluded, since BOS / CLS often carry outsized norms), the first token
  separately, and the mean per position;
* the growth factor ``mean_{L+1} / mean_L`` and a least-squares fit ``log mean_L = a + r L``
  over points 1..n (rate ``r`` per layer, growth ``e^r``, fit quality R²);
* relative update sizes for every attention and MLP, ``‖write as added‖ / ‖stream it is
  added to‖`` in program order (in a parallel block the MLP's write is added after the
  attention's, so its denominator holds the attention's write, not only the block input it
  read);
* for every norm that stands on the stream or on a write (post-norm, DeepNorm, sandwich),
  its kind, the norm of the sum entering it and the scale it divides by (a constant
  multiplier, Granite's, has kind ``"multiplier"`` and scale 1: it divides by nothing);
* the share of the stream's energy along the all-ones direction, ``(Σ_k x_k)² / (d ‖x‖²)``:
  what LayerNorm's centering removes and RMSNorm keeps;
* massive activations: coordinates with ``|x| > 100`` and ``|x| > 1000 ×`` the median
  ``|x|`` of that token (``massive_reference="token"``, the default) or of the whole point
  over real tokens (``"point"``, closer to Sun et al. 2024's "median of its hidden states"),
  with point, token and dimension. SmolLM2's first token carries a coordinate near 22,500 at
  mid depth, only ~500× its own median (which it inflates) but ~10,000× the point's median.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd
import torch
from jaxtyping import Float
from torch import Tensor

from ..errors import check_choice, need_trace
from ..program import Add, Norm
from ..walk import component_of, walk_stream
from .results import CompactRepr
from .tokens import masked_mean, real

MASSIVE_ABS, MASSIVE_REL = 100.0, 1000.0


@dataclass(frozen=True, eq=False, repr=False)
class NormGrowth(CompactRepr):
    """Norm-growth measures; per-point tensors have one entry per point 0..n_layers."""

    mean: Float[Tensor, " point"]
    median: Float[Tensor, " point"]
    p5: Float[Tensor, " point"]
    p95: Float[Tensor, " point"]
    first_token: Float[Tensor, " point"]
    per_position: Float[Tensor, "point pos"]
    growth: Float[Tensor, " layer"]
    fit_rate: float
    fit_r2: float
    update_attn: Float[Tensor, " layer"]
    update_mlp: Float[Tensor, " layer"]
    ones_share: Float[Tensor, " point"]
    norm_inputs: pd.DataFrame
    massive: pd.DataFrame  # point, batch, pos, dim, token, value, ratio_to_median (a scan: text, not batch)
    model_name: str = ""

    def __post_init__(self) -> None:
        n = self.growth.shape[0]
        for name in ("mean", "median", "p5", "p95", "first_token", "ones_share"):
            if getattr(self, name).shape != (n + 1,):
                raise ValueError(f"{name} has shape {tuple(getattr(self, name).shape)}, "
                                 f"expected ({n + 1},) for {n} layers")

    @property
    def fit_growth(self) -> float:
        """The fitted growth factor per layer, ``e^rate``."""
        return float(np.exp(self.fit_rate))

    def to_frame(self) -> pd.DataFrame:
        """Long frame: ``point, measure, value, unit`` for every per-point and per-layer measure."""
        rows = []
        per_point = {"mean": "L2 norm", "median": "L2 norm", "p5": "L2 norm", "p95": "L2 norm",
                     "first_token": "L2 norm", "ones_share": "fraction of energy"}
        for name, unit in per_point.items():
            rows += [(p, name, float(v), unit) for p, v in enumerate(getattr(self, name))]
        per_layer = {"growth": "ratio", "update_attn": "ratio", "update_mlp": "ratio"}
        for name, unit in per_layer.items():
            rows += [(p, name, float(v), unit) for p, v in enumerate(getattr(self, name))]
        return pd.DataFrame(rows, columns=["point", "measure", "value", "unit"])


def _quantiles(norms: Tensor, mask: Tensor) -> tuple[Tensor, ...]:
    """mean, median, p5, p95 per point over real tokens after the first of each row."""
    rest = mask.clone()
    rest[:, 0] = 0
    if rest.sum() == 0:  # every text is one token long: use them all
        rest = mask
    vals = real(norms, rest, lead=1)                               # (point, token)
    q = torch.quantile(vals, torch.tensor([0.5, 0.05, 0.95], device=vals.device), dim=-1)
    return vals.mean(-1), q[0], q[1], q[2]


def _fit(mean: Tensor) -> tuple[float, float]:
    """Least squares ``log mean_L = a + r L`` over points 1..n: (rate r, R²)."""
    y = np.log(mean[1:].double().cpu().numpy())
    x = np.arange(1, len(mean), dtype=float)
    if len(x) < 2:
        return float("nan"), float("nan")
    r, a = np.polyfit(x, y, 1)
    resid = y - (a + r * x)
    total = ((y - y.mean()) ** 2).sum()
    return float(r), float(1 - (resid ** 2).sum() / total) if total > 0 else 1.0


def _massive(trace, streams: Tensor, reference: str) -> pd.DataFrame:
    mask = trace.attention_mask.bool().to(streams.device)
    mags = streams.abs()                                             # (point, batch, pos, d)
    if reference == "token":
        med = mags.median(-1, keepdim=True).values
    else:  # "point" (``norm_growth`` checked it)
        med = torch.stack([m[mask].median() for m in mags])[:, None, None, None].expand_as(mags[..., :1])
    hit = (mags > MASSIVE_ABS) & (mags > MASSIVE_REL * med) & mask[None, :, :, None]
    rows = [
        {"point": int(p), "batch": int(b), "pos": int(t), "dim": int(d),
         "token": trace.str_tokens[b][t], "value": float(streams[p, b, t, d]),
         "ratio_to_median": float(mags[p, b, t, d] / med[p, b, t, 0].clamp_min(1e-30))}
        for p, b, t, d in hit.nonzero().tolist()
    ]
    return pd.DataFrame(rows, columns=["point", "batch", "pos", "dim", "token", "value",
                                       "ratio_to_median"])


def _updates_and_norm_inputs(trace) -> tuple[Tensor, Tensor, pd.DataFrame]:
    n, mask = trace.anatomy.n_layers, trace.attention_mask
    upd = {"attn": torch.full((n,), float("nan")), "mlp": torch.full((n,), float("nan"))}
    rows = []
    for step in walk_stream(trace):
        if isinstance(step.op, Add):
            layer, kind = component_of(step.op.component)
            ratio = step.added.norm(dim=-1) / step.x.norm(dim=-1).clamp_min(1e-30)
            upd[kind][layer] = masked_mean(ratio, mask).cpu()
        norm = step.op.norm if isinstance(step.op, Norm) else getattr(step.op, "via", None)
        if norm is not None:
            entering = step.x if isinstance(step.op, Norm) else step.write
            rows.append({"norm": norm, "kind": trace.anatomy.norms[norm].kind,
                         "input_norm": float(masked_mean(entering.norm(dim=-1), mask)),
                         "scale": float(masked_mean(trace.norm_scale(norm), mask))})
    return upd["attn"], upd["mlp"], pd.DataFrame(rows, columns=["norm", "kind", "input_norm", "scale"])


def norm_growth(trace, *, massive_reference: str = "token") -> NormGrowth:
    """Measure norm growth, update sizes, centering share and massive activations of ``trace``.

    ``massive_reference`` is ``"token"`` or ``"point"``: whose median the 1000× rule compares to.
    """
    need_trace(trace, "norm_growth")
    check_choice("massive_reference", massive_reference, ("token", "point"))
    n, mask = trace.anatomy.n_layers, trace.attention_mask
    streams = torch.stack([trace.stream(L) for L in range(n + 1)])   # (point, batch, pos, d)
    norms = streams.norm(dim=-1)
    mean, median, p5, p95 = _quantiles(norms, mask)
    m = mask.bool().to(norms.device)
    first = norms[:, :, 0].mean(-1)
    counts = m.sum(0).clamp_min(1)
    per_position = (norms * m).sum(1) / counts
    per_position[:, m.sum(0) == 0] = float("nan")
    d = streams.shape[-1]
    ones = streams.sum(-1).pow(2) / (d * streams.pow(2).sum(-1).clamp_min(1e-30))
    rate, r2 = _fit(mean)
    attn, mlp, norm_inputs = _updates_and_norm_inputs(trace)
    return NormGrowth(
        mean=mean.cpu(), median=median.cpu(), p5=p5.cpu(), p95=p95.cpu(), first_token=first.cpu(),
        per_position=per_position.cpu(), growth=(mean[1:] / mean[:-1]).cpu(), fit_rate=rate,
        fit_r2=r2, update_attn=attn, update_mlp=mlp,
        ones_share=masked_mean(ones, mask, lead=1).cpu(), norm_inputs=norm_inputs,
        massive=_massive(trace, streams, massive_reference), model_name=trace.model.name,
    )
