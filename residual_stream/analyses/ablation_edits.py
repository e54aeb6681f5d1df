"""How ``ablation_check`` ablates one write in a pass: the hooks replacing it, per stacked copy.

A whole attention's or MLP's write is replaced at its module (its output; its input where the
MLP's write is that, ``ModulePaths.mlp_out_input``); one head's through its slice of the output
projection's input ``z``, which the projection maps linearly.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from ..hookio import first_input, first_output, with_first_input
from ..walk import component_of, head_of
from ..weights import attn_W_O
from .patching import ALL, copy_rows, in_rows


def _replacement(clean: Tensor, mask: Tensor, mode: str) -> Tensor:
    """What a write ``clean [batch, pos, k]`` is replaced by.

    Zeros or its mean over real tokens (``[k]``), or itself (``"patch"``: the reference's write).
    """
    if mode == "zero":
        return clean.new_zeros(clean.shape[-1])
    if mode == "patch":
        return clean
    return clean[mask.bool().to(clean.device)].mean(0)


def _ablated_output(trace, write: str, mode: str, source, where: Tensor | None, rows: slice = ALL):
    """``(module path, forward hook)`` replacing a whole attention's or MLP's output.

    (A forward pre-hook, ``(path, hook, True)``, replacing its input where the MLP's write is
    its module's input: ``ModulePaths.mlp_out_input``.)

    ``source``: the trace whose real tokens give the mean (``trace`` or a reference);
    ``where``: the ``[batch, pos]`` positions replaced (None: every one); ``rows``: the rows of
    the pass that are this ablation's (one copy of the batch among several stacked).
    """
    layer, kind = component_of(write)
    clean = source.attn_write(layer) if kind == "attn" else source.mlp_write(layer)
    value = _replacement(clean, source.attention_mask, mode)
    m = trace.anatomy.modules
    path = (m.attn_out if kind == "attn" else m.mlp_out)[layer]

    def replaced(out: Tensor) -> Tensor:
        new = value.to(out.device, out.dtype).expand_as(out)
        return new if where is None else torch.where(where.to(out.device)[..., None], new, out)

    def hook(module, args, output):
        return in_rows(output, rows, replaced(first_output(output)[rows]))

    def pre_hook(module, args, kwargs):  # the write is the module's input (Gemma 4's experts)
        x = first_input(args, kwargs)
        return with_first_input(args, kwargs, in_rows(x, rows, replaced(x[rows])))

    return (path, pre_hook, True) if kind == "mlp" and m.mlp_out_input else (path, hook)


def _ablated_head(trace, write: str, mode: str, source, where: Tensor | None, rows: slice = ALL):
    """``(module path, forward hook)`` replacing one head's part of the attention's output.

    The output projection is linear, so head ``h``'s part is ``z_h W_O[h]`` of the projection's
    own input ``z`` in this run: the hook adds ``(v − z_h) W_O[h]`` (``v`` zeros, or the clean
    ``z_h``'s mean over ``source``'s real tokens), leaving the other heads and ``b_O`` as they are;
    only at ``where`` and in ``rows`` (as ``_ablated_output``'s).
    """
    layer, h, _ = head_of(write)
    a = trace.anatomy
    path = a.modules.attn_out[layer]
    W_O = attn_W_O(trace.model.module.get_submodule(path), a.n_heads)[h].float()  # (d_head, d)
    k = W_O.shape[0]
    value = _replacement(source.captured.z[layer][..., h * k:(h + 1) * k], source.attention_mask, mode)

    def hook(module, args, output):
        z = args[0][rows][..., h * k:(h + 1) * k].float()
        out = first_output(output)[rows]
        delta = value.to(z.device) - z
        if where is not None:
            delta = delta * where.to(z.device)[..., None]
        return in_rows(output, rows, (out.float() + delta @ W_O.to(z.device)).to(out.dtype))

    return path, hook


@dataclass(frozen=True)
class Edit:
    """How each write is ablated: ``mode``, from ``source``, at ``where`` (None: everywhere)."""

    trace: object
    mode: str
    source: object
    where: Tensor | None

    def __call__(self, write: str, copy: int = 0, copies: int = 1) -> tuple:
        """``(module path, hook)`` ablating ``write`` in copy ``copy`` of ``copies`` stacked batches."""
        rows = copy_rows(self.trace, copy) if copies > 1 else ALL
        build = _ablated_head if head_of(write) else _ablated_output
        return build(self.trace, write, self.mode, self.source, self.where, rows)
