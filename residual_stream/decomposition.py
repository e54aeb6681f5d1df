"""Exact decomposition of the stream: replay the stream program over contributions.

DESIGN §3: with each norm's per-token scale frozen at the value the forward pass computed,
every norm is affine, so the stream at any point is an exact sum of

* the embeddings (token, position, token type),
* every attention head's write ``z_h @ W_O[h]`` and each attention's output bias ``b_O``,
* every MLP's write,
* the bias β of every LayerNorm that stands on the stream (post-norm, DeepNorm, embeddings,
  the final norm) or on a write (sandwich),

each carried through the norms and α-scalings that stand between it and the point. Replaying
the model's ``Anatomy.program`` over the contributions, instead of over the stream, yields
that sum for any norm placement with this one engine. In a pre-norm program there is no
``Norm`` on the stream, so contributions pass unchanged; in a post-norm program every
``Norm`` re-centers (LayerNorm) and rescales all earlier contributions.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Literal

import pandas as pd
import torch
from jaxtyping import Float, Int
from torch import Tensor

from .errors import UnknownNameError
from .norms import NormSpec
from .program import Add, Embed, Mark, Norm, Op, Point, Read, Scale

ContributionKind = Literal["embed", "head", "attn_bias", "attn", "mlp", "norm_bias"]  # attn: all heads + b_O


@dataclass(frozen=True)
class Write:
    """One labelled piece of a write, as produced by a trace: ``values`` is ``[k, batch, pos, d_model]``."""

    labels: tuple[str, ...]
    kind: ContributionKind
    layer: int
    values: Tensor


@dataclass(frozen=True, eq=False, repr=False)
class Contributions:
    """The stream at ``point`` as a labelled sum: ``values.sum(0) == stream``.

    Attributes:
        point: Block index (stream entering that block; ``n_layers`` = after the last),
            ``"final"`` (after the final norm), or ``"L3.mlp read"`` (where a component reads).
        labels: One name per contribution: ``embed``, ``pos_embed``, ``L3H5``, ``L3.b_O``,
            ``L3.mlp``, ``L3.ln_resid_attn.bias`` ...
        kinds: ``embed | head | attn_bias | mlp | norm_bias`` per contribution.
        layers: Block index of the writer (-1 for embeddings and global norms).
        values: ``[component, batch, pos, d_model]`` float32.
        attention_mask: ``[batch, pos]``; 0 marks padding, excluded from ``to_frame``.
        groups: Index of the write each contribution belongs to (the heads of one attention
            share one), in program order.
    """

    point: Point | str
    labels: tuple[str, ...]
    kinds: tuple[str, ...]
    layers: tuple[int, ...]
    values: Float[Tensor, "component batch pos d_model"]
    attention_mask: Int[Tensor, "batch pos"]
    groups: tuple[int, ...]

    def __post_init__(self) -> None:
        n = self.values.shape[0]
        if not len(self.labels) == len(self.kinds) == len(self.layers) == len(self.groups) == n:
            raise ValueError(
                f"{len(self.labels)} labels, {len(self.kinds)} kinds, {len(self.layers)} layers "
                f"for values of shape {tuple(self.values.shape)}"
            )
        if self.values.shape[1:3] != self.attention_mask.shape:
            raise ValueError(f"values {tuple(self.values.shape)} vs mask "
                             f"{tuple(self.attention_mask.shape)}")

    def total(self) -> Float[Tensor, "batch pos d_model"]:
        """The sum of all contributions: the reconstructed stream at ``point``.

        Summed write by write in program order, in the contributions' dtype, the way the
        model's own residual adds accumulate. The model's float32 stream carries its own
        rounding (on SmolLM2, up to 9e-5 × RMS at the last layer, from coordinates near
        3000); summing in the same order reproduces it, so comparing ``total()`` with the
        stream measures the decomposition, not a different summation order.
        """
        out = torch.zeros_like(self.values[0])
        bounds = [i for i in range(1, len(self.groups)) if self.groups[i] != self.groups[i - 1]]
        for start, end in zip([0, *bounds], [*bounds, len(self.groups)], strict=True):
            out = out + self.values[start:end].sum(0)
        return out

    def __repr__(self) -> str:
        """The point, how many contributions (the first few named) and the values' shape."""
        names = ", ".join(self.labels[:4]) + (", …" if len(self.labels) > 4 else "")
        return (f"Contributions(point={self.point!r}, {len(self.labels)} contributions: {names}; "
                f"values {list(self.values.shape)})")

    def get(self, label: str) -> Float[Tensor, "batch pos d_model"]:
        """The contribution named ``label``."""
        try:
            return self.values[self.labels.index(label)]
        except ValueError:
            raise UnknownNameError(f"no contribution {label!r}; labels are e.g. {self.labels[:5]}") from None

    def to_frame(self) -> pd.DataFrame:
        """Per contribution, over non-pad tokens: mean norm and mean signed share of the stream.

        The signed share of contribution ``c`` in stream ``x`` is ``<c, x> / |x|²``; shares
        sum to 1 over contributions at every token.
        """
        mask = self.attention_mask.bool().to(self.values.device)
        vals = self.values[:, mask]                                  # (component, token, d_model)
        total = vals.sum(0)
        share = (vals * total).sum(-1) / total.pow(2).sum(-1).clamp_min(1e-30)
        return pd.DataFrame({
            "label": self.labels, "kind": self.kinds, "layer": self.layers,
            "norm_mean": vals.norm(dim=-1).mean(-1).cpu().numpy(),
            "share_mean": share.mean(-1).cpu().numpy(),
        })


