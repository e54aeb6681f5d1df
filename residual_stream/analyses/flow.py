"""Cross-layer information flow: survival of every write, and who reads what.

Both replay the stream program over contributions (``decomposition.replay_states``), so both
are exact under any norm placement.

**Survival.** For write ``i`` and point ``j`` (the stream entering block ``j``): the norm of
``i``'s contribution at ``j``, its signed share ``<c_i, x_j> / ‖x_j‖²`` of the stream (shares
sum to 1 over contributions at every token), and its retention: that norm over the norm it
had when it was added. Pre-norm programs have no norm on the stream, so retention is exactly
1; post-norm programs rescale (and re-center) every contribution at each block. This is the
source article's claim (pre-norm keeps the stream geometrically continuous, post-norm
renormalizes it every block), measured.

**Read attribution.** Component ``j`` reads ``u = N_j(x) = Σ_i L_j(c_i) + β_j`` (``L_j`` the
frozen norm's linear part) and applies a linear map: for a head, ``y = u W + b`` with ``W`` one
of ``W_Q W_K W_V`` (for queries and keys the gains of the model's query/key norm folded in,
``LayerWeights.attention_reads``: the query or key the head attends with, up to a frozen
positive factor that no share sees); for an MLP, its input (and gate) map. The share of
source ``i`` in ``y`` is ``<L_j(c_i) W, y> / ‖y‖²``; with the reading norm's bias and the
map's own bias as sources, shares sum to 1 per token. Computed as ``<L_j(c_i), y Wᵀ> /
‖y‖²``, so no per-source projection is ever materialized.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, get_args

import pandas as pd
import torch
from jaxtyping import Float
from torch import Tensor

from ..decomposition import Write, collect, replay_states
from ..errors import check_choice, check_flag, need_trace
from ..program import Mark, Read
from ..walk import component_of
from .results import CompactRepr
from .tokens import masked_mean, safe_ratio

Granularity = Literal["head", "component"]
READ_CHANNELS = ("q", "k", "v", "in", "gate")  # what a reader reads for: a head's Q/K/V, an MLP's
READ_NORM_BIAS = "read_norm.bias"  # the reading norm's β (pre-norm and sandwich readers)
READ_MAP_BIAS = "read_map.bias"    # the reader's own b_Q / b_K / b_V / b_in


def component_label(label: str) -> str:
    """The component a contribution belongs to: ``L3H5`` and ``L3.b_O`` → ``L3.attn``."""
    if label.startswith("L") and "H" in label and "." not in label:
        return f"{label.split('H')[0]}.attn"
    return f"{label.split('.')[0]}.attn" if label.endswith(".b_O") else label


def layer_label(label: str) -> str:
    """The layer a contribution or reader belongs to (``L3``), or itself for embeddings."""
    return label.split(".")[0].split("H")[0] if label.startswith("L") else label


def merged(pieces: list[Write], granularity: Granularity) -> tuple[list[str], Tensor]:
    """Labels and stacked values, heads merged into their attention when asked."""
    values = torch.cat([p.values for p in pieces])
    labels = [lab for p in pieces for lab in p.labels]
    if granularity == "head":
        return labels, values
    keys = list(dict.fromkeys(component_label(lab) for lab in labels))
    index = torch.tensor([keys.index(component_label(lab)) for lab in labels], device=values.device)
    out = torch.zeros(len(keys), *values.shape[1:], device=values.device, dtype=values.dtype)
    return keys, out.index_add_(0, index, values)


@dataclass(frozen=True, eq=False, repr=False)
class Survival(CompactRepr):
    """Per source (row) and point (column); NaN where the source has not been written yet."""

    sources: tuple[str, ...]
    norm: Float[Tensor, "source point"]
    share: Float[Tensor, "source point"]
    retention: Float[Tensor, "source point"]
    born_norm: Float[Tensor, " source"]
    granularity: str

    def __post_init__(self) -> None:
        if not self.norm.shape == self.share.shape == self.retention.shape:
            raise ValueError(f"norm {tuple(self.norm.shape)}, share {tuple(self.share.shape)}, "
                             f"retention {tuple(self.retention.shape)} differ")
        if self.norm.shape[0] != len(self.sources):
            raise ValueError(f"{len(self.sources)} sources for norm of shape {tuple(self.norm.shape)}")

    def to_frame(self) -> pd.DataFrame:
        """Long frame: ``source, point, norm, share, retention`` (rows only where the source exists)."""
        S, J = self.norm.shape
        frame = pd.DataFrame({
            "source": [s for s in self.sources for _ in range(J)],
            "point": list(range(J)) * S,
            "norm": self.norm.flatten().numpy(), "share": self.share.flatten().numpy(),
            "retention": self.retention.flatten().numpy(),
        })
        return frame.dropna().reset_index(drop=True)


def survival(trace, *, granularity: Granularity = "component") -> Survival:
    """Norm, signed share and retention of every write at every later point of ``trace``.

    ``granularity``: ``"component"`` (each attention and MLP write) or ``"head"`` (each
    head's write, the output bias apart).
    """
    need_trace(trace, "survival")
    check_choice("granularity", granularity, get_args(Granularity))
    mask = trace.attention_mask
    born: dict[str, float] = {}
    cols: list[dict[str, tuple[float, float]]] = []
    seen: set[str] = set()
    for op, pieces in replay_states(trace.anatomy.program, trace.sources()):
        new = [p for p in pieces if not seen.issuperset(p.labels)]
        if new:  # a write's norm as it was added: the first time its pieces appear
            seen.update(lab for p in new for lab in p.labels)
            labels, values = merged(new, granularity)
            norms = masked_mean(values.norm(dim=-1), mask, lead=1).tolist()
            for lab, nm in zip(labels, norms, strict=True):
                born.setdefault(lab, nm)
        if isinstance(op, Mark) and op.point != "final":
            labels, values = merged(pieces, granularity)
            norms = values.norm(dim=-1)                                  # (source, batch, pos)
            x = collect(pieces, op.point, mask).total()
            share = safe_ratio((values * x).sum(-1), x.pow(2).sum(-1))
            cols.append(dict(zip(labels, zip(masked_mean(norms, mask, lead=1).tolist(),
                                             masked_mean(share, mask, lead=1).tolist(),
                                             strict=True), strict=True)))
    sources = tuple(born)
    nan = float("nan")
    norm = torch.tensor([[c.get(s, (nan, nan))[0] for c in cols] for s in sources])
    share = torch.tensor([[c.get(s, (nan, nan))[1] for c in cols] for s in sources])
    born_t = torch.tensor([born[s] for s in sources])
    return Survival(sources, norm, share, safe_ratio(norm, born_t[:, None]), born_t, granularity)


@dataclass(frozen=True, eq=False, repr=False)
class ReadAttribution(CompactRepr):
    """Mean (over real tokens) share of each source in each reader's linear read.

    Readers are ``"L5H3.q"``, ``"L5H3.k"``, ``"L5H3.v"``, ``"L5.mlp.in"`` (and ``.gate``).
    Sources are contributions (heads or components) plus ``"read_norm.bias"`` (the reading
    norm's β) and ``"read_map.bias"`` (the map's own bias). Shares of one reader sum to 1.
    ``per_token`` is ``[reader, source, batch, pos]`` when asked for, else None.
    """

    readers: tuple[str, ...]
    sources: tuple[str, ...]
    share: Float[Tensor, "reader source"]
    abs_share: Float[Tensor, "reader source"]
    per_token: Tensor | None
    granularity: str

    def to_frame(self) -> pd.DataFrame:
        """Long frame: ``reader, source, share, abs_share`` (nonzero entries)."""
        R, S = self.share.shape
        frame = pd.DataFrame({
            "reader": [r for r in self.readers for _ in range(S)],
            "source": list(self.sources) * R,
            "share": self.share.flatten().numpy(), "abs_share": self.abs_share.flatten().numpy(),
        })
        return frame[frame.abs_share > 0].reset_index(drop=True)

    def matrix(self, level: Literal["reader", "component", "layer"] = "component",
               channel: str | None = None, *, absolute: bool = False,
               sources: bool = True) -> pd.DataFrame:
        """Reader × source matrix at ``level``: shares of sources summed, readers averaged.

        ``channel`` keeps only readers of one kind (``"q" "k" "v" "in" "gate"``; a kind the
        model lacks, ``"gate"`` without a gated MLP, keeps none). ``sources=False`` groups the
        readers only, keeping every source as it is (a head's own share, at head granularity).
        """
        check_choice("level", level, ("reader", "component", "layer"))
        if channel is not None:
            check_choice("channel", channel, READ_CHANNELS)
        keep = [i for i, r in enumerate(self.readers)
                if channel is None or r.rsplit(".", 1)[1] == channel]
        values = (self.abs_share if absolute else self.share)[keep]
        readers = [self.readers[i] for i in keep]
        frame = pd.DataFrame(values.numpy(), index=readers, columns=list(self.sources))
        if level == "reader":
            return frame
        key = component_label if level == "component" else layer_label
        # group by Series, not lists: a list of strings that are also column names would be
        # taken as column keys by pandas
        if sources:
            by_source = pd.Series([key(s) for s in self.sources], index=frame.columns)
            frame = frame.T.groupby(by_source, sort=False).sum().T
        by_reader = pd.Series([key(r.rsplit(".", 1)[0]) for r in readers], index=frame.index)
        return frame.groupby(by_reader, sort=False).mean()


def read_channels(model, component: str, weights=None):
    """``(reader labels, W [n, d_model, k], b [n, k] | None)`` for each linear read of ``component``.

    Queries and keys as the scores use them (``LayerWeights.attention_reads``). An MLP with no
    single read map (mixture of experts: the router and every expert read its whole input)
    reads through the identity: its one reader is its input itself.

    ``weights``: the block's ``LayerWeights`` if the caller already has them.
    """
    layer, kind = component_of(component)
    w = model.weights(layer) if weights is None else weights
    if kind == "attn":
        H = model.anatomy.n_heads
        for ch, (W, b) in zip("qkv", w.attention_reads(), strict=True):
            yield [f"L{layer}H{h}.{ch}" for h in range(H)], W, b
        return
    W_in, b_in = w.mlp_read()
    yield [f"L{layer}.mlp.in"], W_in[None], None if b_in is None else b_in[None]
    if w.W_gate is not None:
        yield [f"L{layer}.mlp.gate"], w.W_gate[None], None if w.b_gate is None else w.b_gate[None]


def _read_shares(trace, op: Read, pieces: list[Write], granularity: Granularity):
    """Per-token shares ``[reader, source, batch, pos]`` for every channel of ``op``'s reader."""
    labels, values = merged(pieces, granularity)
    if op.norm is not None:
        spec = trace.anatomy.norms[op.norm]
        values = spec.apply_linear(values, trace.norm_scale(op.norm))
        if spec.bias is not None:
            labels = [*labels, READ_NORM_BIAS]
            values = torch.cat([values, spec.bias.float().expand_as(values[0])[None]])
    u = values.sum(0)                                                   # (batch, pos, d_model)
    for readers, W, b in read_channels(trace.model, op.component):
        y = torch.einsum("bpd,ndk->nbpk", u, W) + (0 if b is None else b[:, None, None])
        g = torch.einsum("nbpk,ndk->nbpd", y, W)                           # y Wᵀ per reader
        den = y.pow(2).sum(-1)                                             # (reader, batch, pos)
        share = safe_ratio(torch.einsum("sbpd,nbpd->nsbp", values, g), den[:, None])
        names = list(labels)
        if b is not None:
            bias_share = safe_ratio((y * b[:, None, None]).sum(-1), den)
            share = torch.cat([share, bias_share[:, None]], 1)
            names.append(READ_MAP_BIAS)
        yield readers, names, share


def read_attribution(trace, *, granularity: Granularity = "component",
                     per_token: bool = False) -> ReadAttribution:
    """How much of each component's linear read comes from each earlier write (module doc).

    ``granularity`` as in ``survival``; ``per_token`` also keeps each token's shares.
    """
    need_trace(trace, "read_attribution")
    check_flag("per_token", per_token)
    check_choice("granularity", granularity, get_args(Granularity))
    mask = trace.attention_mask
    rows: list[tuple[str, dict[str, tuple[float, float]]]] = []
    tokens: list[tuple[str, dict[str, Tensor]]] = []
    for op, pieces in replay_states(trace.anatomy.program, trace.sources()):
        if not isinstance(op, Read):
            continue
        for readers, names, share in _read_shares(trace, op, pieces, granularity):
            mean = masked_mean(share, mask, lead=2).tolist()  # one read back per group, not
            absm = masked_mean(share.abs(), mask, lead=2).tolist()  # per reader (head)
            for r, reader in enumerate(readers):
                rows.append((reader, dict(zip(names, zip(mean[r], absm[r], strict=True), strict=True))))
                if per_token:
                    tokens.append((reader, dict(zip(names, share[r], strict=True))))
    sources = tuple(dict.fromkeys(s for _, d in rows for s in d))
    share = torch.tensor([[d.get(s, (0.0, 0.0))[0] for s in sources] for _, d in rows])
    abs_share = torch.tensor([[d.get(s, (0.0, 0.0))[1] for s in sources] for _, d in rows])
    stacked = None
    if per_token:
        zero = torch.zeros_like(mask, dtype=torch.float32)
        stacked = torch.stack([torch.stack([d.get(s, zero).cpu() for s in sources])
                               for _, d in tokens])
    return ReadAttribution(tuple(r for r, _ in rows), sources, share, abs_share, stacked,
                           granularity)
