"""Subspace decomposition of every write.

A write ``w`` (one head, one attention total, one MLP, at one token) splits into its part in a
subspace ``S`` and the orthogonal rest, ``w = P_S w + (I − P_S) w``; its *energy fraction* in
``S`` is ``‖P_S w‖² / ‖w‖²``, and the two parts' fractions sum to 1. Named subspaces:

* ``mean``: the all-ones direction ``1/√d``, what LayerNorm's centering removes;
* ``unembed``: the top-k left singular vectors of ``C diag(γ_final) W_U`` (the final norm folded),
  the directions the logits read most (only with a trained LM head that reads the stream
  linearly: not BERT's MLM head, which transforms it first);
* ``pca``: the top principal components of the stream at a point, over real tokens of the
  trace, or of a calibration trace;
* ``basis``: any basis the user passes (probe directions, SAE decoder rows), orthonormalized;
  several named ones (``{"paris": rows, "negation": rows}``) are measured each on its own, as
  ``basis:paris`` and ``basis:negation`` (one direction each: a fraction per direction);
* ``W_O(h)``: the write subspace of every other head (the row space of its ``W_O``; in a
  sandwich model, of ``W_O`` through the write norm's linear part, as the write is added);
* reads: for every later reader (a head's Q, K, V; an MLP's input), the fraction of the write
  *as carried to the read point* (through every norm between them, frozen scales) that lies in
  the reader's read subspace, the column space of ``C diag(γ) W``, and the read strength
  ``‖w M‖ / (σ_max(M) ‖w‖)`` with ``M = C diag(γ) W`` (1 = read along its strongest direction).

``orthogonal_split`` splits a write into an ordered list of subspaces made mutually
orthogonal (each takes what the earlier ones left), so the parts and their fractions sum to
the write and to 1: the stacked bars of the app.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np
import pandas as pd
import torch
from jaxtyping import Float
from torch import Tensor

from ..decomposition import replay_states
from ..errors import InputError, UnknownNameError, as_index, check_flag, need_trace
from ..program import Read
from ..weights import VOCAB_SLICE
from .flow import component_label
from .results import CompactRepr
from .subspace_measures import (
    RANK_TOL,
    _fold_norm,
    head_write_bases,
    read_sums,
    reader_labels,
    reader_map,
    write_sums,
)
from .tokens import real


@dataclass(frozen=True, eq=False, repr=False)
class Subspace(CompactRepr):
    """A named subspace of ``d_model`` with an orthonormal basis (columns)."""

    name: str
    basis: Float[Tensor, "d_model k"]

    @classmethod
    def from_vectors(cls, name: str, vectors: Tensor) -> Subspace:
        """Orthonormalize spanning vectors given as columns ``[d_model, k]`` (rank-revealing)."""
        U, S, _ = torch.linalg.svd(vectors.float(), full_matrices=False)
        keep = S > RANK_TOL * S.max().clamp_min(1e-30)
        return cls(name, U[:, keep])

    def fraction(self, w: Float[Tensor, "*lead d_model"]) -> Float[Tensor, "*lead"]:
        """Energy fraction of ``w`` in this subspace (0 for a zero write)."""
        inside = (w @ self.basis.to(w.device)).pow(2).sum(-1)
        return inside / w.pow(2).sum(-1).clamp_min(1e-30)


def mean_direction(d_model: int) -> Subspace:
    """The all-ones direction."""
    return Subspace("mean", torch.ones(d_model, 1) / d_model ** 0.5)


def unembed_subspace(model, k: int = 32) -> Subspace:
    """Top-k left singular vectors of ``C diag(γ_final) W_U``.

    From its float64 Gram matrix ``M Mᵀ``, summed over ``VOCAB_SLICE``-column slices of the
    head's own weight (each folded in float32, as a float32 copy would be): no copy of the
    whole ``[d_model, d_vocab]`` matrix, which in float64 outweighs a small model's forward.
    """
    k = _directions("unembed_k", k, model.anatomy.d_model)
    spec, W = model.anatomy.norms.get("ln_final"), model.unembed(native=True).W_U
    gram = torch.zeros(W.shape[0], W.shape[0], dtype=torch.float64, device=W.device)
    for part in W.split(VOCAB_SLICE, -1):
        M = _fold_norm(spec, part.float()).double()
        gram += M @ M.T
    _, U = torch.linalg.eigh(gram)                                     # ascending eigenvalues
    return Subspace(f"unembed_top{k}", U[:, -k:].flip(-1).float())


def _directions(name: str, k: int, d_model: int) -> int:
    """``k`` directions, at most ``d_model`` (the whole space); ``InputError`` unless ``k`` ≥ 1."""
    count = as_index(k)
    if count is None or count < 1:
        raise InputError(f"{name} is a number of directions, at least 1, not {k!r}")
    return min(count, d_model)


def pca_subspace(trace, point: int | None = None, k: int = 16) -> Subspace:
    """Top-k principal components of the stream at ``point`` (default: after the last block).

    Fewer than ``k`` when the centred stream has a lower rank (``n`` tokens span at most
    ``n − 1`` directions, and ``d_model`` at most): a component whose singular value is below
    ``RANK_TOL`` of the largest is rounding noise, an arbitrary direction, and is left out. In
    float64. Named ``pca{held}@{point}`` by the components it holds, not by ``k``.
    """
    _directions("pca_k", k, trace.anatomy.d_model)  # more than d_model: as many as there are
    point = trace.anatomy.n_layers if point is None else point
    x = real(trace.stream(point), trace.attention_mask).double()
    x = x - x.mean(0, keepdim=True)
    _, S, Vh = torch.linalg.svd(x, full_matrices=False)
    keep = S[:k] > RANK_TOL * S.max()  # one token: S is 0, nothing kept
    return Subspace(f"pca{int(keep.sum())}@{point}", Vh[:k][keep].T.float())  # named by what it holds


def orthogonal_split(w: Float[Tensor, "*lead d_model"], subspaces: Sequence[Subspace]
                     ) -> tuple[tuple[str, ...], Float[Tensor, "*lead part"]]:
    """Energy fractions of ``w`` in ordered subspaces made mutually orthogonal, plus the rest.

    Each subspace keeps only what is orthogonal to all earlier ones, so fractions are
    non-negative and sum to 1 (the last part, ``"rest"``, is what no subspace holds).
    """
    taken = torch.zeros(w.shape[-1], 0, device=w.device)
    names, fracs = [], []
    energy = w.pow(2).sum(-1).clamp_min(1e-30)
    for s in subspaces:
        B = s.basis.to(w.device)
        B = B - taken @ (taken.T @ B)
        spans = B.numel() > 0 and B.abs().max() > RANK_TOL  # empty: a one-token text's PCA
        new = Subspace.from_vectors(s.name, B).basis if spans else B[:, :0]
        taken = torch.cat([taken, new], 1)
        names.append(s.name)
        fracs.append((w @ new).pow(2).sum(-1) / energy)
    names.append("rest")
    fracs.append(1 - torch.stack(fracs, -1).sum(-1) if fracs else torch.ones_like(energy))
    return tuple(names), torch.stack(fracs, -1)


@dataclass(frozen=True, eq=False, repr=False)
class WriteSubspaces(CompactRepr):
    """Mean (over real tokens) energy fractions of each write, and how later readers read it.

    ``named`` is ``[write, subspace]``; ``head_overlap`` ``[write, head]`` (fraction in each
    other head's ``W_O`` subspace; NaN for the writer itself); ``read_fraction`` and
    ``read_strength`` ``[write, reader]`` (NaN where the reader is not later).
    """

    writes: tuple[str, ...]
    subspaces: tuple[str, ...]
    named: Float[Tensor, "write subspace"]
    heads: tuple[str, ...]
    head_overlap: Float[Tensor, "write head"]
    readers: tuple[str, ...]
    read_fraction: Float[Tensor, "write reader"]
    read_strength: Float[Tensor, "write reader"]

    def to_frame(self) -> pd.DataFrame:
        """Long frame: ``write, target, measure, value`` (NaN entries dropped)."""
        frames = []
        for measure, cols, values in (
            ("fraction", self.subspaces, self.named),
            ("fraction_in_head_write", self.heads, self.head_overlap),
            ("read_fraction", self.readers, self.read_fraction),
            ("read_strength", self.readers, self.read_strength),
        ):
            f = pd.DataFrame(values.numpy(), index=list(self.writes), columns=list(cols))
            f = f.stack().rename("value").reset_index()
            f.columns = ["write", "target", "value"]
            frames.append(f.assign(measure=measure))
        return pd.concat(frames, ignore_index=True)[["write", "target", "measure", "value"]]


def _targets(label: str, wanted: set[str] | Sequence[str]) -> list[str]:
    """Which wanted writes a contribution counts toward: itself and/or its attention total."""
    comp = component_label(label)
    return [t for t in dict.fromkeys((label, comp)) if t in wanted]


def _sources(trace, wanted):
    """The trace's replay sources, per head only when a wanted write is one head's."""
    return trace.sources(heads=any(component_label(w) != w for w in wanted))


def writes_as_added(trace, wanted: set[str]) -> dict[str, Tensor]:
    """Each wanted write (head label, ``L3.attn`` total or ``L3.mlp``) as it is added.

    Returns label → ``[batch, pos, d_model]`` (after any sandwich norm on the write).
    """
    first: dict[str, Tensor] = {}
    for _, pieces in replay_states(trace.anatomy.program, _sources(trace, wanted)):
        for p in pieces:
            for lab, v in zip(p.labels, p.values, strict=True):
                first.setdefault(lab, v)  # the first time a label is seen is as it was added
    out: dict[str, Tensor] = {}
    for lab, v in first.items():
        for t in _targets(lab, wanted):
            out[t] = out[t] + v if t in out else v
    return out


def _read_measures(trace, writes: Sequence[str]):
    """Fraction and strength of each write (carried to each read point) in each later read.

    Measured at each read as the replay reaches it (only that read's carried writes are
    alive), in token chunks: memory stays at one read's writes plus a bounded product,
    whatever the depth.
    """
    mask = trace.attention_mask
    a = trace.anatomy
    comps = {c.name: c for c in a.components}
    n = max(int(mask.sum()), 1)
    measured: dict[str, tuple[Tensor, Tensor]] = {}
    for op, pieces in replay_states(a.program, _sources(trace, writes)):
        if not isinstance(op, Read):
            continue
        carried: dict[str, Tensor] = {}
        for p in pieces:
            for lab, v in zip(p.labels, p.values, strict=True):
                for t in _targets(lab, writes):
                    carried[t] = carried[t] + v if t in carried else v
        labels, M, index = reader_map(trace.model, comps[op.component])
        f = torch.full((len(writes), len(labels)), float("nan"))
        st = f.clone()
        present = [w for w in writes if w in carried]
        if present:
            rows = [writes.index(w) for w in present]
            W = torch.stack([real(carried[w], mask) for w in present], 1)       # (token, write, d)
            fs, ss = read_sums(W, M)
            f[rows], st[rows] = (fs[:, index] / n).float().cpu(), (ss[:, index] / n).float().cpu()
        measured[op.component] = f, st
    frac = torch.cat([measured[c.name][0] for c in a.components], 1)
    strength = torch.cat([measured[c.name][1] for c in a.components], 1)
    return reader_labels(trace.model), frac, strength


def named_subspaces(model, pca: Subspace, unembed_k: int = 32,
                    basis: object = None) -> list[Subspace]:
    """The named subspaces in order: mean, the unembedding's top-k, PCA, basis.

    The unembedding's only with an LM head that reads the stream itself: BERT's MLM head
    transforms it first (a nonlinear map), so ``W_U``'s directions are not the stream's.
    """
    subs = [mean_direction(model.anatomy.d_model), pca]
    if model.anatomy.has_lm_head and model.anatomy.modules.lm_head is None:
        subs.insert(1, unembed_subspace(model, unembed_k))
    if basis is not None:
        subs += [Subspace.from_vectors(name, rows.T)
                 for name, rows in named_bases(basis, model.anatomy.d_model).items()]
    return subs


def named_bases(basis: object, d: int | None = None) -> dict[str, Tensor]:
    """``{subspace name: rows [k, d]}`` of ``basis``: ``{"basis": rows}``, or ``"basis:NAME"`` per entry.

    ``basis``: rows (``basis_rows``), or a mapping of names to rows, each measured on its own. Each
    is checked by ``basis_rows``, its name in the message; an empty mapping or a name that is not a
    non-empty string is an ``InputError``.
    """
    if not isinstance(basis, Mapping):
        return {"basis": basis_rows(basis, d)}
    if not basis or not all(isinstance(k, str) and k for k in basis):
        raise InputError(f"a mapping of bases names each basis by a non-empty string, and holds at least one "
                         f"(got {list(basis)[:5]})")
    out = {}
    for name, rows in basis.items():
        try:
            out[f"basis:{name}"] = basis_rows(rows, d)
        except InputError as e:
            raise InputError(f"{name!r}: {e}") from None
    return out


def basis_rows(basis: object, d: int | None = None) -> Tensor:
    """``basis`` as float32 rows ``[k, d]``: ``InputError`` unless 2-D, ``d`` wide, finite and not all 0.

    ``d``: the stream's width (None where no model is at hand: any width passes).
    """
    want = "[k, d_model]" if d is None else f"[k, d_model={d}]"
    try:  # a numpy array or nested lists of rows too
        rows = torch.as_tensor(basis, dtype=torch.float32)
    except (TypeError, ValueError, RuntimeError):
        raise InputError(f"basis is rows of directions {want} (a tensor or an array), "
                         f"not a {type(basis).__name__}") from None
    if rows.ndim != 2 or min(rows.shape) < 1 or (d is not None and rows.shape[1] != d):
        raise InputError(f"basis is rows of directions {want}, not a tensor of shape {tuple(rows.shape)}")
    if not bool(rows.isfinite().all()) or not bool(rows.ne(0).any()):
        raise InputError("basis holds NaN, inf or only zeros: give finite directions")
    return rows


def write_subspaces(
    trace, *, writes: Sequence[str] | None = None, unembed_k: int = 32, pca_k: int = 16,
    pca_trace=None, basis: Tensor | np.ndarray | Sequence[Sequence[float]] | Mapping | None = None,
    readers: bool = True,
) -> WriteSubspaces:
    """Energy fractions of writes in the named subspaces (module docstring).

    Args:
        trace: The trace whose writes are split.
        writes: Labels (``"L3H5"``, ``"L3.attn"``, ``"L3.mlp"``); default every attention total
            and every MLP.
        unembed_k: Dimension of the unembedding subspace (skipped without an LM head, and
            with one that transforms the stream before ``W_U``: BERT's MLM head).
        pca_k: Number of stream principal components.
        pca_trace: A calibration trace for the PCs (default: ``trace`` itself), or the
            ``Subspace`` they span (what a corpus scan fixes from its first batch).
        basis: Extra subspace as rows ``[k, d_model]`` (probe directions, SAE decoder rows): a
            tensor, an array or nested lists; or a mapping of names to such rows, each its own
            subspace (``"basis:NAME"``).
        readers: Also measure every later reader's read fraction and strength.
    """
    need_trace(trace, "write_subspaces")
    check_flag("readers", readers)
    a = trace.anatomy
    if isinstance(writes, str):
        raise InputError(f"writes is a list of labels, e.g. [{writes!r}], not a string")
    if writes is not None and not len(writes):
        raise InputError("writes is empty: name the writes to measure, or leave it out (None) for "
                         "every attention total and MLP")
    if pca_trace is not None and not isinstance(pca_trace, Subspace):
        if not hasattr(pca_trace, "captured"):
            raise InputError("pca_trace is a trace, rs.trace(model, calibration_texts), or a Subspace; "
                             f"not a {type(pca_trace).__name__}")
        if pca_trace.model is not trace.model:
            raise InputError("pca_trace is a trace of another loaded model object: its stream's "
                             "principal components are not this model's; trace it with the same model")
    writes = tuple(writes or [c.name for c in a.components])
    values = writes_as_added(trace, set(writes))
    missing = [w for w in writes if w not in values]
    if missing:
        raise UnknownNameError(f"no writes named {missing}; use labels like 'L3H5', 'L3.attn', 'L3.mlp'")
    pca = pca_trace if isinstance(pca_trace, Subspace) else pca_subspace(pca_trace or trace, k=pca_k)
    subs = named_subspaces(trace.model, pca, unembed_k, basis)
    mask = trace.attention_mask
    head_bases = head_write_bases(trace.model)
    heads = tuple(f"L{L}H{h}" for L in range(a.n_layers) for h in range(a.n_heads))
    n = max(int(mask.sum()), 1)
    sums = [write_sums(real(values[w], mask), subs, head_bases) for w in writes]
    named = torch.stack([s for s, _ in sums]).div(n).float().cpu()
    overlap = torch.stack([h for _, h in sums]).div(n).float().cpu()
    for i, w in enumerate(writes):
        if w in heads:
            overlap[i, heads.index(w)] = float("nan")
    r_labels, r_frac, r_strength = (_read_measures(trace, writes) if readers
                                    else ((), torch.zeros(len(writes), 0), torch.zeros(len(writes), 0)))
    return WriteSubspaces(writes, tuple(s.name for s in subs), named, heads, overlap, r_labels,
                          r_frac, r_strength)


def write_vector(trace, write: str) -> Tensor:
    """One write (``"L3H5"``, ``"L3.attn"`` or ``"L3.mlp"``) as added, ``[batch, pos, d_model]``."""
    values = writes_as_added(trace, {write})
    if write not in values:
        raise UnknownNameError(f"no write named {write!r}; use labels like 'L3H5', 'L3.attn', 'L3.mlp'")
    return values[write]
