"""Token bookkeeping shared by the analyses: select real (non-pad) tokens, masked means."""

from __future__ import annotations

import torch
from torch import Tensor


def real(x: Tensor, mask: Tensor, *, lead: int = 0) -> Tensor:
    """The real tokens of ``x``: ``[*lead, batch, pos, ...]`` → ``[*lead, token, ...]``."""
    m = mask.bool().to(x.device)
    if lead == 0:
        return x[m]
    flat = x.flatten(0, lead - 1) if lead > 1 else x
    out = flat[:, m]
    return out.unflatten(0, x.shape[:lead]) if lead > 1 else out


def masked_mean(x: Tensor, mask: Tensor, *, lead: int = 0) -> Tensor:
    """Mean over real tokens of ``x`` ``[*lead, batch, pos]`` → ``[*lead]``."""
    return real(x, mask, lead=lead).mean(-1)


def safe_ratio(num: Tensor, den: Tensor) -> Tensor:
    """``num / den`` with 0/0 → 0 (a zero write has a zero share)."""
    return num / den.clamp_min(torch.finfo(den.dtype).tiny)
