"""The token-wise measures behind ``subspaces``: energy fractions and read strengths as sums.

Shared by the single-trace analysis (``subspaces.write_subspaces``) and the corpus scan
(``streaming.subspaces``), so both compute the same arithmetic:

* ``write_sums``: a write's energy fraction in named subspaces and in every head's write
  subspace, summed over tokens (through one Gram matrix when that is cheaper);
* ``read_sums``: for writes carried to a read, the fraction inside each reader's read
  subspace and the read strength ``‖w M‖ / (σ_max ‖w‖)``, from one product with each map's
  left singular vectors, in token chunks of at most ``CHUNK_ELEMENTS``;
* ``reader_map``: a component's readers and their distinct maps ``C diag(γ) W`` (grouped-query
  copies once, ``map_steps``; the maps alone: ``read_maps``); ``ReadBasis``: the maps' bases,
  made once and reusable.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import TYPE_CHECKING

import torch
from jaxtyping import Float
from torch import Tensor

from ..weights import widened

if TYPE_CHECKING:
    from .subspaces import Subspace

RANK_TOL = 1e-6
CHUNK_ELEMENTS = 2 ** 22  # largest per-chunk temporary of a token-wise product (16 MiB fp32)


def _fold_norm(spec, W: Tensor) -> Tensor:
    return W if spec is None else spec.fold_into(W)


@dataclasses.dataclass(frozen=True)
class ReadBasis:
    """Orthonormal column-space bases of a batch of maps ``M [n, d, k]``, and their spectra.

    From one eigendecomposition of the smaller Gram matrix in float64 (``MᵀM`` or ``MMᵀ``,
    much faster than an SVD of a tall or wide map); ``r = min(d, k)`` columns, those beyond
    the numerical rank zeroed. ``S2 [n, r]``: squared singular values; ``sigma [n]``: the
    largest. Since ``M = U diag(S) Vᵀ`` with orthonormal ``V``, ``‖w M‖² = Σ_j (w·u_j)² S_j²``:
    one product with ``U`` gives both a write's energy in the column space and its read
    strength. Made once, it serves every later batch without another ``eigh`` (which waits
    for the device): a map with no more columns than rows (a head's query or key) keeps only
    ``R = V diag(1/S) [n, k, k]`` and rebuilds ``U = M R`` from the map (``U``); a wide map
    (an MLP's input) keeps ``U [n, d, d]`` itself.
    """

    S2: Tensor
    sigma: Tensor
    R: Tensor | None = None
    wide_U: Tensor | None = None

    @classmethod
    def of(cls, M: Tensor) -> ReadBasis:
        """The bases of ``M [n, d, k]`` (the class docstring)."""
        M64 = M.double()
        narrow = M.shape[-1] <= M.shape[-2]
        S2, vectors = torch.linalg.eigh(M64.mT @ M64 if narrow else M64 @ M64.mT)  # ascending
        S = S2.clamp_min(0).sqrt()
        keep = S > RANK_TOL * S.amax(-1, keepdim=True).clamp_min(1e-300)
        S = S * keep
        spectrum = dict(S2=S.pow(2).to(M.dtype), sigma=S.amax(-1).to(M.dtype))
        if narrow:
            inverse = torch.where(keep, 1 / S.clamp_min(1e-300), 0)
            return cls(**spectrum, R=vectors * inverse[:, None, :])
        return cls(**spectrum, wide_U=(vectors * keep[:, None, :]).to(M.dtype))

    def U(self, M: Tensor) -> Tensor:
        """The left singular vectors ``[n, d, r]`` of ``M`` (the maps this was made of)."""
        if self.R is None:
            return self.wide_U
        return (M.double() @ self.R.to(M.device)).to(M.dtype)


def _bases(M: Tensor) -> tuple[Tensor, Tensor]:
    """Orthonormal column-space bases of a batch ``M [n, d, k]``, and each largest singular value."""
    basis = ReadBasis.of(M)
    return basis.U(M), basis.sigma


def head_write_bases(model) -> Tensor:
    """Orthonormal bases of every head's write subspace (row space of ``W_O``): ``[head, d, d_head]``.

    Where the attention's write passes through a norm before it is added (sandwich), the space
    is that of the rows as added: ``W_O C diag(γ)``, the norm's frozen linear part (its
    per-token ``1/s`` scales a write without turning it), so a head's added write lies in its
    own space as it does without the norm.

    One layer at a time: the float64 temporaries of ``ReadBasis.of`` stay one layer's size.
    Stored as ``[d, head, d_head]`` (the result is a permuted view), so ``write_sums`` reads
    every head's basis as one ``[d, head × d_head]`` matrix without copying it. Where blocks'
    heads differ in width (Gemma 4), narrower heads' bases end in zero columns, which hold no
    energy.
    """
    a = model.anatomy
    bases = torch.cat([widened(_bases(a.as_added(f"L{L}.attn", model.weights(L).W_O).transpose(-1, -2))[0],
                               a.d_head) for L in range(a.n_layers)])
    return bases.permute(1, 0, 2).contiguous().permute(1, 0, 2)


def map_steps(model, comp, weights=None) -> tuple[int, ...]:
    """Per read channel of ``comp`` (queries, keys), the stride over heads to its distinct maps.

    Grouped-query attention repeats each key map for ``n_heads / n_kv_heads`` heads: its
    stride is that ratio when the maps really repeat (one comparison, a read of the device),
    else 1. ``()`` for an MLP. Fixed by the weights, so a scan finds it once.
    """
    if comp.kind != "attn":
        return ()
    a = model.anatomy
    rep = a.n_heads // max(a.heads_at(comp.layer)[1], 1)
    w = weights or model.weights(comp.layer)
    return tuple(rep if rep > 1 and torch.equal(W, W[::rep].repeat_interleave(rep, 0)) else 1
                 for W, _ in w.attention_reads())


def reader_names(anatomy, comp) -> list[str]:
    """A component's readers: ``L3H5.q``/``.k``/``.v`` for each head of an attention, ``L3.mlp.in``."""
    if comp.kind != "attn":
        return [f"L{comp.layer}.mlp.in"]
    return [f"L{comp.layer}H{h}.{ch}" for ch in "qkv" for h in range(anatomy.n_heads)]


def reader_map(model, comp, weights=None, steps: tuple[int, ...] | None = None,
               ) -> tuple[list[str], Tensor, Tensor]:
    """A component's reader labels, its distinct read maps (``read_maps``), each reader's map index.

    ``steps``: ``map_steps`` found before (else found here).
    """
    a = model.anatomy
    w = weights or model.weights(comp.layer)
    steps = map_steps(model, comp, w) if steps is None else steps
    index, offset = [torch.zeros(1, dtype=torch.long)] if comp.kind != "attn" else [], 0
    for step in steps:  # each channel's heads, pointing at its distinct maps
        index.append(torch.arange(a.n_heads) // step + offset)
        offset += -(-a.n_heads // step)
    return reader_names(a, comp), read_maps(model, comp, w, steps), torch.cat(index)


def read_maps(model, comp, weights, steps: tuple[int, ...]) -> Tensor:
    """A component's distinct read maps ``M [m, d, k] = C diag(γ) W``.

    The reading norm folded; a query/key norm's gain folded into ``W``
    (``LayerWeights.attention_reads``); heads sharing a key/value map under grouped-query
    attention share one row of ``M`` (``steps``: ``map_steps``).
    """
    spec = model.anatomy.norms.get(comp.reads_through) if comp.reads_through else None
    if comp.kind != "attn":
        return _fold_norm(spec, weights.mlp_read()[0][None])
    channels = weights.attention_reads()  # queries, keys, values: gains folded in
    return _fold_norm(spec, torch.cat([W[::step] for (W, _), step in zip(channels, steps, strict=True)]))


def reader_labels(model) -> tuple[str, ...]:
    """Every reader, in the order of ``WriteSubspaces.readers`` (components in order)."""
    return tuple(r for comp in model.anatomy.components for r in reader_names(model.anatomy, comp))


def _chunks(n_tokens: int, per_token: int):
    """Token slices whose ``[chunk, per_token]`` temporaries stay near ``CHUNK_ELEMENTS``."""
    step = max(1, CHUNK_ELEMENTS // max(per_token, 1))
    return (slice(t, t + step) for t in range(0, n_tokens, step))


def _masked_sum(values: Tensor, weight: Tensor | None) -> Tensor:
    """Sum over the leading (token) axis, padding (``weight`` False) left out; float64."""
    if weight is not None:
        values = torch.where(weight.reshape(-1, *([1] * (values.ndim - 1))), values, 0)
    return values.sum(0).double()


def write_sums(x: Float[Tensor, "token d_model"], subspaces: Sequence[Subspace], head_bases: Tensor,
               weight: Tensor | None = None) -> tuple[Tensor, Tensor]:
    """Token sums of one write's energy fraction in each subspace ``[s]`` and each head's ``[head]``.

    A fraction is ``‖Bᵀ ŵ‖²`` for the unit write ``ŵ = w/‖w‖``, so its token sum is
    ``tr(Bᵀ G B)`` with ``G = Σ_t ŵ_t ŵ_tᵀ``: with more tokens than ``d_model`` one
    ``[d, d]`` Gram matrix replaces the ``[token, head × d_head]`` product. ``weight`` (bool per
    token) leaves padding out; the analysis passes real tokens only. The Gram route costs
    ``T d² + d² D`` multiply-adds against ``T d D`` for the direct one (``T`` tokens, ``D`` the
    heads' total width, ``n_layers × d_model`` in most models); the cheaper is taken. Either
    is one product with all heads' bases as ``[d, head × d_head]`` (a view of
    ``head_write_bases``' layout, a copy of any other).
    """
    B = torch.cat([s.basis.to(x.device, x.dtype) for s in subspaces], 1)
    widths = [s.basis.shape[1] for s in subspaces]
    T, d = x.shape
    H, _, k = head_bases.shape
    Q = head_bases.permute(1, 0, 2).reshape(d, H * k).to(x.device, x.dtype)   # (d, head × d_head)
    unit = x / x.pow(2).sum(-1, keepdim=True).clamp_min(1e-30).sqrt()          # 0 for a zero write
    if weight is not None:
        unit = torch.where(weight[:, None], unit, 0)
    if T * d + d * H * k < T * H * k:
        G = unit.T @ unit                                                      # (d, d)
        named = torch.stack([(G @ b * b).sum() for b in B.split(widths, -1)])
        heads = ((G @ Q) * Q).view(d, H, k).sum((0, 2))                        # tr(Qᵀ G Q) per head
        return named.double(), heads.double()
    named = torch.stack([p.pow(2).sum(-1) for p in (unit @ B).split(widths, -1)], -1).sum(0)
    heads = (unit @ Q).view(T, H, k).pow(2).sum((0, 2))
    return named.double(), heads.double()


def read_sums(x: Float[Tensor, "token write d_model"], M: Tensor, slots: Tensor | None = None,
              weight: Tensor | None = None, basis: ReadBasis | None = None,
              ) -> tuple[Tensor, Tensor]:
    """Token sums of ``‖w U‖²/‖w‖²`` and ``‖w M‖/(σ_max ‖w‖)`` per write and map ``[write, m]``.

    ``U`` spans the column space of each map ``M [m, d, k]``; both measures come from one
    product with ``U`` (``ReadBasis``, made here unless ``basis`` brings it), at most ``d``
    columns per map even for a wide one.
    ``slots`` picks the writes along axis 1 of ``x`` (a view of a larger buffer); ``weight``
    (bool per token) leaves padding out. Tokens go in chunks so no ``[chunk, write, m, r]``
    product outgrows ``CHUNK_ELEMENTS``; a 16-bit ``x`` is upcast to ``U``'s dtype per chunk.
    """
    basis = ReadBasis.of(M) if basis is None else basis
    U, S2, sigma = basis.U(M), basis.S2, basis.sigma
    n_writes = x.shape[1] if slots is None else len(slots)
    frac = torch.zeros(n_writes, M.shape[0], dtype=torch.float64, device=x.device)
    strength = torch.zeros_like(frac)
    for part in _chunks(len(x), n_writes * U.shape[0] * U.shape[2]):
        c = (x[part] if slots is None else x[part].index_select(1, slots)).to(U.dtype)  # (t, w, d)
        energy = c.pow(2).sum(-1, keepdim=True).clamp_min(1e-30)
        coords = torch.einsum("twd,mdr->twmr", c, U).pow_(2)                    # (w·u_j)²
        inside, read = coords.sum(-1), (coords * S2).sum(-1)
        w = None if weight is None else weight[part]
        frac += _masked_sum(inside / energy, w)
        strength += _masked_sum(read.sqrt() / (sigma * energy.sqrt()), w)
    return frac, strength
