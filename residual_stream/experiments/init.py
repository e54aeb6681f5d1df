"""Experiments 1 and 2: forward norms and gradient norms at initialization (Xiong et al. 2020).

The paper's simplified setting (``simplified=True``): ``W_Q = W_K = 0`` (uniform attention),
every other weight ``N(0, 1/d)`` (DeepNorm's value, output and FFN maps times its β, as its
own initialization scales them), a ReLU FFN as wide as the stream (``d_mlp = d``), no
biases, inputs with ``E‖x‖²/d = 1``. Lemma 2: in
post-LN the sum entering each LayerNorm has ``E‖x‖²/d`` constant across layers (1.5 in their
setting); in pre-LN the stream's ``E‖x‖²/d`` grows linearly with depth (``≥ 1 + l/2``).
Measured with this package's own tracing on random token inputs. Every run draws from its
own generator (``torch.random.fork_rng``): the caller's random state is left as it was.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd
import plotly.graph_objects as go
import torch
from plotly.colors import qualitative
from plotly.subplots import make_subplots

from ..inputs import ByteTokenizer
from ..loading import wrap
from ..trace import trace as run_trace
from ..twins.model import TwinConfig, TwinTransformer


def _init_model(placement: str, n_layers: int, d_model: int, *, simplified: bool, seed: int,
                n_ctx: int = 64) -> TwinTransformer:
    """A twin at initialization (module docstring), made with its own random generator."""
    cfg = TwinConfig(norm="layernorm", placement=placement, n_layers=n_layers, d_model=d_model,
                     n_heads=4, n_ctx=n_ctx, mlp="relu" if simplified else "gelu",
                     d_mlp=d_model if simplified else 0)
    with torch.random.fork_rng(devices=[]), torch.no_grad():
        torch.manual_seed(seed)
        module = TwinTransformer(cfg)
        module.embed.weight.normal_(0, 1)   # inputs with E‖x‖²/d = 1
        module.pos_embed.weight.zero_()
        if simplified:
            for name, p in module.named_parameters():
                if p.ndim == 2 and name.startswith("blocks"):
                    zero = ".q_proj" in name or ".k_proj" in name
                    p.zero_() if zero else p.normal_(0, cfg.deepnorm_beta * d_model ** -0.5)
    return module.eval()


@dataclass(frozen=True, eq=False)
class ForwardNorms:
    """``E‖x‖²/d`` per layer, pre-LN and post-LN.

    Pre-LN: the stream entering each block. Post-LN: the sum entering each block's last
    LayerNorm (its variance, the square of the scale it divides by).
    """

    pre: np.ndarray
    post: np.ndarray
    pre_slope: float
    post_ratio_last_first: float

    def to_frame(self) -> pd.DataFrame:
        """Long frame: ``layer, placement, mean_sq_over_d``."""
        n = len(self.pre)
        return pd.DataFrame({"layer": list(range(n)) * 2, "placement": ["pre"] * n + ["post"] * n,
                             "mean_sq_over_d": np.concatenate([self.pre, self.post])})

    def figure(self) -> go.Figure:
        """Both curves against depth."""
        x = list(range(len(self.pre)))
        fig = go.Figure([go.Scatter(x=x, y=self.pre, name="pre-LN: stream"),
                         go.Scatter(x=x, y=self.post, name="post-LN: input to the LayerNorm")])
        fig.update_layout(title="Forward norm at initialization (Xiong et al. 2020, Lemma 2)",
                          xaxis_title="layer", yaxis_title="E‖x‖² / d")
        return fig


def forward_norms_at_init(*, n_layers: int = 24, d_model: int = 128, simplified: bool = True,
                          batch: int = 8, seq: int = 32, seed: int = 0) -> ForwardNorms:
    """Experiment 1 (module docstring)."""
    tokens = torch.randint(0, 256, (batch, seq), generator=torch.Generator().manual_seed(seed))
    out = {}
    for placement in ("pre", "post"):
        model = wrap(_init_model(placement, n_layers, d_model, simplified=simplified, seed=seed),
                     ByteTokenizer(), name=f"init-{placement}")
        tr = run_trace(model, tokens)
        if placement == "pre":
            out[placement] = np.array([float(tr.stream(L).pow(2).mean()) for L in range(n_layers)])
        else:
            out[placement] = np.array([float(tr.norm_scale(f"L{L}.ln_resid_mlp").pow(2).mean())
                                       for L in range(n_layers)])  # s² = var ≈ E‖x‖²/d
    slope = float(np.polyfit(np.arange(n_layers), out["pre"], 1)[0])
    return ForwardNorms(out["pre"], out["post"], slope, float(out["post"][-1] / out["post"][0]))


@dataclass(frozen=True, eq=False)
class GradientNorms:
    """Gradient norms of the FFN output weights at initialization, for each placement.

    ``per_layer``: every layer at a fixed depth; ``last_layer_by_depth``: the last layer's as
    the depth grows.
    """

    per_layer: dict[str, np.ndarray]
    depths: tuple[int, ...]
    last_layer_by_depth: dict[str, np.ndarray]

    def to_frame(self) -> pd.DataFrame:
        """Long frame: ``measure, placement, x, grad_norm``."""
        rows = [("per_layer", p, i, float(v)) for p, a in self.per_layer.items() for i, v in enumerate(a)]
        rows += [("last_layer_by_depth", p, d, float(v)) for p, a in self.last_layer_by_depth.items()
                 for d, v in zip(self.depths, a, strict=True)]
        return pd.DataFrame(rows, columns=["measure", "placement", "x", "grad_norm"])

    def figure(self) -> go.Figure:
        """Both measures side by side (log scale): every layer, and the last one against depth."""
        n = len(next(iter(self.per_layer.values())))
        fig = make_subplots(rows=1, cols=2, subplot_titles=(
            f"every layer of a {n}-layer model", "the last layer as layers are added"))
        colors = qualitative.Plotly
        for i, (p, a) in enumerate(self.per_layer.items()):
            line = {"color": colors[i % len(colors)]}
            fig.add_trace(go.Scatter(x=list(range(len(a))), y=a, name=p, legendgroup=p, line=line),
                          row=1, col=1)
            fig.add_trace(go.Scatter(x=list(self.depths), y=self.last_layer_by_depth[p], name=p,
                                     legendgroup=p, showlegend=False, line=line), row=1, col=2)
        fig.update_layout(title="‖∂L/∂W_out‖ at initialization (Xiong et al. 2020, Theorem 1)")
        fig.update_yaxes(type="log", title_text="gradient norm", col=1)
        fig.update_yaxes(type="log", col=2)
        fig.update_xaxes(title_text="layer", col=1)
        fig.update_xaxes(title_text="layers in the model", type="log", col=2)
        return fig


def _grad_norms(placement: str, n_layers: int, d_model: int, tokens, seed: int,
                simplified: bool) -> np.ndarray:
    if simplified:
        module = _init_model(placement, n_layers, d_model, simplified=True, seed=seed,
                             n_ctx=tokens.shape[1]).train()
    else:
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            module = TwinTransformer(TwinConfig(norm="layernorm", placement=placement,
                                                n_layers=n_layers, d_model=d_model, n_heads=4,
                                                n_ctx=tokens.shape[1])).train()
    logits = module(tokens).logits[:, :-1]
    loss = torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]),
                                             tokens[:, 1:].reshape(-1))
    loss.backward()
    return np.array([float(b.mlp.fc_out.weight.grad.norm()) for b in module.blocks])


def gradient_norms_at_init(*, n_layers: int = 12, d_model: int = 64,
                           depths: tuple[int, ...] = (4, 8, 16, 32),
                           placements: tuple[str, ...] = ("pre", "post", "deepnorm", "sandwich"),
                           batch: int = 8, seq: int = 32, seed: int = 0,
                           simplified: bool = True) -> GradientNorms:
    """Experiment 2 (module docstring): loss = next-byte cross-entropy on random bytes.

    ``simplified`` uses experiment 1's setting; otherwise the twins' own initialization.
    """
    tokens = torch.randint(0, 256, (batch, seq), generator=torch.Generator().manual_seed(seed))
    per_layer = {p: _grad_norms(p, n_layers, d_model, tokens, seed, simplified) for p in placements}
    by_depth = {p: np.array([_grad_norms(p, n, d_model, tokens, seed, simplified)[-1]
                             for n in depths]) for p in placements}
    return GradientNorms(per_layer, tuple(depths), by_depth)
