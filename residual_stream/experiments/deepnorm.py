"""Experiment 4: DeepNorm (Wang et al. 2022, "DeepNet: Scaling Transformers to 1,000 Layers").

``x ← LN(α·x + F(x))`` with β-scaled initialization of the value, output and FFN weights
(Xavier normal with gain β; queries and keys keep gain 1). Constants, for N encoder and M
decoder layers:

    encoder-only   α = (2N)^¼            β = (8N)^-¼
    decoder-only   α = (2M)^¼            β = (8M)^-¼
    encoder-decoder, encoder: α = 0.81 (N⁴M)^(1/16)   β = 0.87 (N⁴M)^(-1/16)
                     decoder: α = (3M)^¼            β = (12M)^-¼

The twins implement the decoder-only case. The paper's diagnosis of post-LN instability is
an exploding *model update* early in training; measured here as ``‖F(x, θ_t) − F(x, θ_0)‖``
(the final hidden states on a fixed batch, root mean square over tokens) over the first
steps, for a deep post-LN model against DeepNorm with the same width, data and learning rate.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import numpy as np
import pandas as pd
import plotly.graph_objects as go
import torch

from ..twins.data import Mix, train_batch
from ..twins.model import TwinConfig, TwinTransformer
from ..twins.train import next_byte_loss


def deepnorm_constants(kind: Literal["encoder", "decoder", "encoder-decoder"], *,
                       n_encoder: int = 0, n_decoder: int = 0) -> dict[str, float]:
    """α and β of DeepNorm (module docstring); encoder-decoder gives both parts."""
    N, M = n_encoder, n_decoder
    if kind == "encoder":
        return {"alpha": (2 * N) ** 0.25, "beta": (8 * N) ** -0.25}
    if kind == "decoder":
        return {"alpha": (2 * M) ** 0.25, "beta": (8 * M) ** -0.25}
    if kind == "encoder-decoder":
        return {"encoder_alpha": 0.81 * (N ** 4 * M) ** (1 / 16),
                "encoder_beta": 0.87 * (N ** 4 * M) ** (-1 / 16),
                "decoder_alpha": (3 * M) ** 0.25, "decoder_beta": (12 * M) ** -0.25}
    raise ValueError(f"kind must be encoder, decoder or encoder-decoder, got {kind!r}")


@dataclass(frozen=True, eq=False)
class DeepNormUpdate:
    """Model update per step for each placement, and the training losses."""

    updates: dict[str, np.ndarray]
    losses: dict[str, np.ndarray]
    n_layers: int

    def to_frame(self) -> pd.DataFrame:
        """Long frame: ``placement, step, update, loss``."""
        return pd.concat([pd.DataFrame({"placement": p, "step": np.arange(len(u)), "update": u,
                                        "loss": self.losses[p][:len(u)]})
                          for p, u in self.updates.items()], ignore_index=True)

    def figure(self) -> go.Figure:
        """Update size against step, log scale."""
        fig = go.Figure([go.Scatter(y=u, name=p) for p, u in self.updates.items()])
        fig.update_layout(title=f"Model update over the first steps ({self.n_layers} layers)",
                          xaxis_title="step", yaxis_title="‖F(x, θ_t) − F(x, θ_0)‖ (RMS over tokens)",
                          yaxis_type="log")
        return fig


def _final_states(module: TwinTransformer, x: torch.Tensor) -> torch.Tensor:
    with torch.no_grad():
        return module(x, output_hidden_states=True).hidden_states[-1]


def deepnorm_update(*, n_layers: int = 48, d_model: int = 32, steps: int = 30, lr: float = 1e-3,
                    batch: int = 8, seed: int = 0,
                    placements: tuple[str, ...] = ("post", "deepnorm")) -> DeepNormUpdate:
    """Experiment 4 (module docstring); Adam without warm-up, the same for every placement."""
    updates, losses = {}, {}
    mix = Mix(seq_len=32)
    probe = train_batch(batch, torch.Generator().manual_seed(seed + 1), mix)[0]
    for placement in placements:
        with torch.random.fork_rng(devices=[]):  # the caller's random state is left alone
            torch.manual_seed(seed)
            module = TwinTransformer(TwinConfig(norm="layernorm", placement=placement,
                                                n_layers=n_layers, d_model=d_model, n_heads=4,
                                                n_ctx=32, init="xavier")).train()  # as in the paper
        opt = torch.optim.Adam(module.parameters(), lr=lr)
        g = torch.Generator().manual_seed(seed)
        start = _final_states(module, probe)
        u, ls = [], []
        for _ in range(steps):
            loss = next_byte_loss(module, *train_batch(batch, g, mix))
            opt.zero_grad()
            loss.backward()
            opt.step()
            ls.append(loss.item())
            moved = (_final_states(module, probe) - start).norm(dim=-1)  # ‖ΔF‖ per token
            u.append(float(moved.pow(2).mean().sqrt()))  # RMS over tokens
        updates[placement], losses[placement] = np.array(u), np.array(ls)
    return DeepNormUpdate(updates, losses, n_layers)
