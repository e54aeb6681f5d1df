"""Weight-only composition scores between components (Elhage et al. 2021).

A head writes through ``W_OV = W_V W_O`` and a later head reads through ``W_QK = W_Q W_Kᵀ``
(queries and keys) or its own ``W_OV`` (values). With each head's input norm's gain folded in
(``C diag(γ) W``, ``C`` the centering of a LayerNorm; Gemma's ``1 + γ``), into a writer's
``W_V`` as into a reader's ``W_Q``, ``W_K`` and ``W_V`` (TransformerLens's ``fold_ln``: a
head's ``W_OV`` is the same map whichever side of a pair it is on), the scores are
TransformerLens's

    Q-composition  ‖W_OV^i W_QK^j‖_F  / (‖W_OV^i‖_F ‖W_QK^j‖_F)
    K-composition  ‖W_OV^i W_QK^jᵀ‖_F / (‖W_OV^i‖_F ‖W_QK^j‖_F)
    V-composition  ‖W_OV^i W_OV^j‖_F  / (‖W_OV^i‖_F ‖W_OV^j‖_F)

(row-vector convention: ``x W_OV^i`` is head i's write of ``x``). Where the model puts an
RMSNorm on queries and keys after their projections (Qwen3, OLMo 2, Gemma 3), its gain is
folded into each head's ``W_Q`` / ``W_K`` as well (``W_Q diag(g_Q)``): with the per-token
scales frozen, the attention score is ``x W_Q diag(g_Q) diag(g_K) W_Kᵀ yᵀ`` up to a positive
factor per token, which the normalized scores do not see (``attention_read_maps``).

The analogues for MLPs use ``W_out`` as an MLP's write map and ``W_in`` as its read map (a
gated MLP's ``W_gate`` is left out): head → MLP ``‖W_OV^i W_in^j‖ / (‖W_OV^i‖ ‖W_in^j‖)``,
MLP → head (Q, K, V) likewise.

Where a write passes through a norm before it is added (sandwich: Gemma 2-3, OLMo 2's
post-norms), its map is taken as added, ``W_O C diag(γ)`` and ``W_out C diag(γ)``, as the
reading norm's is folded into the read maps. A write then reaches a later reader through
every norm of the whole stream between them (post-norm: BERT's LayerNorms after each
attention and MLP; DeepNorm), each, with its per-token scale frozen, ``C diag(γ)`` up to a
positive factor per token; DeepNorm's α is another. With ``through_norms`` (the default)
the writer's map is the one that arrives, ``W_write P`` with ``P`` the product of those
norms' ``C diag(γ)``, in the numerator and in ``‖W_write P‖``; the positive factors cancel
in the ratio. A pre-norm or parallel model has no such norm between a writer and a reader
(its final norm comes after every reader), so ``P = I`` and the scores are TransformerLens's.
``through_norms=False`` scores the weights alone, as if the stream were never normalized.

Every score is computed through ``d_model × d_model`` Gram matrices: with ``W_write = A Bᵀ`` and
``W_read = C Dᵀ``, ``‖W_write W_read‖²_F = <B (AᵀA) Bᵀ, C (DᵀD) Cᵀ>_F``, so all pairs cost one
matrix product of flattened Grams. The stream norms act on a writer's Gram as ``Pᵀ G P``:
the writers are carried forward norm by norm (``O(d_model²)`` each, no product of ``d × d``
matrices) and scored against the readers between each norm and the next. A random
baseline, the same score for Gaussian matrices of the same shapes, is reported next to them
(Monte Carlo, fixed seed): scores are only interesting relative to it. For isotropic random maps
``E‖AB‖²_F = ‖A‖²_F ‖B‖²_F / d_model``, so it is close to ``1/√d_model`` whatever the heads' width:
blocks whose heads differ in width (Gemma 4's) share one (measured at d_model 64: 0.1252 for heads of
16 and 16, 0.1263 for 16 and 32, 0.1267 for 32 and 32).
"""

from __future__ import annotations

from bisect import bisect_left, bisect_right
from dataclasses import dataclass

import numpy as np
import pandas as pd
import torch
from jaxtyping import Float
from torch import Tensor

from ..errors import InputError, UnknownNameError, check_choice, check_flag, top_count
from ..program import Add, Norm, Read
from ..weights import widened
from .flow import layer_label
from .results import CompactRepr

