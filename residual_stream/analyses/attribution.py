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

import torch
from torch import Tensor

from ..capture import _forward_kwargs, edited, first_output, untouched
from ..errors import InputError, NotAvailableError, need_trace
from .ablation_args import checked_metric, metric_value, reference_trace
from .patching import StreamPatching, grid_axes


def _stream_gradients(trace, metric, points: tuple[int, ...]) -> dict[int, Tensor]:
    """``∂metric/∂x_L`` ``[batch, pos, d_model]`` at each of ``points``, from the clean run.

    Forward hooks keep the stream at each point (block 0's input turned into a leaf when
    nothing before it needs a gradient: a model with frozen weights); ``autograd.grad`` then
    computes those gradients only, leaving every parameter's ``.grad`` as it was.
    """
    model, a = trace.model, trace.anatomy
    n, kept = a.n_layers, {}

    def pre(point):
        def hook(module, args, kwargs):
            x = args[0] if args else kwargs["hidden_states"]
            if not x.requires_grad:
                x = x.detach().requires_grad_(True)
            kept[point] = x
            return ((x, *args[1:]), kwargs) if args else (args, {**kwargs, "hidden_states": x})
        return hook

    def post(module, args, output):
        kept[n] = first_output(output)

    edits = [(a.modules.layers[p], pre(p), True) for p in sorted({0, *points}) if p < n]
    edits += [(a.modules.layers[-1], post)] if n in points else []
    tokens = trace.tokens.to(model.device)
    kwargs = _forward_kwargs(model.module, tokens, trace.attention_mask.to(model.device), headless=False)
    with torch.inference_mode(False), torch.enable_grad(), untouched(model.module, hooks=False), \
            edited(model.module, edits):
        logits = getattr(model.module(**kwargs), "logits", None)
        if logits is None:
            raise NotAvailableError(f"{type(model.module).__name__}'s forward pass returned no logits")
        value = metric(logits.to(trace.tokens.device, torch.float32))
        if not isinstance(value, Tensor) or value.numel() != 1 or not value.requires_grad:
            raise InputError("attribution patching differentiates the metric: return one number as a "
                             "tensor computed from the logits (no .item() or float()), e.g. "
                             "(logits[rows, last, a] - logits[rows, last, b]).mean()")
        grads = torch.autograd.grad(value.sum(), [kept[p] for p in points], allow_unused=True)
    return {p: torch.zeros_like(kept[p]) if g is None else g.detach()
            for p, g in zip(points, grads, strict=True)}


def attribution_patching(trace, reference, metric: Callable[[Tensor], Tensor], *,
                         points: int | Sequence[int] | None = None,
                         positions: int | Sequence[int] | None = None) -> StreamPatching:
    """``patch_stream``'s grid estimated to first order: ``clean + ∂metric/∂x_L[p] · Δx_L[p]``.

    Same arguments as ``patch_stream`` (no ``batch_size``: one forward and one backward pass
    in all). ``metric`` must be differentiable: a tensor computed from the logits. The result
    is a ``StreamPatching`` with ``method="attribution"``; ``metric_clean`` and
    ``metric_reference`` are the two runs' measured values, so ``share()`` compares the
    estimate with the real gap. Memory: one forward pass's autograd graph.
    """
    need_trace(trace, "attribution_patching")
    if reference is None:
        raise InputError("attribution_patching takes the stream from a reference run: "
                         "reference=rs.trace(model, corrupted_texts), as many tokens as the trace")
    checked_metric(metric)
    a = trace.anatomy
    if not a.has_lm_head:
        raise NotAvailableError(f"the metric reads logits; {a.lm_head_note or 'this model has no LM head'}")
    reference_trace(trace, reference, "patch", "the stream")
    pts, pos, masks, tokens = grid_axes(trace, points, positions)
    clean = metric_value(metric, trace.logits.float().clone())
    grads = _stream_gradients(trace, metric, pts)
    out = torch.empty(len(pts), len(pos), dtype=torch.float64)
    for i, point in enumerate(pts):
        g = grads[point].to(trace.tokens.device, torch.float64)
        delta = reference.captured.resid[point].double() - trace.captured.resid[point].double()
        per_token = (g * delta.to(g.device)).sum(-1)  # [batch, pos]: each token's first-order change
        for j, where in enumerate(masks):
            out[i, j] = clean + float(per_token[where.to(per_token.device)].sum())
    reference_value = metric_value(metric, reference.logits.float().clone())
    return StreamPatching(pts, pos, tokens, out, clean, reference_value,
                          torch.zeros(len(pts), len(pos), dtype=torch.bool), "attribution")
