"""Attribution patching: every stream patch of ``patch_stream`` estimated from one backward pass.

Patching the stream at point ``L`` and token ``p`` replaces the clean state ``x_L[p]`` by the
reference's ``x'_L[p]``. To first order the metric then moves by
``∂metric/∂x_L[p] · (x'_L[p] − x_L[p])`` (attribution patching: Nanda 2023; Syed, Rager and
Conmy 2023). One forward pass of the clean run keeping the gradient at every stream point,
and one backward pass, give every cell of the grid: about three forward passes' cost instead
of one per cell. The estimate is exact where the model is linear in the patched state between
that point and the metric, and drifts where norm scales, attention patterns and
nonlinearities bend (large patches: a corrupted name at the embeddings). ``patch_stream``
measures the same grid; check the estimate against it on a few prompts before trusting it
on many.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
import pandas as pd
import torch
from jaxtyping import Float
from torch import Tensor

from ..capture import _forward_kwargs
from ..contexts import edited, untouched
from ..errors import InputError, NotAvailableError
from ..hookio import first_input, first_output, with_first_input
from ..walk import component_of, head_of
from .ablation_args import checked_patching, checked_writes, metric_values, reference_metric, text_shares
from .patching import StreamPatching, grid_axes, grid_result, position_axis
from .results import CompactRepr

NOT_DIFFERENTIABLE = ("attribution patching differentiates the metric: return one number as a tensor "
                      "computed from the logits (no .item(), float() or .numpy(), and no in-place change "
                      "of the logits), e.g. (logits[rows, last, a] - logits[rows, last, b]).mean()")


def _gradients(trace, metric, wanted: dict[tuple[str, int], tuple[str, bool]]) -> dict[tuple, Tensor]:
    """``∂metric/∂t`` for each tensor ``t`` of the clean run named in ``wanted``.

    ``wanted``: ``key → (module path, is_input)``: the module's first input (a block's stream,
    an output projection's ``z``) or its main output. Block 0's input is turned into a leaf when
    nothing before it needs a gradient (a model with frozen weights), so every later tensor
    is in the graph; ``autograd.grad`` then computes these gradients only, leaving every
    parameter's ``.grad`` as it was.
    """
    model, a = trace.model, trace.anatomy
    kept: dict[tuple, Tensor] = {}

    def pre(key, leaf):
        def hook(module, args, kwargs):
            x = first_input(args, kwargs)
            if leaf and not x.requires_grad:
                x = x.detach().requires_grad_(True)
            if key is not None:
                kept[key] = x
            return with_first_input(args, kwargs, x)
        return hook

    def post(key):
        return lambda module, args, output: kept.__setitem__(key, first_output(output))

    first = ("point", 0)
    edits = [(a.modules.layers[0], pre(first if first in wanted else None, True), True)]
    edits += [(path, pre(key, False), True) if is_input else (path, post(key))
              for key, (path, is_input) in wanted.items() if key != first]
    tokens = trace.tokens.to(model.device)
    kwargs = _forward_kwargs(model.module, tokens, trace.attention_mask.to(model.device), headless=False)
    with torch.inference_mode(False), torch.enable_grad(), untouched(model.module, hooks=False), \
            edited(model.module, edits, tokens.shape):
        try:
            logits = getattr(model.module(**kwargs), "logits", None)
            if logits is None:
                raise NotAvailableError(f"{type(model.module).__name__}'s forward pass returned no logits")
            value = metric(logits.to(trace.tokens.device, torch.float32))
            rows = trace.tokens.shape[0]
            if not isinstance(value, Tensor) or value.numel() not in (1, rows) or not value.requires_grad:
                raise InputError(NOT_DIFFERENTIABLE)
            keys = list(wanted)
            grads = torch.autograd.grad(value.sum(), [kept[k] for k in keys], allow_unused=True)
        except RuntimeError as e:
            explained = _explained(e)
            if explained is None:
                raise
            raise explained from e
    return {k: torch.zeros_like(kept[k]) if g is None else g.detach()
            for k, g in zip(keys, grads, strict=True)}


def _explained(e: RuntimeError) -> InputError | None:
    """Autograd's own error for a metric or model it cannot differentiate, said for this call."""
    if "Inference tensors" in str(e):
        return InputError("the model's weights were made inside torch.inference_mode(), which autograd "
                          "cannot use: build or load the model outside it")
    if "requires grad" in str(e) or "inplace" in str(e):
        return InputError(f"{NOT_DIFFERENTIABLE} ({e})")
    return None