def _norm_bias(norm: NormSpec, like: Tensor) -> Write | None:
    if norm.bias is None:
        return None
    b = norm.bias.to(like.device, like.dtype).expand(*like.shape[1:3], -1).unsqueeze(0)
    return Write((f"{norm.name}.bias",), "norm_bias", _layer_of(norm.name), b)


def _layer_of(name: str) -> int:
    return int(name[1:name.index(".")]) if name.startswith("L") and "." in name else -1


@dataclass(frozen=True)
class Sources:
    """What a replay needs from a trace: norms, their frozen scales, and the writes.

    Attributes:
        norms: Norm specs by name.
        scales: Name -> frozen per-token scale ``[batch, pos]`` of that norm.
        embed: Label -> the embedding's ``Write``.
        writes: ``(component, out=None)`` -> its labelled writes (before any ``via`` norm);
            given ``out [n_pieces(component), batch, pos, d_model]``, they are written into it
            and their values are views of it.
        n_pieces: Component name -> how many contributions its writes are.
        attention_mask: ``[batch, pos]``.
    """

    norms: dict[str, NormSpec]
    scales: Callable[[str], Tensor]
    embed: Callable[[str], Write]
    writes: Callable[..., list[Write]]
    n_pieces: Callable[[str], int]
    attention_mask: Tensor


def replay_states(program: tuple[Op, ...], src: Sources) -> Iterator[tuple[Op, list[Write]]]:
    """Walk ``program``, yielding ``(op, pieces)`` with the stream's pieces *as ``op`` sees them*.

    The one engine behind every decomposition: ``Embed`` and ``Add`` append pieces (an
    ``Add`` through a write norm maps its pieces first), ``Norm`` maps every piece through the
    frozen norm and appends its bias, ``Scale`` multiplies every piece.
    """
    pieces: list[Write] = []
    for op in program:
        yield op, pieces
        if isinstance(op, Embed):
            pieces = [*pieces, src.embed(op.label)]
        elif isinstance(op, Add):
            new = src.writes(op.component)
            if op.via is not None:
                new = _through(src.norms[op.via], src.scales(op.via), new)
            pieces = [*pieces, *new]
        elif isinstance(op, Norm):
            pieces = _through(src.norms[op.norm], src.scales(op.norm), pieces)
        elif isinstance(op, Scale):
            pieces = [Write(p.labels, p.kind, p.layer, p.values * op.alpha) for p in pieces]


def collect(pieces: list[Write], point: Point | str, attention_mask: Tensor) -> Contributions:
    """Stack ``pieces`` into a ``Contributions`` at ``point``."""
    return Contributions(
        point=point,
        labels=tuple(lab for p in pieces for lab in p.labels),
        kinds=tuple(p.kind for p in pieces for _ in p.labels),
        layers=tuple(p.layer for p in pieces for _ in p.labels),
        values=torch.cat([p.values for p in pieces]),
        attention_mask=attention_mask,
        groups=tuple(g for g, p in enumerate(pieces) for _ in p.labels),
    )


def replay(program: tuple[Op, ...], src: Sources, *, upto: Point) -> Contributions:
    """The contributions at ``Mark(upto)`` (block index or ``"final"``)."""
    stop = _first(program, lambda op: isinstance(op, Mark) and op.point == upto,
                  f"point {upto!r} is not in the program; use 0..n_layers or 'final'")
    return _replay_into(program[:stop], src, upto)


