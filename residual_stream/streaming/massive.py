"""The massive-activation search of growth's sums (``growth.GrowthSums``), as tensor functions.

A massive activation (Sun et al. 2024) is a coordinate of the stream over ``MASSIVE_ABS`` and
``MASSIVE_REL`` times its token's median |x|. Per point, ``point_sums`` marks the tokens that
can hold one without sorting; ``first_k`` picks a fixed number of them in token order (what a
replayed CUDA graph can hold); ``hits`` searches the picked rows of every point at once.
No function here waits for the device.
"""

from __future__ import annotations

import torch
from torch import Tensor

from ..analyses.growth import MASSIVE_ABS, MASSIVE_REL
from ..fusion import acc_dtype, fused, wide


@fused
def point_sums(x: Tensor, mask: Tensor) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """Per token of ``x [batch, pos, d]``: norm, coordinate sum, candidacy; the candidates' count.

    A candidate is a real token that can hold a massive activation: a coordinate over
    ``MASSIVE_ABS`` and a median |x| under its largest over ``MASSIVE_REL``, which a count
    decides without sorting (the lower median is below ``t`` iff more than ``(d − 1) // 2``
    coordinates are; ``t`` is nudged up by 1e-6 relative, so this is a superset of the tokens
    that hit). A bf16 ``x`` is reduced in float32 (``acc_dtype``).
    """
    acc = acc_dtype(x)
    top = torch.linalg.vector_norm(x, ord=float("inf"), dim=-1, dtype=acc)
    below = (x.abs() < (top * ((1 + 1e-6) / MASSIVE_REL)).unsqueeze(-1)).sum(-1)
    tok = (top > MASSIVE_ABS) & (below > (x.shape[-1] - 1) // 2) & mask
    return torch.linalg.vector_norm(x, dim=-1, dtype=acc), x.sum(-1, dtype=acc), tok, tok.sum()


def first_k(flags: Tensor, count: Tensor, k: int) -> tuple[Tensor, Tensor]:
    """Indices of the first ``k`` true entries of the 1-D ``flags`` (``count`` of them), in order.

    And which of the ``k`` slots hold one; slots past ``count`` hold index 0. A prefix sum
    ranks the true entries and one scatter puts the first ``k`` in their slots (the rest go to
    a spare slot, dropped): no device sync, fixed shapes. Not a top-k over every token: on a
    GPU that is one single-block kernel over them all (``gatherTopK``, then a sort of the
    ``k``), 4.6 + 0.8 ms of a 32×512 batch on an H200 (session 33), the largest thing growth
    added to the forward pass.
    """
    rank = flags.cumsum(0) - 1                                   # rank among the true entries
    slot = torch.where(flags & (rank < k), rank, k)              # the rest go to a spare slot
    out = torch.zeros(k + 1, dtype=torch.long, device=flags.device)
    out.scatter_(0, slot, torch.arange(flags.numel(), device=flags.device))
    return out[:k], torch.arange(k, device=flags.device) < count


def hits(rows: Tensor, valid: Tensor, top_k: int) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """Massive activations among candidate tokens, for several points at once.

    ``rows [point, k, d]`` (any float dtype, reduced in float32 at least) and ``valid [point,
    k]``. A hit is a coordinate over ``MASSIVE_ABS`` and ``MASSIVE_REL`` × its token's
    (lower) median |x|. Returns per point: the number of hits ``[point]``, and for its top
    ``top_k`` coordinates by |x| (the hits first): their flat index into ``k × d``, value and
    token median, each ``[point, top_k]``. One sort for the medians and one top-k, whatever
    the number of points.
    """
    rows = wide(rows)
    sel = rows.abs()
    med = sel.median(-1, keepdim=True).values
    hit = (sel > MASSIVE_ABS) & (sel > MASSIVE_REL * med) & valid[..., None]
    _, idx = torch.where(hit, sel, 0).flatten(1).topk(min(top_k, hit[0].numel()))
    return (hit.sum((1, 2)), idx, rows.flatten(1).gather(1, idx),
            med.flatten(1).gather(1, idx // rows.shape[-1]))


def stacked(tensors: tuple[Tensor, ...]) -> Tensor:
    """``torch.stack``, but a view of a single tensor instead of a copy.

    The eager search stacks one point, whose candidate rows may be every token.
    """
    return tensors[0].unsqueeze(0) if len(tensors) == 1 else torch.stack(tensors)