KINDS = ("q", "k", "v")
TITLES = {"q": "Q", "k": "K", "v": "V", "mlp_q": "Q (from MLPs)", "mlp_k": "K (from MLPs)",
          "mlp_v": "V (from MLPs)", "in": "MLP-input"}  # each kind as titles name it


@dataclass(frozen=True, eq=False, repr=False)
class Composition(CompactRepr):
    """Scores ``[kind, writer head, reader head]`` and MLP analogues; 0 for unseen writes.

    A reader sees a write if it reads the stream after the write is added (``Anatomy.sees``).
    ``heads`` labels both head axes (``L3H5``); ``mlps`` labels MLPs (``L3.mlp``).
    ``head_to_mlp`` is ``[writer head, reader mlp]``; ``mlp_to_head`` is ``[kind, writer mlp,
    reader head]``. ``baseline`` holds the random-matrix score for each kind. ``sees`` holds the
    pairs that count, ``[writer, reader]`` booleans keyed by ``head_to_head``,
    ``head_to_mlp`` and ``mlp_to_head``. ``through_norms``: whether the whole-stream norms
    between a writer and a reader are folded into the write (``composition``).
    """

    heads: tuple[str, ...]
    mlps: tuple[str, ...]
    head_to_head: Float[Tensor, "kind head reader_head"]
    head_to_mlp: Float[Tensor, "head mlp"]
    mlp_to_head: Float[Tensor, "kind mlp head"]
    baseline: dict[str, float]
    sees: dict[str, Tensor]
    through_norms: bool = True

    def to_frame(self) -> pd.DataFrame:
        """Long frame: ``kind, writer, reader, score, baseline`` for every pair that counts.

        Those whose reader sees the writer's write: in a sequential block an MLP sees its own
        layer's heads, in a parallel one it does not.
        """
        blocks = [(KINDS, self.heads, self.heads, self.head_to_head, "head_to_head", ""),
                  (KINDS, self.mlps, self.heads, self.mlp_to_head, "mlp_to_head", "mlp_"),
                  (("in",), self.heads, self.mlps, self.head_to_mlp[None], "head_to_mlp", "")]
        frames = []
        for kinds, writers, readers, scores, key, prefix in blocks:
            k, i, j = np.nonzero(np.broadcast_to(self.sees[key].numpy(), scores.shape))
            names = [prefix + kinds[x] for x in k]
            frames.append(pd.DataFrame({
                "kind": names, "writer": np.array(writers)[i], "reader": np.array(readers)[j],
                "score": scores.numpy()[k, i, j],
                "baseline": [self.baseline.get(n, float("nan")) for n in names]}))
        return pd.concat(frames, ignore_index=True)

    def matrix(self, kind: str = "k", level: str = "layer") -> pd.DataFrame:
        """Reader × writer scores of one ``kind``, NaN where the reader does not see the writer.

        ``kind``: ``q``, ``k``, ``v`` (heads reading heads), ``mlp_q``, ``mlp_k``, ``mlp_v``
        (heads reading MLPs) or ``in`` (MLPs reading heads). ``level="head"``: a row per reader
        and a column per writer (``L3H5``, ``L3.mlp``); ``"layer"``: the largest score of each
        pair of reader and writer layers (``L3``).
        """
        check_choice("kind", kind, KINDS + tuple(f"mlp_{k}" for k in KINDS) + ("in",))
        check_choice("level", level, ("head", "layer"))
        if kind == "in":
            writers, readers, scores, key = self.heads, self.mlps, self.head_to_mlp, "head_to_mlp"
        elif kind.startswith("mlp_"):
            writers, readers, key = self.mlps, self.heads, "mlp_to_head"
            scores = self.mlp_to_head[KINDS.index(kind[-1])]
        else:
            writers, readers, key = self.heads, self.heads, "head_to_head"
            scores = self.head_to_head[KINDS.index(kind)]
        values = np.where(self.sees[key].numpy(), scores.numpy(), np.nan).T
        frame = pd.DataFrame(values, index=list(readers), columns=list(writers))
        if level == "head":
            return frame
        by_writer = pd.Series([layer_label(w) for w in writers], index=frame.columns)
        frame = frame.T.groupby(by_writer, sort=False).max().T  # NaN only where no pair is seen
        by_reader = pd.Series([layer_label(r) for r in readers], index=frame.index)
        return frame.groupby(by_reader, sort=False).max()

    def max_score(self, kind: str = "k") -> float | None:
        """The largest score of ``kind`` over the pairs that count, or None where none does.

        None for a one-layer model (no head reads another's write), not the 0 of unseen pairs.
        """
        values = self.matrix(kind, "head").to_numpy()
        return float(np.nanmax(values)) if np.isfinite(values).any() else None

    def top(self, reader: str, kind: str | None = None, n: int = 5) -> pd.DataFrame:
        """The ``n`` writers composing most strongly into ``reader`` by ``kind`` (``to_frame``'s rows).

        A head reads by ``q``, ``k`` (the default) or ``v`` from heads, and ``mlp_q``, ``mlp_k``,
        ``mlp_v`` from MLPs; an MLP by ``in`` (its default). ``UnknownNameError`` for a reader
        the model lacks, ``InputError`` for a kind it does not read by: an empty frame would
        read as "no composition". A reader with no write before it (a first-layer head, or
        one whose block reads only the embeddings) does get an empty frame: nothing composes.
        """
        if reader in self.heads:
            kind = "k" if kind is None else kind
            check_choice(f"the kind of {reader}'s read", kind, KINDS + tuple(f"mlp_{k}" for k in KINDS))
            mlp = kind.startswith("mlp_")
            if mlp and not self.mlps:
                raise InputError(f"{reader} reads no MLP writes: the model has no MLPs")
            writers, key = (self.mlps, "mlp_to_head") if mlp else (self.heads, "head_to_head")
            scores = (self.mlp_to_head if mlp else self.head_to_head)[KINDS.index(kind[-1])]
            j = self.heads.index(reader)
        elif reader in self.mlps:
            kind = "in" if kind is None else kind
            check_choice(f"the kind of {reader}'s read", kind, ("in",))
            writers, key, scores, j = self.heads, "head_to_mlp", self.head_to_mlp, self.mlps.index(reader)
        else:
            mlps = f"{self.mlps[0]}…{self.mlps[-1]}" if self.mlps else "none"
            raise UnknownNameError(f"no reader {reader!r}: the readers are heads "
                                   f"{self.heads[0]}…{self.heads[-1]} and MLPs ({mlps})")
        n = top_count(n, "writers")
        seen = self.sees[key][:, j].numpy()
        column = scores[:, j].numpy()
        order = [i for i in np.argsort(-column, kind="stable") if seen[i]][:n]
        return pd.DataFrame({"kind": kind, "writer": [writers[i] for i in order], "reader": reader,
                             "score": column[order],
                             "baseline": self.baseline.get(kind, float("nan"))})