def attribution_patching(trace, reference, metric: Callable[[Tensor], Tensor], *,
                         points: int | Sequence[int] | None = None,
                         positions: int | Sequence[int] | None = None) -> StreamPatching:
    """``patch_stream``'s grid estimated to first order: ``clean + ∂metric/∂x_L[p] · Δx_L[p]``.

    Same arguments as ``patch_stream`` (no ``batch_size``: one forward and one backward pass
    in all). ``metric`` must be differentiable: a tensor computed from the logits. The result
    is a ``StreamPatching`` with ``method="attribution"`` (per text too, for a metric returning one
    value per text: the gradient of their sum gives each text its own); ``metric_clean`` and
    ``metric_reference`` are the two runs' measured values, so ``share()`` compares the
    estimate with the real gap. Memory: one forward pass's autograd graph.
    """
    checked_patching(trace, reference, metric, "attribution_patching", "the stream")
    pts, pos, masks, tokens = grid_axes(trace, points, positions)
    rows = trace.tokens.shape[0]
    clean = metric_values(metric, trace.logits.float().clone(), rows)
    layers = trace.anatomy.modules.layers
    grads = _gradients(trace, metric, {("point", p): (layers[min(p, len(layers) - 1)], p < len(layers))
                                       for p in pts})
    out = torch.stack([_per_text(clean, grads["point", p],
                                 reference.captured.resid[p] - trace.captured.resid[p], masks) for p in pts])
    reference_values = reference_metric(metric, reference.logits.float().clone(), rows, clean)
    return grid_result(pts, pos, tokens, out, clean, reference_values,
                       torch.zeros(len(pts), len(pos), dtype=torch.bool), "attribution")


def _per_text(clean: Tensor, grad: Tensor, delta: Tensor, masks: list[Tensor]) -> Tensor:
    """``[mask, k]``: ``clean + Σ grad · delta`` over each mask's tokens.

    Summed over the texts for one metric (``k = 1``), or per text for one metric per text
    (each depends on its own row only).
    """
    per_token = (grad.double() * delta.double().to(grad.device)).sum(-1).cpu()  # [batch, pos]
    sums = torch.stack([(per_token * m.cpu()).sum(1) for m in masks])          # [mask, batch]
    return clean + (sums.sum(1, keepdim=True) if len(clean) == 1 else sums)


@dataclass(frozen=True, eq=False, repr=False)
class WritePatching(CompactRepr):
    """Estimated metric with each write patched from the reference run (attribution patching).

    ``metric [write, position]``: the metric estimated with that write (a head's part of the
    attention output, a whole attention or an MLP, before any sandwich norm) patched at that
    token in every row where it is real; ``total [write]``: patched at every real token, the
    estimate of ``ablation_check(mode="patch", reads=False)``'s ``metric``. ``metric_clean``,
    ``metric_reference``: the two runs' measured values. With a metric returning one value per
    text: ``per_text [write, position, batch]``, ``per_text_total [write, batch]``,
    ``per_text_clean`` and ``per_text_reference`` ``[batch]``, and the fields above their means
    over texts (None otherwise).
    """

    writes: tuple[str, ...]
    positions: tuple[int, ...]
    tokens: tuple[str, ...]
    metric: Float[Tensor, "write position"]
    total: Float[Tensor, " write"]
    metric_clean: float
    metric_reference: float
    per_text: Float[Tensor, "write position batch"] | None = None
    per_text_total: Float[Tensor, "write batch"] | None = None
    per_text_clean: Float[Tensor, " batch"] | None = None
    per_text_reference: Float[Tensor, " batch"] | None = None

    def share(self) -> Float[Tensor, " write"]:
        """Each write's ``(total − clean) / (reference − clean)``: the part of the gap it carries."""
        gap = self.metric_reference - self.metric_clean
        return (self.total - self.metric_clean) / gap if gap else torch.full_like(self.total, float("nan"))

    def text_share(self) -> Float[Tensor, "write batch"]:
        """Each text's ``share`` (NaN where its two runs agree); needs a per-text metric."""
        return text_shares(self.per_text_total, self.per_text_clean, self.per_text_reference)

    def to_frame(self, per_text: bool = False) -> pd.DataFrame:
        """Per write: ``write, metric, metric_change, metric_share``, largest change first.

        ``per_text=True``: a row per write and text (``text``; each text's own values), the
        writes in the same order.
        """
        frame = pd.DataFrame({"write": self.writes, "metric": self.total.numpy(),
                              "metric_change": (self.total - self.metric_clean).numpy(),
                              "metric_share": self.share().numpy()})
        order = frame.metric_change.abs().sort_values(ascending=False).index
        if not per_text:
            return frame.reindex(order).reset_index(drop=True)
        share, b = self.text_share()[list(order)], self.per_text_total.shape[-1]
        total = self.per_text_total[list(order)]
        return pd.DataFrame({"write": np.repeat([self.writes[i] for i in order], b),
                             "text": list(range(b)) * len(order), "metric": total.flatten().numpy(),
                             "metric_change": (total - self.per_text_clean).flatten().numpy(),
                             "metric_share": share.flatten().numpy()})


