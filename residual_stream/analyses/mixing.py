"""Context mixing: how much of each token's updated state comes from *other* tokens.

Kobayashi et al. 2021 (EMNLP, "Incorporating Residual and Normalization Layers into
Analysis of Masked Language Models") decompose the output of a post-LN attention block,
``y_i = LN(x_i + Σ_h Σ_j A_hij (x_j W_V^h + b_V^h) W_O^h + b_O)``, exactly through the LayerNorm
(its scale frozen at token ``i``) into per-source-token terms. With
``T_ij = Σ_h A_hij u_j W_V^h W_O^h`` (``u`` what attention reads, biases left out as in the paper):

* ``context_i = L_i(Σ_{j≠i} T_ij)`` and ``own_i = L_i(T_ii + x_i)`` (the residual is the token's own);
* norm-based ratio ``‖context_i‖ / (‖context_i‖ + ‖own_i‖)`` (their "N-ResLN");
* attention-only norm ratio ``‖Σ_{j≠i} T_ij‖ / (‖Σ_{j≠i} T_ij‖ + ‖T_ii‖)`` ("N");
* weight-based ratio with the residual counted as weight 1 on the token itself,
  ``Σ_{j≠i} ᾱ_ij / 2`` with ``ᾱ`` the head-averaged pattern ("W-Res").

``L_i`` is whatever the stream program applies between the attention read and the next read:
the post-norm's frozen LayerNorm, a sandwich model's norm on the write, DeepNorm's α on the
residual. A pre-norm model applies nothing, which gives the analogous pre-norm ratio (its
residual is the raw stream, not a normalized one). Needs attention patterns: trace with
``patterns=True``.
"""

from __future__ import annotations

from dataclasses import dataclass

import pandas as pd
import torch
from jaxtyping import Float
from torch import Tensor

from ..errors import NotAvailableError, need_trace
from ..program import Add, Mark, Norm, Read, Scale
from ..walk import read_inputs, walk_stream
from ..weights import LATENT
from .results import CompactRepr
from .tokens import masked_mean, safe_ratio


@dataclass(frozen=True, eq=False, repr=False)
class MixingRatio(CompactRepr):
    """Per layer and token: three mixing ratios (module docstring), in [0, 1]."""

    norm_res_ln: Float[Tensor, "layer batch pos"]
    norm_attn: Float[Tensor, "layer batch pos"]
    weight_res: Float[Tensor, "layer batch pos"]
    attention_mask: Tensor

    def summary(self) -> pd.DataFrame:
        """Per layer, mean over real tokens of each ratio."""
        return pd.DataFrame({
            "layer": range(self.norm_res_ln.shape[0]),
            **{name: masked_mean(getattr(self, name), self.attention_mask, lead=1).numpy()
               for name in ("norm_res_ln", "norm_attn", "weight_res")},
        })

    def to_frame(self) -> pd.DataFrame:
        """Long frame: ``layer, measure, value`` (per-layer means)."""
        return self.summary().melt(id_vars="layer", var_name="measure", value_name="value")


def _after_attention(trace, layer: int) -> list:
    """The ops from the attention's read to the next read of a later component (or a Mark)."""
    ops = list(trace.anatomy.program)
    start = next(i for i, op in enumerate(ops)
                 if isinstance(op, Read) and op.component == f"L{layer}.attn")
    out, added = [], False
    for op in ops[start + 1:]:
        if isinstance(op, Add) and op.component == f"L{layer}.attn":
            added = True
        if added and isinstance(op, (Read, Mark)):
            break
        out.append(op)
    return out


def _layer(trace, layer: int, A: Tensor, u: Tensor, x: Tensor):
    """Ratios of one layer: ``u`` is what attention reads, ``x`` the stream at its read point."""
    w = trace.model.weights(layer)
    if w.W_V is None:  # latent attention: no linear map from the stream to values
        raise NotAvailableError(LATENT)
    W_V = w.W_V  # (values are never normed: no gains to fold, unlike queries and keys)
    f = torch.einsum("bjd,hdk,hke->bhje", u, W_V, w.W_O)                # per head, per source token
    T = torch.einsum("bhij,bhje->bije", A, f)                           # (batch, i, j, d_model)
    eye = torch.eye(T.shape[1], dtype=torch.bool, device=T.device)
    own_attn = T[:, eye]                                                 # T_ii: (batch, pos, d)
    context = T.masked_fill(eye[None, :, :, None], 0).sum(2)
    ratio_attn = safe_ratio(context.norm(dim=-1), context.norm(dim=-1) + own_attn.norm(dim=-1))
    own = x
    for op in _after_attention(trace, layer):
        if isinstance(op, Scale):
            own = own * op.alpha
        elif isinstance(op, Add) and op.component == f"L{layer}.attn":
            if op.via is not None:
                spec, s = trace.anatomy.norms[op.via], trace.norm_scale(op.via)
                context, own_attn = spec.apply_linear(context, s), spec.apply_linear(own_attn, s)
            own = own + own_attn
        elif isinstance(op, Norm):
            spec, s = trace.anatomy.norms[op.norm], trace.norm_scale(op.norm)
            context, own = spec.apply_linear(context, s), spec.apply_linear(own, s)
    ratio = safe_ratio(context.norm(dim=-1), context.norm(dim=-1) + own.norm(dim=-1))
    mean_pattern = A.mean(1)
    weight = (1 - mean_pattern.diagonal(dim1=-2, dim2=-1)) / 2
    return ratio, ratio_attn, weight


def mixing_ratio(trace) -> MixingRatio:
    """Context-mixing ratios of every attention layer of ``trace`` (module docstring)."""
    need_trace(trace, "mixing_ratio")
    streams = {s.op.component: s.x for s in walk_stream(trace) if isinstance(s.op, Read)}
    inputs = read_inputs(trace)
    rows = [_layer(trace, L, A.to(trace.stream(0).device), inputs[f"L{L}.attn"],
                   streams[f"L{L}.attn"]) for L, A in enumerate(trace.patterns)]
    stack = [torch.stack([r[i] for r in rows]).cpu() for i in range(3)]
    return MixingRatio(*stack, attention_mask=trace.attention_mask.cpu())