def _fold(model, layer: int, kind: str, W: Tensor) -> Tensor:
    """Fold the reading norm of ``L{layer}.{kind}`` into ``W [..., d_model, k]``."""
    comp = next(c for c in model.anatomy.components if c.name == f"L{layer}.{kind}")
    return W if comp.reads_through is None else model.anatomy.norms[comp.reads_through].fold_into(W)


def attention_read_maps(model, layer: int, weights=None) -> tuple[Tensor, Tensor, Tensor]:
    """Block ``layer``'s query, key and value maps from the stream, each ``[head, d_model, d_head]``.

    ``C diag(γ) W`` with the reading norm folded in (``NormSpec.fold_into``), and for queries
    and keys the gain of the model's query/key norm, if it has one
    (``LayerWeights.attention_reads``):
    ``x @ q[h]`` is head ``h``'s query as the model computes it, up to a positive factor per
    token (the frozen scales) and before rotary embedding. ``weights``: the block's
    ``LayerWeights`` if the caller already has them.
    """
    w = model.weights(layer) if weights is None else weights
    return tuple(_fold(model, layer, "attn", W) for W, _ in w.attention_reads())


def _gram(A: Tensor, B: Tensor) -> Tensor:
    """``(A Bᵀ)ᵀ(A Bᵀ)`` written as ``B (AᵀA) Bᵀ`` for ``A, B [n, d, k]``: ``[n, d, d]``."""
    return B @ (A.transpose(-1, -2) @ A) @ B.transpose(-1, -2)


def _gram_T(C: Tensor, D: Tensor) -> Tensor:
    """``(C Dᵀ)(C Dᵀ)ᵀ = C (DᵀD) Cᵀ``: ``[n, d, d]``."""
    return C @ (D.transpose(-1, -2) @ D) @ C.transpose(-1, -2)