def replay_to_read(program: tuple[Op, ...], src: Sources, component: str) -> Contributions:
    """The contributions of the stream where ``component`` reads it (before its read norm)."""
    stop = _first(program, lambda op: isinstance(op, Read) and op.component == component,
                  f"no component {component!r} reads the stream; names are like 'L3.attn'")
    return _replay_into(program[:stop], src, f"{component} read")


def _first(program: tuple[Op, ...], match: Callable[[Op], bool], missing: str) -> int:
    index = next((i for i, op in enumerate(program) if match(op)), None)
    if index is None:
        raise UnknownNameError(missing)
    return index


def count_pieces(ops, norms: dict[str, NormSpec], n_pieces: Callable[[str], int]) -> int:
    """How many contributions walking ``ops`` makes: embeddings, writes, norm biases.

    ``n_pieces(component)``: how many its write is (its heads, or 1 at component granularity).
    """
    n = 0
    for op in ops:
        if isinstance(op, Embed):
            n += 1
        elif isinstance(op, Add):
            n += n_pieces(op.component) + (op.via is not None and norms[op.via].bias is not None)
        elif isinstance(op, Norm):
            n += norms[op.norm].bias is not None
    return n


class _Rows:
    """The preallocated ``[contribution, batch, pos, d_model]`` tensor of ``_replay_into``."""

    def __init__(self, n: int, src: Sources) -> None:
        self.n, self.src = n, src
        self.values: Tensor | None = None
        self.filled = 0
        self.meta: list[tuple[tuple[str, ...], str, int]] = []  # per write: labels, kind, layer

    def put(self, writes: list[Write]) -> None:
        """Record ``writes``, whose values are already in the next rows."""
        for w in writes:
            self.meta.append((w.labels, w.kind, w.layer))
            self.filled += len(w.labels)

    def copy(self, w: Write) -> None:
        """Copy ``w`` (one contribution) into the next row (allocating on the first)."""
        if self.values is None:
            self.values = w.values.new_empty(self.n, *w.values.shape[1:])
        self.values[self.filled: self.filled + 1].copy_(w.values)
        self.put([w])

    def add(self, component: str) -> None:
        """Write ``component``'s contributions straight into the next rows."""
        k = self.src.n_pieces(component)
        self.put(self.src.writes(component, self.values[self.filled: self.filled + k]))

    def through(self, norm: NormSpec, start: int) -> None:
        """Map rows ``start:`` through the frozen norm in place, then add its bias as a row."""
        norm.apply_linear_(self.values[start: self.filled], self.src.scales(norm.name))
        bias = _norm_bias(norm, self.values[:1])
        if bias is not None:
            self.copy(bias)

    def contributions(self, point: Point | str) -> Contributions:
        """The filled rows, labelled."""
        meta = self.meta
        return Contributions(
            point=point,
            labels=tuple(lab for labels, _, _ in meta for lab in labels),
            kinds=tuple(kind for labels, kind, _ in meta for _ in labels),
            layers=tuple(layer for labels, _, layer in meta for _ in labels),
            values=self.values[: self.filled], attention_mask=self.src.attention_mask,
            groups=tuple(g for g, (labels, _, _) in enumerate(meta) for _ in labels),
        )


def _replay_into(ops: tuple[Op, ...], src: Sources, point: Point | str) -> Contributions:
    """``replay_states``'s walk to the end of ``ops``, in place in one preallocated tensor.

    Counts the contributions first (``count_pieces``), then each write goes straight into its rows
    (``Sources.writes(component, out)``; head writes are computed there) and each norm or
    scale maps the filled rows in place (``NormSpec.apply_linear_``, the same arithmetic as
    ``apply_linear``). So the result is not a concatenation of pieces: no second copy of
    every contribution, at any point.
    """
    rows = _Rows(count_pieces(ops, src.norms, src.n_pieces), src)
    for op in ops:
        if isinstance(op, Embed):
            rows.copy(src.embed(op.label))
        elif isinstance(op, Add):
            start = rows.filled
            rows.add(op.component)
            if op.via is not None:
                rows.through(src.norms[op.via], start)
        elif isinstance(op, Norm):
            rows.through(src.norms[op.norm], 0)
        elif isinstance(op, Scale):
            rows.values[: rows.filled].mul_(op.alpha)
    return rows.contributions(point)


def _through(norm: NormSpec, scale: Tensor, pieces: list[Write]) -> list[Write]:
    """Pass every piece through the frozen norm's linear part; add the norm's bias as a piece."""
    out = [Write(p.labels, p.kind, p.layer, norm.apply_linear(p.values, scale)) for p in pieces]
    bias = _norm_bias(norm, pieces[0].values) if pieces else None
    return out + ([bias] if bias is not None else [])
