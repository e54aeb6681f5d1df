"""Twins: transformers identical except for normalization (see ``twins.model``)."""

from __future__ import annotations

import torch

from ..errors import InputError, as_index
from ..inputs import ByteTokenizer
from ..loading import Model, wrap


def twin(
    *,
    norm: str = "rmsnorm",
    placement: str = "pre",
    n_layers: int = 4,
    d_model: int = 64,
    n_heads: int = 4,
    seed: int = 0,
    **options: object,
) -> Model:
    """Build an untrained twin in code; ``rs.trace`` accepts it, ``.module`` maps tokens to logits.

    Args:
        norm: ``"layernorm"``, ``"rmsnorm"`` or ``"none"``.
        placement: ``"pre"``, ``"post"``, ``"sandwich"``, ``"deepnorm"`` or ``"parallel"``.
        n_layers: Number of blocks.
        d_model: Stream width.
        n_heads: Attention heads.
        seed: Seed for the initial weights (the same seed gives the same weights).
        **options: Other ``TwinConfig`` fields (``d_mlp``, ``mlp``, ``positions``, ``bias`` ...).
    """
    import dataclasses

    from .model import TwinConfig, TwinTransformer

    fields = {f.name for f in dataclasses.fields(TwinConfig)} - {"model_type"}
    unknown = sorted(set(options) - fields)
    if unknown:
        raise InputError(f"rs.twin has no option {', '.join(unknown)}: choose from {sorted(fields)}")
    if as_index(seed) is None or not 0 <= seed < 2**63:
        raise InputError(f"seed is a whole number in 0..2**63-1, not {seed!r}")
    cfg = TwinConfig(norm=norm, placement=placement, n_layers=n_layers, d_model=d_model,
                     n_heads=n_heads, **options)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        module = TwinTransformer(cfg).eval()
    name = f"twin-{placement}-{norm}"
    return wrap(module, ByteTokenizer(), name=name, source="code")