def _scores(writer: Tensor, reader: Tensor, chunk: int = 32) -> Tensor:
    """``‖W_w W_r‖ / (‖W_w‖ ‖W_r‖)`` from writer Grams ``(W_w)ᵀW_w`` and reader Grams ``W_r W_rᵀ``.

    ``trace(Gram)`` is the squared Frobenius norm of each map. 0 where either map is 0 (a head
    with no output, or a write that a LayerNorm on the way removes whole: along ``1``).
    """
    if reader.shape[0] == 0 or writer.shape[0] == 0:
        return torch.zeros(writer.shape[0], reader.shape[0])
    flat_w = writer.flatten(1)
    norm_w = writer.diagonal(dim1=-2, dim2=-1).sum(-1).clamp_min(0).sqrt()
    out = []
    for start in range(0, reader.shape[0], chunk):
        r = reader[start:start + chunk]
        num = (flat_w @ r.flatten(1).T).clamp_min(0).sqrt()
        norm_r = r.diagonal(dim1=-2, dim2=-1).sum(-1).clamp_min(0).sqrt()
        both = norm_w[:, None] * norm_r[None]
        out.append(torch.where(both > 0, num / both, 0.0))  # a map that is 0 composes with nothing
    return torch.cat(out, 1)


def _carry(spec, gram: Tensor) -> Tensor:
    """A writer Gram ``G`` through the frozen norm ``spec``: ``Mᵀ G M``, ``M = C diag(γ)``.

    ``M`` is the norm's linear part on a row vector up to its per-token ``1/s``: ``c ↦ (C c) ⊙ γ``.
    """
    if spec.kind == "layernorm":
        gram = gram - gram.mean(-1, keepdim=True)
        gram = gram - gram.mean(-2, keepdim=True)
    g = torch.as_tensor(spec.gain(gram), dtype=gram.dtype)
    return gram * g.reshape(-1, 1) * g.reshape(1, -1) if g.ndim else gram * g * g


def _scores_through(writer: Tensor, w_at: list[int], readers: list[tuple[Tensor, list[int]]],
                    norms: list) -> list[Tensor]:
    """``_scores`` of ``writer`` against each reader stack, with the stream norms between folded in.

    ``w_at[i]`` / ``r_at[j]``: how many of the whole-stream ``norms`` come before writer
    ``i``'s write is added and before reader ``j`` reads; non-decreasing, as the stacks are in
    layer order, so each count is one slice (no copy of a stack). Writers are carried forward
    one norm at a time (``_carry``) and scored against the readers that read before the next
    one; pairs with the reader before the writer stay 0 (``Anatomy.sees`` masks them).
    """
    assert all(list(at) == sorted(at) for at in (w_at, *(r for _, r in readers)))
    out = [torch.zeros(writer.shape[0], r.shape[0]) for r, _ in readers]
    last = max((r_at[-1] for _, r_at in readers if r_at), default=-1)
    for a in sorted(set(w_at)):
        rows = slice(bisect_left(w_at, a), bisect_right(w_at, a))
        gram = writer[rows]
        for b in range(a, last + 1):
            for (r, r_at), o in zip(readers, out, strict=True):
                cols = slice(bisect_left(r_at, b), bisect_right(r_at, b))
                if cols.stop > cols.start:
                    o[rows, cols] = _scores(gram, r[cols])
            if b < last:
                gram = _carry(norms[b], gram)
    return out


def _stream_norms(anatomy) -> tuple[list, dict[str, int]]:
    """The whole-stream norms in program order, and for each ``Add`` / ``Read`` how many come first.

    Keys ``"add:L3.attn"`` / ``"read:L3.attn"``; embeddings' norms and the final norm count too.
    """
    norms, before = [], {}
    for op in anatomy.program:
        if isinstance(op, Norm):
            norms.append(anatomy.norms[op.norm])
        elif isinstance(op, Add | Read):
            before[f"{'add' if isinstance(op, Add) else 'read'}:{op.component}"] = len(norms)
    return norms, before


