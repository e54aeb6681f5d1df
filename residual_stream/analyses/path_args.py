"""The senders and receivers of ``path_patch``, checked and resolved to what the hooks need.

A sender is where its write enters the program and how to make the difference of its two
runs' writes; a receiver is where it reads and which module outputs (and columns) read for
it. Every function raises the library's error saying what to pass.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import Tensor

from ..devices import parameter
from ..errors import InputError, NotAvailableError, UnknownNameError
from ..program import Add, Embed, Mark, Read
from ..walk import component_of
from ..weights import has_mlp_maps, module_or_none, qkv_columns

LOGITS = "logits"  # the receiver that is the unembedding's read
CHANNELS = ("q", "k", "v")


@dataclass(frozen=True)
class Sender:
    """A sender: its name, where its write enters the program, and its difference, made when asked."""

    name: str
    start: int                    # index of its Add (or Embed) in the program
    delta: Callable[[], Tensor]   # reference write − clean write (before any write norm), when asked


@dataclass(frozen=True)
class Reading:
    """One module whose output a receiver changes.

    ``chain`` (module paths applied in turn) maps the stream, as the receiver reads it, to that
    output; ``columns`` are the output's that change (None: all).
    """

    hook: str
    chain: tuple[str, ...]
    columns: Tensor | None


@dataclass(frozen=True)
class Receiver:
    """A receiver: where it reads, through which norm, and the module outputs that read for it."""

    name: str
    stop: int                     # index of its Read (or of Mark(n_layers) for the logits)
    component: str | None         # None: the logits
    norm: str | None              # the norm it reads through (None: the raw stream)
    readings: tuple[Reading, ...]


def _group(item: object, what: str) -> tuple[str, ...]:
    names = (item,) if isinstance(item, str) else tuple(item) if isinstance(item, (list, tuple)) else None
    if not names or not all(isinstance(n, str) for n in names):
        raise InputError(f"each of {what} is a name or a tuple of names patched together, not {item!r}")
    return names


def groups(items: object, default: list[str], what: str, example: str) -> list[tuple[str, ...]]:
    """``items`` (a name, or a list of names and tuples of names) as groups; ``default`` for None."""
    if items is None:
        return [(n,) for n in default]
    if isinstance(items, str):
        return [(items,)]
    if not isinstance(items, (list, tuple)) or not items:
        raise InputError(f"{what} is a name or a list of them (a tuple in it: patched together), e.g. "
                         f"{example}; not {items!r}")
    return [_group(i, what) for i in items]


def sender(trace, reference, name: str, mask: Tensor | None, heads: dict) -> Sender:
    """``name`` checked; its write's difference is made when asked, at ``mask``'s tokens.

    ``heads`` keeps one layer's head-write differences while senders of that layer follow
    each other (every head, by default).
    """
    a, program = trace.anatomy, trace.anatomy.program
    head = a.head(name)
    component = f"L{head[0]}.attn" if head else name
    if name in a.embeds:
        start = next(i for i, op in enumerate(program) if isinstance(op, Embed) and op.label == name)
    elif head or component in {c.name for c in a.components}:
        start = next(i for i, op in enumerate(program) if isinstance(op, Add) and op.component == component)
    else:
        raise UnknownNameError(f"no sender {name!r}: senders are heads (L0H0…L{a.n_layers - 1}"
                               f"H{a.n_heads - 1}), components ('L0.attn', 'L0.mlp') or embeddings "
                               f"{list(a.embeds)}")

    def difference() -> Tensor:
        if name in a.embeds:
            return reference.captured.embeds[name] - trace.captured.embeds[name]
        layer, kind = component_of(component)
        if head:
            if heads.get("layer") != layer:
                heads.update(layer=layer, writes=reference.head_writes(layer) - trace.head_writes(layer))
            return heads["writes"][head[1]]
        write = "attn_write" if kind == "attn" else "mlp_write"
        return getattr(reference, write)(layer) - getattr(trace, write)(layer)

    def delta() -> Tensor:
        return difference() if mask is None else difference() * mask.to(trace.tokens.device)[..., None]

    return Sender(name, start, delta)


def receiver(trace, name: str) -> Receiver:
    """Receiver ``name`` checked and resolved: its read point and the outputs to change."""
    a, program = trace.anatomy, trace.anatomy.program
    if name == LOGITS:
        stop = next(i for i, op in enumerate(program) if isinstance(op, Mark) and op.point == a.n_layers)
        return Receiver(name, stop, None, None, ())
    head = a.head(name, channel=True)
    component = f"L{head[0]}.attn" if head else name
    reads = {op.component: i for i, op in enumerate(program) if isinstance(op, Read)}
    if component not in reads:
        raise UnknownNameError(
            f"no receiver {name!r}: receivers are 'L5.attn', 'L5.mlp', a head 'L5H3' (its query, key "
            f"and value) or one of them 'L5H3.q', and {LOGITS!r} (layers 0..{a.n_layers - 1})")
    layer, kind = component_of(component)
    block = a.modules.layers[layer]
    qkv = _qkv_paths(trace, layer)
    if head is not None:
        channels = (head[2],) if head[2] else CHANNELS
        if head[2] in ("k", "v") and len(qkv) == 3 and qkv[1] == qkv[2]:
            raise NotAvailableError(
                f"{name!r}: block {layer}'s values are its key projection's output (Gemma 4's "
                f"attention_k_eq_v), so a key head and its value head read the stream as one; patch "
                f"'L{layer}H{head[1]}' (query, key and value) or 'L{layer}H{head[1]}.q'")
        readings = tuple(_head_reading(trace, layer, head[1], c, qkv) for c in channels)
    elif kind == "mlp" and not has_mlp_maps(trace.model.module.get_submodule(block), a):
        if a.modules.mlp_out_input:  # no one module is the MLP: a hook cannot run it on a patched read
            raise NotAvailableError(
                f"{name!r}: block {layer}'s MLP is a dense MLP and experts beside it, each reading the "
                "stream through norms of its own and written through another (Gemma 4's), with no one "
                "module computing it to run on the patched stream; receive at a later attention or head, "
                "or patch the stream itself (rs.patch_stream)")
        # experts: the MLP itself, on what it reads
        readings = (Reading(a.modules.mlp_out[layer], (a.modules.mlp_out[layer],), None),)
    else:
        paths = (dict.fromkeys(p for p in (a.modules.mlp_in, a.modules.mlp_gate) if p) if kind == "mlp"
                 else qkv)  # one module for both where it is fused (Phi-3's gate_up; Gemma 4's k = v)
        readings = tuple(Reading(f"{block}.{p}", (f"{block}.{p}",), None) for p in paths)
    return Receiver(name, reads[component], component, program[reads[component]].norm, _joined(readings))


def _qkv_paths(trace, layer: int) -> tuple[str, ...]:
    """Block ``layer``'s modules reading the stream for attention, in the row's order.

    A block without a value projection (Gemma 4's full attentions) names ``values_from``'s
    module in its place: that projection's output is its keys and its values.
    """
    m = trace.anatomy.modules
    if m.qkv_layout != "separate" or not m.values_from:
        return m.qkv
    block = trace.model.module.get_submodule(m.layers[layer])
    return m.qkv if module_or_none(block, m.qkv[-1]) is not None else (*m.qkv[:-1], m.values_from)


def _head_reading(trace, layer: int, head: int, channel: str, qkv: tuple[str, ...]) -> Reading:
    """The module computing ``channel`` of ``head`` and its output columns, for each qkv layout.

    The layout's columns (``weights.qkv_columns``): three modules (``separate``) or one fused
    projection. A key or value head is shared by ``n_heads / n_kv_heads`` query heads. Where
    a norm on the queries (keys) spans every head (OLMo 2), one head's query is patched after
    it, so that only that head's changes.
    """
    a = trace.anatomy
    block, (d, n_kv) = a.modules.layers[layer], a.heads_at(layer)
    c, layout = CHANNELS.index(channel), a.modules.qkv_layout
    group = head if c == 0 else head // (a.n_heads // n_kv)  # its key/value head
    columns = qkv_columns(layout, a.n_heads, n_kv, d)[c].view(-1, d)[group]
    chain = (f"{block}.{qkv[c if layout == 'separate' else 0]}",)
    if a.modules.qk_norms is not None and c < 2:
        norm = f"{block}.{a.modules.qk_norms[c]}"
        if parameter(trace.model.module.get_submodule(norm), "weight").numel() != d:  # across heads
            chain += (norm,)
    return Reading(chain[-1], chain, columns)


def merged(receivers: list[Receiver]) -> list[Receiver]:
    """A group's receivers, those reading at one point merged.

    Each module once, with the union of their columns: ``("L5H0.k", "L5H1.k")`` under
    grouped-query attention is one key head, changed once. A projection changed whole also
    covers a head's reading after its norm (OLMo 2's ``("L5.attn", "L5H0")``).
    """
    out: dict[str | None, Receiver] = {}
    for r in receivers:
        if r.component not in out:
            out[r.component] = r
            continue
        out[r.component] = Receiver(r.name, r.stop, r.component, r.norm,
                                    _joined((*out[r.component].readings, *r.readings)))
    return list(out.values())


def _joined(readings: tuple[Reading, ...]) -> tuple[Reading, ...]:
    """Readings of one module joined: each module once, with the union of their columns.

    (A key head and its value head in Gemma 4's full attentions: one projection's columns.) A
    projection changed whole also covers a head's reading after its norm.
    """
    by_hook: dict[str, Reading] = {}
    for g in readings:
        if g.hook in by_hook:
            old = by_hook[g.hook].columns
            both = None if old is None or g.columns is None else torch.cat([old, g.columns]).unique()
            g = Reading(g.hook, g.chain, both)
        by_hook[g.hook] = g
    whole = {g.chain[0] for g in by_hook.values() if g.columns is None and len(g.chain) == 1}
    return tuple(g for g in by_hook.values() if len(g.chain) == 1 or g.chain[0] not in whole)


def _parts(trace, name: str) -> set:
    """What a sender writes, as parts that two senders of a group must not share."""
    head = trace.anatomy.head(name)
    if head:
        return {head[:2]}
    if name.endswith(".attn"):
        layer = component_of(name)[0]
        return {(layer, h) for h in range(trace.anatomy.n_heads)} | {(layer, "b_O")}
    return {name}


def checked_senders(trace, group: tuple[str, ...]) -> None:
    """``InputError`` when senders patched together share a write (counted twice otherwise)."""
    seen: dict = {}
    for name in group:
        for part in _parts(trace, name):
            if part in seen:
                raise InputError(f"senders patched together share a write: {seen[part]!r} and {name!r} "
                                 "(a head is part of its attention); name each write once")
            seen[part] = name
