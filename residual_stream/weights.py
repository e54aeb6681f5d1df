"""Read and write weights of attention and MLP components, in TransformerLens's shapes.

Frameworks store projections differently (``nn.Linear`` keeps ``[out, in]``, GPT-2's
``Conv1D`` keeps ``[in, out]``); this module hides that so analyses see one layout:
``W_O [head, d_head, d_model]`` with ``write_h = z_h @ W_O[h]``. Views are returned where
the model is float32 (no copy); other dtypes are upcast to float32 for analysis.
"""

from __future__ import annotations

import einops
import torch
from jaxtyping import Float
from torch import Tensor, nn


def as_in_out(module: nn.Module) -> Float[Tensor, "d_in d_out"]:
    """The weight of a Linear or Conv1D as an ``[in, out]`` float32 matrix (``y = x @ W + b``)."""
    w = module.weight
    w = w if type(module).__name__ == "Conv1D" else w.T
    return w.detach().float()


def bias_of(module: nn.Module) -> Float[Tensor, " d_out"] | None:
    """The bias of a projection as float32, or None."""
    b = getattr(module, "bias", None)
    return None if b is None else b.detach().float()


def attn_W_O(module: nn.Module, n_heads: int) -> Float[Tensor, "head d_head d_model"]:
    """Split an attention output projection into per-head write maps."""
    return einops.rearrange(as_in_out(module), "(head d_head) d_model -> head d_head d_model",
                            head=n_heads)


def head_writes(
    z: Float[Tensor, "batch pos head_d_head"], W_O: Float[Tensor, "head d_head d_model"]
) -> Float[Tensor, "head batch pos d_model"]:
    """Per-head attention writes ``z_h @ W_O[h]`` (without the output bias)."""
    z = einops.rearrange(z.to(W_O.dtype), "batch pos (head d_head) -> batch pos head d_head",
                         head=W_O.shape[0])
    return torch.einsum("bphk,hkd->hbpd", z, W_O)
