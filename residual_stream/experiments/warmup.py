"""Experiment 3: warm-up sensitivity of post-LN and pre-LN twins.

Short trainings with and without learning-rate warm-up, at two learning rates, on the twins'
data and recipe.

Xiong et al. 2020: post-LN needs warm-up (its gradients near the output are large at
initialization), pre-LN trains without it. Reported per run: final training loss (mean of
the last 10 steps), validation loss, and whether it diverged.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd
import plotly.graph_objects as go

from ..errors import InputError
from ..twins.data import Mix
from ..twins.model import TwinConfig
from ..twins.train import Recipe, train


@dataclass(frozen=True, eq=False)
class WarmupSensitivity:
    """One row per run: placement, learning rate, warm-up steps, losses; and the loss curves."""

    runs: pd.DataFrame
    curves: dict[str, np.ndarray]

    def to_frame(self) -> pd.DataFrame:
        """The runs table."""
        return self.runs

    def final_loss(self, placement: str, lr: float, warmup: bool) -> float:
        """Final training loss of one run (inf when it diverged)."""
        runs = self.runs
        row = runs[(runs.placement == placement) & (runs.lr == lr) & ((runs.warmup > 0) == warmup)]
        return float(row.final_train_loss.iloc[0])

    def figure(self) -> go.Figure:
        """Training-loss curves of every run."""
        fig = go.Figure([go.Scatter(y=c, name=k, mode="lines") for k, c in self.curves.items()])
        fig.update_layout(title="Warm-up sensitivity: training loss", xaxis_title="step",
                          yaxis_title="loss (nats/byte)")
        return fig


def warmup_sensitivity(*, lrs: tuple[float, ...] = (1e-3, 1e-2), steps: int = 300,
                       warmup: int = 100, n_layers: int = 6, d_model: int = 64, n_heads: int = 4,
                       d_mlp: int = 0, seq_len: int = 64, synthetic_fraction: float = 0.25,
                       placements: tuple[str, ...] = ("post", "pre"), batch: int = 16,
                       clip: float = float("inf"), seed: int = 0) -> WarmupSensitivity:
    """Experiment 3 (module docstring). Every run shares data order and initial weights.

    Gradients are not clipped by default (``clip``): clipping is itself a stabilizer that
    hides the effect warm-up compensates for. ``models/build_twins.py --warmup-experiment``
    runs it at the bundled twins' shape and recipe (clip 1.0, 50 % synthetic rows).
    ``warmup`` (steps, at least 1) is compared with none.
    """
    if not isinstance(warmup, int) or not 1 <= warmup <= steps:
        raise InputError(f"warmup must be 1 to steps ({steps}) steps, compared with none; got {warmup!r}")
    rows, curves = [], {}
    for placement in placements:
        cfg = TwinConfig(norm="layernorm", placement=placement, n_layers=n_layers,
                         d_model=d_model, n_heads=n_heads, d_mlp=d_mlp, n_ctx=seq_len)
        for lr in lrs:
            for w in (0, warmup):
                recipe = Recipe(steps=steps, batch=batch, lr=lr, warmup=w, seed=seed, clip=clip,
                                mix=Mix(seq_len=seq_len, synthetic_fraction=synthetic_fraction))
                result = train(cfg, recipe, progress=False)
                losses = np.array(result.losses)
                final = float("inf") if result.diverged else float(losses[-10:].mean())
                rows.append({"placement": placement, "lr": lr, "warmup": w,
                             "final_train_loss": final, "diverged": result.diverged,
                             "val_loss": result.evaluation.get("val_loss", float("inf"))})
                curves[f"{placement}-LN lr {lr:g} warm-up {w}"] = losses
    return WarmupSensitivity(pd.DataFrame(rows), curves)
