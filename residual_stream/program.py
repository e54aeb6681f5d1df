"""Stream programs: each architecture as a short list of operations on the residual stream.

A transformer's forward pass, seen from the stream, is a sequence of a few kinds of steps:

* ``Embed(label)``: add an embedding (token, position, token type) to the stream;
* ``Read(component, norm)``: a component reads the stream here, through ``norm`` (or raw);
* ``Add(component, via)``: a component's write is added, after its own norm ``via`` if any
  (sandwich / peri-norm models normalize the write before adding it);
* ``Norm(norm)``: the whole stream is normalized (post-norm, DeepNorm, embedding LN, final);
* ``Scale(alpha)``: the whole stream is multiplied by α (DeepNorm's ``α·x + F(x)``);
  a constant per block (Gemma 4's ``layer_scalar``) is a ``Norm`` through a multiplier instead;
* ``Mark(point)``: a named point; ``Mark(L)`` is the stream entering block ``L``
  (``Mark(n_layers)`` is after the last block) and ``Mark("final")`` is after the final norm.

Placements differ only in their block template (data below), so one replay engine
(``decomposition.replay``) decomposes every one of them:

    pre       x ← x + F(N(x))                    reads through a norm, stream never normalized
    parallel  x ← x + Attn(N₁(x)) + MLP(N₂(x))   both read the block input
    post      x ← N(x + F(x))                    every block renormalizes the whole stream
    sandwich  x ← x + N_out(F(N_in(x)))          Gemma 2/3, OLMo 2 (which has no N_in)
    deepnorm  x ← N(α·x + F(x))                  Wang et al. 2022

A constant multiplier on each write (Granite's ``x ← x + m·F(N(x))``) is a pre-norm block
whose writes are added through a ``"multiplier"`` norm in the write roles (``norms``); one on the
whole stream as a block ends (Gemma 4's ``x ← c_L·x``) fills the role ``ln_block_out``; one on the
token embedding before the other embeddings are added (Marian's), ``ln_embed_token``.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Literal

Placement = Literal["pre", "post", "sandwich", "deepnorm", "parallel"]
PLACEMENTS: tuple[str, ...] = ("pre", "post", "sandwich", "deepnorm", "parallel")
Point = int | Literal["final"]


@dataclass(frozen=True)
class Embed:
    """Add the embedding contribution ``label`` (e.g. ``"embed"``, ``"pos_embed"``)."""

    label: str


@dataclass(frozen=True)
class Read:
    """Component ``component`` reads the stream here, through norm ``norm`` (None: raw)."""

    component: str
    norm: str | None


@dataclass(frozen=True)
class Add:
    """Add ``component``'s write to the stream, after passing it through norm ``via`` if set."""

    component: str
    via: str | None = None


@dataclass(frozen=True)
class Norm:
    """Normalize the whole stream with norm ``norm``."""

    norm: str


@dataclass(frozen=True)
class Scale:
    """Multiply the whole stream by ``alpha``."""

    alpha: float


@dataclass(frozen=True)
class Mark:
    """A named point of the stream: block index (stream entering it) or ``"final"``."""

    point: Point


Op = Embed | Read | Add | Norm | Scale | Mark

# Block templates, one per placement. Norm roles are resolved per layer ("ln_attn_in" ->
# "L3.ln_attn_in"); a role the model lacks (norm="none", OLMo 2's missing input norm, a pre-norm
# block's write roles, which only a model with write multipliers fills) drops out:
# a Read through it becomes a raw read, a Norm or an Add's ``via`` through it disappears.
# Pre-norm and sandwich blocks therefore share one template: the placement names which roles
# a model fills (sandwich: both; pre: the reads, and the writes only for multipliers).
_BLOCK_OUT = (("norm", "ln_block_out"),)  # a constant on the whole stream as the block ends (Gemma 4)
_READ_THEN_ADD = (("read", "attn", "ln_attn_in"), ("add", "attn", "ln_attn_out"),
                  ("read", "mlp", "ln_mlp_in"), ("add", "mlp", "ln_mlp_out"), *_BLOCK_OUT)