def attribution_patching_writes(trace, reference, metric: Callable[[Tensor], Tensor], *,
                                writes: Sequence[str] | None = None,
                                positions: int | Sequence[int] | None = None) -> WritePatching:
    """Every write's patch estimated to first order from one forward and one backward pass.

    ``writes``: head names (``"L3H5"``) or components (``"L3.attn"``, ``"L3.mlp"``), default
    every head of the model; ``positions`` as ``patch_stream``'s (default every position).
    ``metric``: one number, or one per text (``[batch]``: per-text results besides their means).
    A head's estimate is ``∂metric/∂z_h · Δz_h`` through its slice ``z_h`` of the output
    projection's input (so a whole attention's is the sum of its heads'), an MLP's through its
    output. Measure the writes that matter with ``ablation_check(mode="patch", reads=False)``.
    """
    checked_patching(trace, reference, metric, "attribution_patching_writes", "each write")
    a = trace.anatomy
    names, owners = checked_writes(trace, a.heads if writes is None else writes)
    pos, masks, tokens = position_axis(trace, positions)
    rows = trace.tokens.shape[0]
    clean = metric_values(metric, trace.logits.float().clone(), rows)
    wanted = {}
    for owner in owners:
        layer, kind = component_of(owner)
        wanted[kind if kind == "mlp" else "z", layer] = (a.modules.mlp_out[layer], a.modules.mlp_out_input) \
            if kind == "mlp" else (a.modules.attn_out[layer], True)
    grads = _gradients(trace, metric, wanted)
    each = masks + [trace.attention_mask.bool()]  # every position's, then every real token's
    out = torch.stack([_per_text(clean, *_write_delta(trace, reference, w, owner, grads), each)
                       for w, owner in zip(names, owners, strict=True)])   # [write, mask, k]
    reference_values = reference_metric(metric, reference.logits.float().clone(), rows, clean)
    per_text = len(clean) > 1
    return WritePatching(tuple(names), pos, tokens, out[:, :-1].mean(-1), out[:, -1].mean(-1),
                         float(clean.mean()), float(reference_values.mean()),
                         out[:, :-1] if per_text else None, out[:, -1] if per_text else None,
                         clean if per_text else None, reference_values if per_text else None)


def _write_delta(trace, reference, write: str, owner: str, grads: dict) -> tuple[Tensor, Tensor]:
    """``(gradient, reference − clean)`` of ``write``.

    A head's slice of ``z``, an attention's whole ``z`` (its heads' estimates summed), or an
    MLP's output. ``owner``: the component ``write`` is (part of).
    """
    layer, kind = component_of(owner)
    if kind == "mlp":
        return grads["mlp", layer], reference.mlp_write(layer) - trace.mlp_write(layer)
    z = reference.captured.z[layer] - trace.captured.z[layer]
    head = head_of(write)
    if head is None:
        return grads["z", layer], z
    k = z.shape[-1] // trace.anatomy.n_heads
    part = slice(head[1] * k, (head[1] + 1) * k)
    return grads["z", layer][..., part], z[..., part]
