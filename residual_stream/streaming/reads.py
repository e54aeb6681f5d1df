"""Read attribution's shares of one read, from the contributions carried in ``flow.FlowSums``.

Per reader ``y = N(x) W + b`` (on read attribution's tokens) the share of source ``c`` is
``<L(c) W, y>/‖y‖² = <c, y (C diag(γ) W)ᵀ>/(s ‖y‖²)``: ``L`` the reading norm's frozen
linear part, its gain and centering folded into each map (``NormSpec.fold_into``, a pass
over the weights) and its per-token ``1/s`` into the denominator, so ``y Wᵀ`` is never
mapped. One product of ``y`` per reader, then, in ``READ_CHUNKS`` token chunks, one
batched product of every contribution with every folded map (``read_sums``): neither
``[token, map, d_model]`` nor a float32 copy of a 16-bit buffer is ever whole. Heads that
share a key/value map (grouped-query attention) share their shares: each distinct map is
computed once and its row repeated for its heads.
"""

from __future__ import annotations

import torch
from torch import Tensor

from ..analyses.flow import READ_MAP_BIAS, READ_NORM_BIAS, read_channels
from ..walk import component_of
from .carry import token_sum

READ_CHUNKS = 16  # token chunks of a read's products: each 1/16 of its [token, map + source, d]


def read_shares(model, component: str, spec, scale: Tensor | None, x: Tensor, c: Tensor,
                real: Tensor, weights) -> list[tuple[list[str], list[str], Tensor, Tensor]]:
    """Every linear read of ``component``: (readers, extra sources, share sums, |share| sums).

    ``x [token, d]``: the stream the component reads; ``c [token, source, d]``: its
    contributions (any dtype); ``spec``/``scale``: the reading norm and its per-token scale
    (None for a read without a norm); ``real``: the tokens counted; ``weights``: the block's
    ``LayerWeights``. Sums are float64 ``[reader, source + extra]``; the extra sources are
    the norm's bias (``READ_NORM_BIAS``) and the map's (``READ_MAP_BIAS``), when present.
    """
    u = x if spec is None else spec.apply_frozen(x, scale)
    tiny = torch.finfo(u.dtype).tiny
    anatomy = model.anatomy
    channels, n_kv = [], anatomy.heads_at(component_of(component)[0])[1]
    for readers, W, b in read_channels(model, component, weights):
        rep = anatomy.n_heads // n_kv if readers[0][-2:] in (".k", ".v") else 1
        W = W[::rep].to(u.device, u.dtype)                                    # (map, d, k)
        b = None if b is None else b[::rep].to(u.device, u.dtype)
        channels.append((readers, rep, W, b))
    den = u.new_empty(len(u), sum(len(W) for _, _, W, _ in channels))
    col, extras, maps = 0, [], []
    for readers, rep, W, b in channels:
        cols = slice(col, col + len(W))
        col += len(W)
        y = (u @ W.permute(1, 0, 2).flatten(1)).view(len(u), *W.shape[::2])  # (token, map, k)
        if b is not None:
            y = y + b
        maps.append((cols, y, W if spec is None else spec.fold_into(W)))
        d = den[:, cols]
        torch.sum(y.pow(2), -1, out=d)
        d.clamp_min_(tiny)
        names, extra = [], []
        if spec is not None and spec.bias is not None:                        # <β W, y>
            names.append(READ_NORM_BIAS)
            bW = torch.einsum("d,mdk->mk", spec.bias.to(u.device, u.dtype), W)
            extra.append((y * bW).sum(-1) / d)
        if b is not None:
            names.append(READ_MAP_BIAS)
            extra.append((y * b).sum(-1) / d)
        extras.append((readers, rep, len(W), names, torch.stack(extra, 1) if extra else None))
    if scale is not None:
        den = den * scale.to(den.dtype)[:, None]                              # Lᵀ's 1/s
    sums, abs_sums = read_sums(c, maps, den, real)
    out, col = [], 0
    for readers, rep, n_maps, names, extra in extras:
        s, a = sums[:, col: col + n_maps], abs_sums[:, col: col + n_maps]
        col += n_maps
        if extra is not None:
            s = torch.cat([s, token_sum(extra, real)])
            a = torch.cat([a, token_sum(extra.abs(), real)])
        if rep > 1:
            s, a = s.repeat_interleave(rep, 1), a.repeat_interleave(rep, 1)
        out.append((readers, names, s.T, a.T))
    return out


def read_sums(c: Tensor, maps: list, den: Tensor, real: Tensor) -> tuple[Tensor, Tensor]:
    """Float64 sums over ``real`` tokens of every source's share and its absolute value.

    ``share[t, i, m] = <c[t, i], h[t, m]> / den[t, m]`` with ``h[t, m] = y_m[t] F_mᵀ`` (the
    folded map ``F_m``), for ``maps`` = ``(columns, y [token, map, k], F [map, d, k])``. In
    ``READ_CHUNKS`` token chunks, ``h`` and the float32 copy of a 16-bit buffer made per
    chunk: neither is ever ``[token, map, d_model]`` or ``[token, source, d_model]`` whole
    (on SmolLM2 at 32×512 they were 566 MB of ``h`` beside 288 MB of upcast buffer).
    """
    n_src, n_maps = c.shape[1], den.shape[1]
    sums = torch.zeros(n_src, n_maps, dtype=torch.float64, device=den.device)
    abs_sums = torch.zeros_like(sums)
    step = max(1, -(-len(c) // READ_CHUNKS))
    for start in range(0, len(c), step):
        rows = slice(start, start + step)
        h = den.new_empty(len(den[rows]), n_maps, c.shape[-1])             # (token, map, d)
        for cols, y, folded in maps:
            torch.bmm(y[rows].transpose(0, 1), folded.transpose(1, 2), out=h[:, cols].transpose(0, 1))
        share = torch.bmm(c[rows].to(h.dtype), h.transpose(1, 2)) / den[rows, None]
        sums += token_sum(share, real[rows])                              # share: (token, source, map)
        abs_sums += token_sum(share.abs(), real[rows])
    return sums, abs_sums
