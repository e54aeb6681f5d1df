"""Normalizations with their per-token scale frozen: the affine maps the stream passes through.

For one token with the scale ``s`` that the forward pass computed,

    LayerNorm: N(z) = γ ⊙ C z / s + β,   C = I − 11ᵀ/d,   s = sqrt(var(z) + ε)
    RMSNorm:   N(z) = γ ⊙ z / s,                         s = sqrt(mean(z²) + ε)

(Gemma's RMSNorm multiplies by ``1 + γ``: ``weight_offset = 1``). A constant multiplier that a
model applies to the whole stream or to a write (Granite's embedding and residual multipliers)
is the degenerate case ``N(z) = γ ⊙ z`` with ``γ = c`` and ``s ≡ 1``: kind ``"multiplier"``,
placed in the stream program like any norm, with no module behind it. With ``s`` frozen, ``N`` is
affine, so it maps a sum of contributions to the sum of the mapped contributions plus ``β``.
That is what lets one replay engine decompose the stream under any norm placement.

All arithmetic here is float32 (or the dtype of the input, when it is float64 in tests).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import torch
from jaxtyping import Float
from torch import Tensor

from .fusion import acc_dtype, fused


@fused
def _scale(x: Tensor, eps: float, centered: bool) -> Tensor:
    """``sqrt(var(x) + ε)`` (centered) or ``sqrt(mean(x²) + ε)`` per token, in ``acc_dtype(x)``.

    The mean square comes from a norm taken in that dtype: no widened copy of ``x``.
    """
    acc = acc_dtype(x)
    if centered:
        return torch.sqrt(x.to(acc).var(-1, unbiased=False) + eps)
    return torch.sqrt(torch.linalg.vector_norm(x, dim=-1, dtype=acc).square() / x.shape[-1] + eps)


NormKind = Literal["layernorm", "rmsnorm", "multiplier"]
NORM_KINDS: tuple[str, ...] = ("layernorm", "rmsnorm", "multiplier")


@dataclass(frozen=True, eq=False)
class NormSpec:
    """One normalization module as data: kind, ε, gain and bias.

    Attributes:
        name: Role name, e.g. ``"L3.ln_attn_in"`` or ``"ln_final"``.
        kind: ``"layernorm"`` (re-centers and re-scales), ``"rmsnorm"`` (re-scales only) or
            ``"multiplier"`` (a constant: ``weight`` holds it, the scale is 1, no module).
        eps: The ε added to the variance / mean square.
        weight: Gain γ, shape ``[d_model]``, or None for no gain. A detached view of the
            module's parameter (not a copy), so edits to the model stay visible.
        bias: Bias β, shape ``[d_model]``, or None (also a view).
        weight_offset: Added to γ before use (1.0 for Gemma's ``(1 + γ)``).
        module_path: Where the module lives in the framework model (for hooks); "" for a
            multiplier.
    """

    name: str
    kind: str  # NormKind; validated in __post_init__ with a clear message
    eps: float
    weight: Tensor | None
    bias: Tensor | None
    weight_offset: float = 0.0
    module_path: str = ""

    def __post_init__(self) -> None:
        if self.kind not in NORM_KINDS:
            raise ValueError(f"norm {self.name!r}: kind must be one of {NORM_KINDS}, got {self.kind!r}")
        for label, t in (("weight", self.weight), ("bias", self.bias)):
            if t is not None and t.ndim != 1:
                raise ValueError(f"norm {self.name!r}: {label} must be 1-D, got shape {tuple(t.shape)}")

    def gain(self, like: Tensor) -> Tensor | float:
        """The effective gain (γ + offset) on ``like``'s device and dtype, or 1.0 without γ."""
        if self.weight is None:
            return 1.0
        w = self.weight.to(like.device, like.dtype)  # no copy when it is already there
        return w + self.weight_offset if self.weight_offset else w

    @property
    def constant(self) -> bool:
        """A constant multiplier: no module to hook, its scale 1 for every token."""
        return self.kind == "multiplier"

    def scale(self, x: Float[Tensor, "*batch d_model"]) -> Float[Tensor, "*batch"]:
        """The per-token scale ``s`` the norm divides by, in float32 (float64 stays float64).

        One fused kernel on a GPU (every norm's hook computes it inside the forward pass); ones
        for a multiplier.
        """
        if self.constant:
            return torch.ones(x.shape[:-1], dtype=acc_dtype(x), device=x.device)
        return _scale(x, float(self.eps), self.kind == "layernorm")

    def apply_linear(
        self, c: Float[Tensor, "*lead d_model"], scale: Float[Tensor, "*tokens"]
    ) -> Float[Tensor, "*lead d_model"]:
        """The linear part of the frozen norm, ``γ ⊙ C c / s``, on one or a stack of contributions.

        ``scale`` (per token) broadcasts against ``c``'s leading axes from the right, so ``c``
        may carry an extra leading ``component`` axis.
        """
        if self.kind == "layernorm":
            c = c - c.mean(-1, keepdim=True)
        return c * (self.gain(c) / scale.to(c.dtype).unsqueeze(-1))

    def apply_linear_(self, c: Float[Tensor, "*lead d_model"], scale: Tensor) -> Tensor:
        """``apply_linear`` in place on ``c`` (same arithmetic, no temporaries of ``c``'s size).

        ``scale`` broadcasts against ``c``'s leading axes from the right, as in ``apply_linear``.
        """
        if self.kind == "layernorm":
            c.sub_(c.mean(-1, keepdim=True))
        return c.mul_(self.gain(c) / scale.to(c.dtype).unsqueeze(-1))

    def apply_frozen(
        self, x: Float[Tensor, "*batch d_model"], scale: Float[Tensor, "*batch"]
    ) -> Float[Tensor, "*batch d_model"]:
        """The whole affine map with ``scale`` frozen: ``γ ⊙ C x / s + β``."""
        out = self.apply_linear(x, scale)
        return out if self.bias is None else out + self.bias.to(out.device, out.dtype)

    def fold_into(self, W: Float[Tensor, "*lead d_model k"]) -> Float[Tensor, "*lead d_model k"]:
        """The read map seen from the stream: ``C diag(γ) W`` for a map ``W`` applied after this norm.

        (Up to the per-token ``1/s``.) ``C`` centers for a LayerNorm; Gemma's offset is included.
        It is also the adjoint of the frozen linear part ``L`` through ``W``: ``<L(c) W, y> =
        <c, y (C diag(γ) W)ᵀ> / s`` (``C`` is symmetric), which lets a read be attributed to
        many contributions with one map of ``y`` instead of one map per contribution.
        """
        W = W * torch.as_tensor(self.gain(W), dtype=W.dtype).reshape(-1, 1)
        return W - W.mean(-2, keepdim=True) if self.kind == "layernorm" else W

    def apply(self, x: Float[Tensor, "*batch d_model"]) -> Float[Tensor, "*batch d_model"]:
        """The full norm computed from scratch (reference for the frozen form)."""
        return self.apply_frozen(x, self.scale(x).to(x.dtype))