BLOCK_TEMPLATES: dict[str, tuple[tuple, ...]] = {
    "pre": _READ_THEN_ADD,
    "parallel": (("read", "attn", "ln_attn_in"), ("read", "mlp", "ln_mlp_in"),
                 ("add", "attn", "ln_attn_out"), ("add", "mlp", "ln_mlp_out"), *_BLOCK_OUT),
    "post": (("read", "attn", None), ("add", "attn", None), ("norm", "ln_resid_attn"),
             ("read", "mlp", None), ("add", "mlp", None), ("norm", "ln_resid_mlp")),
    "sandwich": _READ_THEN_ADD,
    "deepnorm": (("read", "attn", None), ("scale",), ("add", "attn", None),
                 ("norm", "ln_resid_attn"), ("read", "mlp", None), ("scale",),
                 ("add", "mlp", None), ("norm", "ln_resid_mlp")),
}

def compile_block(placement: str, layer: int, norms: set[str], *, alpha: float = 1.0,
                  sublayers: tuple[str, ...] = ("attn", "mlp")) -> list[Op]:
    """The stream program of block ``layer`` for ``placement``, given the norm names present.

    ``sublayers`` drops the steps of a missing sublayer (``("attn",)`` for attention-only models).
    """
    if placement not in BLOCK_TEMPLATES:
        raise ValueError(f"unknown placement {placement!r}; expected one of {PLACEMENTS}")

    def norm_name(role: str | None) -> str | None:
        name = f"L{layer}.{role}" if role else None
        return name if name in norms else None

    ops: list[Op] = []
    for step in BLOCK_TEMPLATES[placement]:
        kind = step[0]
        if kind in ("read", "add") and step[1] not in sublayers:
            continue
        if kind == "read":
            ops.append(Read(f"L{layer}.{step[1]}", norm_name(step[2])))
        elif kind == "add":
            ops.append(Add(f"L{layer}.{step[1]}", norm_name(step[2])))
        elif kind == "norm" and norm_name(step[1]):
            ops.append(Norm(norm_name(step[1])))
        elif kind == "scale" and alpha != 1.0:
            ops.append(Scale(alpha))
    return ops


def compile_program(
    *,
    placement: str,
    n_layers: int,
    embeds: tuple[str, ...],
    norms: set[str],
    alpha: float = 1.0,
    sublayers: tuple[str, ...] = ("attn", "mlp"),
) -> tuple[Op, ...]:
    """The whole model's stream program: embeddings, every block, the final norm.

    A constant on the token embedding alone (``"ln_embed_token"``: Marian's √d_model, multiplied in the
    encoder's forward before the positions are added) follows it, before the other embeddings.
    """
    if "ln_embed_token" in norms and tuple(embeds[:1]) != ("embed",):  # (it scales all that is added before)
        raise ValueError(f"a multiplier on the token embedding needs it first of the embeddings: {embeds}")
    ops: list[Op] = []
    for label in embeds:
        ops.append(Embed(label))
        if label == "embed" and "ln_embed_token" in norms:
            ops.append(Norm("ln_embed_token"))
    if "ln_embed" in norms:
        ops.append(Norm("ln_embed"))
    for layer in range(n_layers):
        ops.append(Mark(layer))
        ops.extend(compile_block(placement, layer, norms, alpha=alpha, sublayers=sublayers))
    ops.append(Mark(n_layers))
    if "ln_final" in norms:
        ops.append(Norm("ln_final"))
    ops.append(Mark("final"))
    return tuple(ops)


def describe(program: tuple[Op, ...], constants: Mapping[str, float] | None = None) -> str:
    """A one-line-per-op text rendering of a program (for docs, the CLI and the app).

    ``constants``: the norms that are constant multipliers, by name, shown as their value.
    """
    constants = constants or {}
    lines = []
    for op in program:
        if isinstance(op, Embed):
            lines.append(f"x += {op.label}")
        elif isinstance(op, Read):
            lines.append(f"{op.component} reads {op.norm + '(x)' if op.norm else 'x'}")
        elif isinstance(op, Add):
            w = f"{constants[op.via]:.4g}·{op.component}" if op.via in constants else \
                f"{op.via}({op.component})" if op.via else op.component
            lines.append(f"x += {w}")
        elif isinstance(op, Norm):
            lines.append(f"x = {constants[op.norm]:.4g}·x" if op.norm in constants else f"x = {op.norm}(x)")
        elif isinstance(op, Scale):
            lines.append(f"x = {op.alpha:.4g}·x")
        else:
            lines.append(f"-- {'final' if op.point == 'final' else f'resid_pre {op.point}'} --")
    return "\n".join(lines)
