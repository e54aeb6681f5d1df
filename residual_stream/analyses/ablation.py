"""Causal check of the linear picture: ablate a write, see what really changes.

Read attribution is linear: it says how much of component ``j``'s read comes *directly* from
write ``i``, through norm scales frozen at the values of the clean run. Ablating ``i`` for real
also moves every later write that read it and every norm scale. Here each write ``i`` (an
attention or an MLP output, before any sandwich norm) is replaced by its mean over the
trace's real tokens (``mode="mean"``) or by zero (``mode="zero"``) in a fresh forward pass,
and we measure

* the relative change of every later component's read ``‖Δu_j‖ / ‖u_j‖`` (mean over tokens);
* the final distribution's change, ``KL(clean ‖ ablated)`` in nats, and the change of the
  clean top token's logit (when the model has an LM head);

then correlate the read changes with the linear attribution ``mean |share|`` of ``i`` in ``j``
(Pearson and Spearman over all pairs where ``j`` reads after ``i`` is added, ``Anatomy.sees``:
in a parallel block the MLP does not read its own attention's write). A high correlation says
the linear picture ranks influence the way interventions do; where they disagree, indirect
paths or norm-scale changes matter.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal, get_args

import numpy as np
import pandas as pd
import torch
from jaxtyping import Float
from torch import Tensor

from ..capture import capture, first_output
from ..errors import InputError, UnknownNameError, check_choice
from ..walk import component_of, read_inputs
from .flow import read_attribution
from .lens import log_probs
from .tokens import masked_mean

Mode = Literal["mean", "zero"]


@dataclass(frozen=True, eq=False)
class AblationCheck:
    """Causal effects of ablating each write, and their agreement with linear attribution."""

    writes: tuple[str, ...]
    readers: tuple[str, ...]
    effect: Float[Tensor, "write reader"]
    linear: Float[Tensor, "write reader"]
    logit_kl: Float[Tensor, " write"]
    top_logit_change: Float[Tensor, " write"]
    pearson: float
    spearman: float
    mode: str

    def to_frame(self) -> pd.DataFrame:
        """Long frame: ``write, reader, effect, linear`` for pairs where the reader sees the write."""
        f = pd.DataFrame({
            "write": np.repeat(self.writes, len(self.readers)),
            "reader": list(self.readers) * len(self.writes),
            "effect": self.effect.flatten().numpy(), "linear": self.linear.flatten().numpy()})
        return f.dropna().reset_index(drop=True)


def _ablated_output(trace, write: str, mode: Mode):
    layer, kind = component_of(write)
    clean = trace.attn_write(layer) if kind == "attn" else trace.mlp_write(layer)
    if mode == "zero":
        value = torch.zeros_like(clean)
    else:
        m = trace.attention_mask.bool().to(clean.device)
        value = clean[m].mean(0).expand_as(clean)
    path = (trace.anatomy.modules.attn_out if kind == "attn" else trace.anatomy.modules.mlp_out)[layer]

    def hook(module, args, output):
        rest = output[1:] if isinstance(output, tuple) else None
        new = value.to(first_output(output).dtype)
        return (new, *rest) if rest is not None else new

    return path, hook


def _rank(x: np.ndarray) -> np.ndarray:
    return pd.Series(x).rank().to_numpy()


def ablation_check(trace, *, writes: Sequence[str] | None = None, mode: Mode = "mean") -> AblationCheck:
    """Ablate each write in a fresh forward pass and compare with linear read attribution.

    ``writes``: component names (``"L0.attn"``, ``"L2.mlp"``; default every component);
    ``mode``: ``"mean"`` replaces a write by its mean over real tokens, ``"zero"`` by zeros.
    """
    from ..trace import Trace

    a = trace.anatomy
    check_choice("mode", mode, get_args(Mode))
    names = [c.name for c in a.components]
    if isinstance(writes, str):
        raise InputError(f"writes is a list of component names, e.g. [{writes!r}], not a string")
    writes = tuple(writes or names)
    unknown = [w for w in writes if w not in names]
    if unknown:
        raise UnknownNameError(f"no component {unknown[0]!r} to ablate; components are "
                               f"{names[:4]}... (whole attentions and MLPs, not heads)")
    readers = tuple(c.name for c in a.components)
    mask = trace.attention_mask
    clean = read_inputs(trace)
    tokens, dev_mask = trace.tokens.to(trace.model.device), mask.to(trace.model.device)
    later = a.sees(writes, readers)  # the pairs that count: the reader reads after the write
    effect = torch.full((len(writes), len(readers)), float("nan"))
    kl, dtop = torch.zeros(len(writes)), torch.zeros(len(writes))
    for i, write in enumerate(writes):
        cap = capture(trace.model.module, a, tokens, dev_mask,
                      edits=[_ablated_output(trace, write, mode)])
        ablated = Trace(trace.model, trace.batch, cap)
        inputs = read_inputs(ablated, cap)
        for j, reader in enumerate(readers):
            if later[i, j]:
                change = (inputs[reader] - clean[reader]).norm(dim=-1) / clean[reader].norm(dim=-1)
                effect[i, j] = float(masked_mean(change, mask))
        if a.has_lm_head:
            p, q = log_probs(trace.logits), log_probs(cap.logits)
            kl[i] = float(masked_mean((p.exp() * (p - q)).sum(-1), mask))
            top = trace.logits.argmax(-1, keepdim=True)
            change = cap.logits.gather(-1, top) - trace.logits.gather(-1, top)
            dtop[i] = float(masked_mean(change[..., 0], mask))
    attribution = read_attribution(trace).matrix("component", absolute=True)
    def linear_share(i: int, j: int) -> float:
        w, r = writes[i], readers[j]
        known = r in attribution.index and w in attribution.columns and later[i, j]
        return float(attribution.at[r, w]) if known else float("nan")

    linear = torch.tensor([[linear_share(i, j) for j in range(len(readers))] for i in range(len(writes))])
    both = ~(effect.isnan() | linear.isnan())
    e, lin = effect[both].numpy(), linear[both].numpy()
    pearson = float(np.corrcoef(e, lin)[0, 1]) if len(e) > 2 else float("nan")
    spearman = float(np.corrcoef(_rank(e), _rank(lin))[0, 1]) if len(e) > 2 else float("nan")
    if not a.has_lm_head:
        kl = dtop = torch.full((len(writes),), float("nan"))
    return AblationCheck(writes, readers, effect, linear, kl, dtop, pearson, spearman, mode)