def _baselines(d_model: int, d_head: int, d_mlp: int, samples: int = 4) -> dict[str, float]:
    """Mean scores of Gaussian matrices with the real factors' shapes (fixed seed)."""
    g = torch.Generator().manual_seed(0)

    def rand(*shape: int) -> Tensor:
        return torch.randn(samples, *shape, generator=g)

    heads_w = _gram(rand(d_model, d_head), rand(d_model, d_head))
    heads_r = _gram_T(rand(d_model, d_head), rand(d_model, d_head))
    w_out, w_in = rand(d_mlp, d_model), rand(d_model, d_mlp)
    mlp_w, mlp_r = w_out.transpose(-1, -2) @ w_out, w_in @ w_in.transpose(-1, -2)
    head = float(_scores(heads_w, heads_r).diagonal().mean())
    return {"q": head, "k": head, "v": head,
            "in": float(_scores(heads_w, mlp_r).diagonal().mean()),
            **dict.fromkeys(("mlp_q", "mlp_k", "mlp_v"),
                            float(_scores(mlp_w, heads_r).diagonal().mean()))}


def composition(model, through_norms: bool = True) -> Composition:
    """Q/K/V composition between all head pairs, and head↔MLP analogues, from weights only.

    ``model``: a loaded model, or a trace (its model's weights: no text is read).
    ``through_norms``: fold the whole-stream norms between each writer and reader into the
    write, as the reader receives it (post-norm, DeepNorm; nothing to fold in a pre-norm or
    parallel model); False scores the weights alone (the module docstring).
    """
    check_flag("through_norms", through_norms)
    model = getattr(model, "model", model)  # a Trace holds its Model as ``model``
    a = model.anatomy
    per_layer = [model.weights(L) for L in range(a.n_layers)]
    # every block's heads as wide as the widest (zero columns: Gemma 4's narrower sliding heads)
    W_Ot = torch.cat([widened(a.as_added(f"L{L}.attn", w.W_O).transpose(-1, -2), a.d_head)  # W_OV = W_V W_O
                      for L, w in enumerate(per_layer)])
    q, k, v = (torch.cat([widened(W, a.d_head) for W in maps]) for maps in zip(
        *(attention_read_maps(model, L, w) for L, w in enumerate(per_layer)), strict=True))
    head_w = _gram(v, W_Ot)  # writes of heads: W_OV = C diag(γ) W_V W_O, as the head reads as a V reader
    readers = {"q": _gram_T(q, k), "k": _gram_T(k, q), "v": _gram_T(v, W_Ot)}
    d, mlp_layers = a.d_model, [L for L, w in enumerate(per_layer) if w.W_in is not None]
    w_out = [a.as_added(f"L{L}.mlp", per_layer[L].W_out) for L in mlp_layers]
    mlp_w = torch.stack([W.T @ W for W in w_out]) if w_out else torch.zeros(0, d, d)  # W_outᵀ W_out
    w_in = [_fold(model, L, "mlp", per_layer[L].W_in) for L in mlp_layers]
    mlp_r = torch.stack([W @ W.T for W in w_in]) if w_in else torch.zeros(0, d, d)  # W_in W_inᵀ
    attn = [f"L{L}.attn" for L in range(a.n_layers) for _ in range(a.n_heads)]  # each head's
    mlps = [f"L{L}.mlp" for L in mlp_layers]
    sees = {"head_to_head": a.sees(attn, attn), "head_to_mlp": a.sees(attn, mlps),
            "mlp_to_head": a.sees(mlps, attn)}
    norms, before = _stream_norms(a) if through_norms else ([], {})

    def at(kind: str, names: list[str]) -> list[int]:
        return [before.get(f"{kind}:{n}", 0) for n in names]

    head_readers = [(readers[kd], at("read", attn)) for kd in KINDS]
    from_heads = _scores_through(head_w, at("add", attn), [*head_readers, (mlp_r, at("read", mlps))], norms)
    from_mlps = _scores_through(mlp_w, at("add", mlps), head_readers, norms)
    return Composition(
        heads=tuple(f"L{L}H{h}" for L in range(a.n_layers) for h in range(a.n_heads)),
        mlps=tuple(mlps),
        head_to_head=torch.stack(from_heads[:3]) * sees["head_to_head"],
        head_to_mlp=from_heads[3] * sees["head_to_mlp"],
        mlp_to_head=torch.stack(from_mlps) * sees["mlp_to_head"],
        baseline=_baselines(a.d_model, a.d_head, a.d_mlp or a.d_model), sees=sees,
        through_norms=through_norms,
    )
