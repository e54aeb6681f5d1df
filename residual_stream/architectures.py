"""From a family's row to an ``Anatomy``: ``describe`` reads a live model's config and modules.

The rows themselves (``ArchSpec``, one per ``model_type``) are data in ``families``. A
``model_type`` missing from the table is refused with ``UnsupportedArchitectureError``: we
never analyse a model whose stream program we have not written down and verified.
"""

from __future__ import annotations

import warnings

import torch
from torch import nn

from .anatomy import Anatomy, ModulePaths
from .arch_spec import ArchSpec
from .devices import embeddings, parameter
from .errors import UnsupportedArchitectureError
from .families import ARCHITECTURES, CONTAINERS, WHOLE_TEXT_MODELS
from .family_rules import config_width
from .norms import NormSpec
from .program import compile_program
from .recent_families import SCALING_HEADS
from .seq2seq_families import DECODER_TYPES, ENCODER_DECODERS
from .tl_compat import wrapped


def supported_architectures() -> list[str]:
    """The ``config.model_type`` values this version can describe (multimodal containers included)."""
    return sorted({*ARCHITECTURES, *CONTAINERS, *WHOLE_TEXT_MODELS})


def has_lm_head(module: nn.Module) -> bool:
    """Whether ``module`` has output embeddings (an LM head), so logits."""
    return embeddings(module, "output") is not None


def stream_model(model: nn.Module) -> nn.Module:
    """The part of ``model`` whose stream is analysed.

    ``model`` itself, the whole text model of a multimodal model that holds one (``families.TEXT_LMS``:
    Llama 4's LM; ``tower_families.TEXT_TOWERS``: CLIP's text model; in a head class, under its base model:
    ``OwlViTForObjectDetection``'s ``owlvit.text_model``), or an encoder-decoder model's encoder stack
    (``seq2seq_families.ENCODER_DECODERS``; a stack is its own). ``UnsupportedArchitectureError`` for a
    model of such a type that holds no text model (``CLIPForImageClassification``).
    """
    model_type = getattr(getattr(model, "config", None), "model_type", None)
    if model_type in ENCODER_DECODERS:
        return model.get_encoder()
    path = WHOLE_TEXT_MODELS.get(model_type)
    if path is None:
        return model
    for root in (model, getattr(model, "base_model", model)):
        if _has(root, path):
            return root.get_submodule(path)
    raise UnsupportedArchitectureError(
        f"a {type(model).__name__} holds no text model ({path}) to analyse: load the {model_type} model or "
        "its text model")


def check_config(config: object) -> None:
    """Refuse a model from its config alone, before any weight is read (a folder's load).

    An unsupported ``model_type``, or a variant its row refuses (a container's: its text model's),
    raises ``UnsupportedArchitectureError`` as ``describe`` would after the load.
    """
    model_type = getattr(config, "model_type", None)
    if model_type in CONTAINERS or model_type in WHOLE_TEXT_MODELS:
        config = config.get_text_config()
    _row(config)


def _spec_for(config: object) -> ArchSpec:
    """The row of ``config``'s family: refused if there is none or it refuses this variant.

    A variant whose weights' read maps leave something out (``maps_caveat``) is warned of.
    """
    spec = _row(config)
    caveat = spec.maps_caveat(config)
    if caveat:
        warnings.warn(f"{config.model_type}: {caveat}", stacklevel=4)
    return spec


def _row(config: object) -> ArchSpec:
    """The row of ``config``'s family; ``UnsupportedArchitectureError`` if none or it refuses this variant."""
    model_type = getattr(config, "model_type", None)
    if model_type in DECODER_TYPES:
        raise UnsupportedArchitectureError(
            f"this {model_type} model is {DECODER_TYPES[model_type]}, which no row describes; pass the whole "
            "model or its encoder (model.get_encoder()) to analyse the encoder")
    if model_type not in ARCHITECTURES:
        raise UnsupportedArchitectureError(
            f"architecture {model_type!r} is not supported: its stream program has not been "
            f"written down and verified. Supported: {', '.join(supported_architectures())}. "
            "To add one, describe it as an ArchSpec in residual_stream/families.py and add "
            "a conservation test."
        )
    spec = ARCHITECTURES[model_type]
    variant = spec.refuse(config)
    if variant:
        raise UnsupportedArchitectureError(
            f"this {model_type} model has {variant}, a variant of the family whose stream program "
            "has not been written down and verified; load a checkpoint without it, or describe "
            "it in residual_stream/families.py and add a conservation test")
    return spec


def _norm_spec(name: str, module: nn.Module, path: str, spec: ArchSpec) -> NormSpec:
    """What the norm at ``path`` computes, read from its class, unless the row says (``norm_kind``).

    A TransformerLens bridge's wrapper (``NormalizationBridge``) by the module it wraps; the
    hooks stay on the wrapper, which is what the model runs. A ``*LayerNorm`` class may lack a
    bias (Cohere's) or both parameters (OLMo's, whose ε, fixed in its code, the row gives).
    """
    inner = wrapped(module)
    cls = type(inner).__name__
    if spec.norm_kind is not None:
        kind = spec.norm_kind
    elif isinstance(inner, nn.LayerNorm) or cls.endswith("LayerNorm"):
        kind = "layernorm"
    elif "RMSNorm" in cls or isinstance(inner, nn.RMSNorm):
        kind = "rmsnorm"
    else:
        raise UnsupportedArchitectureError(f"norm module {path!r} of type {cls} is not recognised")
    eps = next((getattr(inner, a) for a in ("eps", "variance_epsilon") if hasattr(inner, a)), spec.norm_eps)
    if eps is None:
        raise UnsupportedArchitectureError(f"norm module {path!r} ({cls}) exposes no epsilon")

    def view(t: torch.Tensor | None) -> torch.Tensor | None:
        # a detached view, not a copy: later edits to the model's norm weights stay visible
        return None if t is None else t.detach()

    return NormSpec(name, kind, float(eps), view(parameter(module, "weight")),
                    view(parameter(module, "bias")), spec.weight_offset, path)


def _multiplier(name: str, c: float, d_model: int, owner: nn.Module, rounded: bool = False) -> NormSpec:
    """A constant multiplier ``c`` as a norm (kind ``"multiplier"``) on ``owner``'s device.

    Held in float64 (float32 on MPS, which has none): cast to a tensor's dtype, it is the value
    the model's ``x * c`` multiplies by. ``rounded``: the model multiplies by ``c`` as a tensor of its
    weights' dtype (``ArchSpec.multipliers_in_model_dtype``), so ``c`` is that dtype's value.
    """
    device = next((p.device for p in owner.parameters() if p.device.type != "meta"), torch.device("cpu"))
    if rounded:
        c = float(torch.tensor(c, dtype=next(owner.parameters()).dtype))
    dtype = torch.float32 if device.type == "mps" else torch.float64
    gain = torch.full((d_model,), float(c), dtype=dtype, device=device)
    return NormSpec(name, "multiplier", 0.0, gain, None)


def _in_out(module: nn.Module) -> tuple[int, int]:
    """(in, out) features of a Linear or GPT-2 Conv1D."""
    w = module.weight
    return (w.shape[0], w.shape[1]) if type(module).__name__ == "Conv1D" else (w.shape[1], w.shape[0])


def _first_attr(config: object, keys: tuple[str, ...], default: int) -> int:
    return next((int(getattr(config, k)) for k in keys if getattr(config, k, None)), default)


def _norms(spec: ArchSpec, config: object, base: nn.Module, full, n_layers: int,
           embed: str) -> dict[str, NormSpec]:
    """Every norm of the stream program by role name: modules, and constant multipliers.

    ``embed``: the token embedding's path, whose module owns an embedding multiplier.

    A block's ``block_scale`` buffer (Gemma 4's ``layer_scalar``, one value) is a multiplier whose
    gain is a view of it, as the norms' gains are views of their modules' weights.
    """
    norms: dict[str, NormSpec] = {}
    global_norms = {"ln_embed": spec.embed_norm, "ln_final": spec.final_norm}
    for role, path in global_norms.items():
        if path is not None and _has(base, path):
            norms[role] = _norm_spec(role, base.get_submodule(path), full(path), spec)
    block_norms = _read(spec.block_norms, config)
    for L in range(n_layers):
        for role, rel in block_norms.items():
            path = f"{spec.layers}.{L}.{rel}"
            if _has(base, path):
                norms[f"L{L}.{role}"] = _norm_spec(f"L{L}.{role}", base.get_submodule(path), full(path), spec)
    d_model = int(config.hidden_size)
    for role, c in spec.multipliers(config).items():
        for name, owner in ([(role, embed)] if role in ("ln_embed", "ln_embed_token") else
                            [(f"L{L}.{role}", f"{spec.layers}.{L}") for L in range(n_layers)]):
            norms[name] = _multiplier(name, c, d_model, base.get_submodule(owner),
                                      spec.multipliers_in_model_dtype)
    for L in range(n_layers) if spec.block_scale else ():  # a view: later edits to it stay visible
        scalar = base.get_submodule(f"{spec.layers}.{L}").get_buffer(spec.block_scale).detach()
        norms[f"L{L}.ln_block_out"] = NormSpec(f"L{L}.ln_block_out", "multiplier", 0.0,
                                               scalar.reshape(1).expand(d_model), None)
    return norms


def describe(model: nn.Module, *, has_lm_head: bool, lm_head_note: str = "") -> Anatomy:
    """Derive the ``Anatomy`` of a framework model from its config and modules."""
    config, base = _text_model(model)
    spec = _spec_for(config)
    prefix = next(n for n, m in model.named_modules() if m is base)

    def full(path: str) -> str:
        return f"{prefix}.{path}" if prefix else path

    n_layers = len(base.get_submodule(spec.layers))
    if n_layers == 0:
        raise UnsupportedArchitectureError(f"{config.model_type} model with no layers: the stream "
                                           "has no reads or writes to study; load one with 1 or more")
    if spec.cross_attention and _has(base, f"{spec.layers}.0.{spec.cross_attention}"):
        raise UnsupportedArchitectureError(
            f"this {config.model_type} model is a decoder stack: its blocks have cross-attention "
            f"({spec.cross_attention}), a third sublayer reading the encoder's output, which no row "
            "describes; pass the whole model or its encoder (model.get_encoder()) to analyse the encoder")
    placement = _read(spec.placement, config)

    embed_paths = _read(spec.embeds, config)
    norms = _norms(spec, config, base, full, n_layers, embed_paths["embed"])

    embeds = tuple(k for k, p in embed_paths.items() if _has(base, p))
    alpha = float(spec.alpha(config))
    layer_paths = tuple(f"{spec.layers}.{L}" for L in range(n_layers))
    mlp_out, mlp_in = _read(spec.mlp_out, config), _read(spec.mlp_in, config)
    has_mlp = _has(base, f"{layer_paths[0]}.{mlp_out}")
    program = compile_program(placement=placement, n_layers=n_layers, embeds=embeds,
                              norms=set(norms), alpha=alpha,
                              sublayers=("attn", "mlp") if has_mlp else ("attn",))
    attn0 = base.get_submodule(f"{layer_paths[0]}.{spec.attn_out}")
    n_heads = int(config.num_attention_heads)
    widths = _read(spec.d_mlp_keys, config)
    d_model = int(config.hidden_size)
    n_kv = int(spec.n_kv_heads(config) if spec.n_kv_heads else getattr(config, "num_key_value_heads", None)
               or n_heads)
    layer_heads = tuple(_heads(base, p, spec, config, n_heads, n_kv) for p in layer_paths)
    return Anatomy(
        architecture=config.model_type, placement=placement,
        norm_kind=next((n.kind for n in norms.values() if not n.constant), "none"),
        n_layers=n_layers, d_model=d_model, n_heads=n_heads,
        n_kv_heads=n_kv, d_head=max(d for d, _ in layer_heads), d_mlp=0 if not has_mlp else max(
            config_width(config, k) for k in widths) if widths
        else _mlp_width(base, layer_paths[0], mlp_out),
        d_vocab=int(config.vocab_size), n_ctx=_first_attr(config, spec.n_ctx_keys, 2048),
        embeds=embeds, norms=norms, program=program,
        modules=ModulePaths(
            layers=tuple(full(p) for p in layer_paths),
            embeds={k: full(embed_paths[k]) for k in embeds},
            attn_out=tuple(full(f"{p}.{spec.attn_out}") for p in layer_paths),
            mlp_out=tuple(full(f"{p}.{mlp_out}") for p in layer_paths) if has_mlp else (),
            norms={k: v.module_path for k, v in norms.items() if not v.constant},
            lm_head=_head_transform(model, spec.head_transform) if has_lm_head else None,
            qkv=_read(spec.qkv, config), qkv_layout=_read(spec.qkv_layout, config),
            mlp_in=mlp_in if has_mlp else "", mlp_down=spec.mlp_down if has_mlp else "",
            mlp_gate=spec.mlp_gate if has_mlp and any(  # (a model of experts: in its dense blocks)
                _has(base, f"{p}.{spec.mlp_gate}") for p in layer_paths) else None,
            mlp_layout=spec.mlp_layout,
            qk_norms=spec.qk_norms if spec.qk_norms and all(
                _has(base, f"{layer_paths[0]}.{p}") for p in spec.qk_norms) else None,
            qk_norm_offset=spec.weight_offset, mlp_out_in_place=spec.mlp_out_in_place,
            mlp_out_input=bool(_read(spec.mlp_out_input, config)),
            values_from=spec.values_from, v_norm=spec.v_norm,
            unembed_in=full(spec.unembed_in) if spec.unembed_in and _has(base, spec.unembed_in) else None,
            unembed_bias=spec.unembed_bias if has_lm_head and spec.unembed_bias else None,
        ),
        has_lm_head=has_lm_head, lm_head_note=lm_head_note, alpha=alpha,
        has_attn_bias=getattr(attn0, "bias", None) is not None,
        causal=_read(spec.causal, config), logit_scale=_logit_scale(spec, config, model.config),
        routing=spec.routing(config) if has_mlp else None, patterns_note=spec.patterns_refused(config),
        sinks_after_softmax=spec.sinks_after_softmax, layer_heads=layer_heads,
        states_before_final_norm=spec.states_before_final_norm,
        family=_family(spec, config, model.config),
    )


def _logit_scale(spec: ArchSpec, config: object, top: object) -> float | None:
    """What the logits are multiplied by: the row's, by its family's own head (``config is top``).

    A container's own head scales none (``families.CONTAINERS``), but for the few that say so
    (``recent_families.SCALING_HEADS``).
    """
    return spec.logit_scale(config) if config is top or top.model_type in SCALING_HEADS else None


def _family(spec: ArchSpec, config: object, top: object) -> str:
    """The row's description, and for a container's text model the container, and a scale its head drops."""
    if config is top:
        return spec.family
    dropped = spec.logit_scale(config) is not None and _logit_scale(spec, config, top) is None
    return (f"{spec.family}; the text model of the multimodal model {top.model_type!r}"
            + ("; its head scales no logits" if dropped else ""))


def _text_model(model: nn.Module) -> tuple[object, nn.Module]:
    """The config and the root module ``model`` is described by.

    Its own config and base model, or a multimodal container's text model's (``families.CONTAINERS``).
    """
    path = CONTAINERS.get(getattr(model.config, "model_type", None))
    if path is None:
        return model.config, _base_model(model)
    return model.config.get_text_config(), _base_model(model).get_submodule(path)


def _base_model(model: nn.Module) -> nn.Module:
    """``model.base_model``, or the conventional child holding the body of a model whose prefix misses it.

    ``Llama4ForCausalLM``'s ``base_model_prefix`` (``"language_model"``) names no attribute of
    it, so ``base_model`` is the head model itself; its body is ``model``. ``OwlViTTextModel``'s
    (``"owlvit"``) neither: its body is ``text_model``, a model of the same config.
    """
    base = model.base_model
    if base is not model:
        return base
    if isinstance(getattr(model, "model", None), nn.Module):
        return model.model
    body = getattr(model, "text_model", None)
    return body if isinstance(body, nn.Module) and getattr(body, "config", None) is model.config else base


def _read(field, config: object):
    """An ``ArchSpec`` field's value for ``config``: the value, or what its function gives."""
    return field(config) if callable(field) else field


def _has(module: nn.Module, path: str) -> bool:
    try:
        sub = module.get_submodule(path)
    except AttributeError:
        return False
    return not isinstance(sub, nn.Identity)


def _head_transform(model: nn.Module, transform: str | tuple[str, ...] | None) -> tuple[str, ...] | None:
    """The head transform's steps (``ArchSpec.head_transform``) where ``model`` has its modules."""
    steps = (transform,) if isinstance(transform, str) else transform
    if not steps or not all(s.startswith("act:") or _has(model, s) for s in steps):
        return None
    return steps


def _heads(base: nn.Module, layer: str, spec: ArchSpec, config: object, n_heads: int, n_kv: int):
    """``(d_head, n_kv_heads)`` of one block's attention, from its modules' widths.

    The width of each head from the output projection's input; key/value heads from a separate
    key projection's width where it has one (Gemma 4's full attentions: wider heads, fewer key/value
    heads than its sliding ones), else the model's.
    """
    d_head = _in_out(base.get_submodule(f"{layer}.{spec.attn_out}"))[0] // n_heads
    qkv = _read(spec.qkv, config)
    if _read(spec.qkv_layout, config) != "separate" or len(qkv) != 3 or not _has(base, f"{layer}.{qkv[1]}"):
        return d_head, n_kv
    width = _in_out(base.get_submodule(f"{layer}.{qkv[1]}"))[1]
    return d_head, width // d_head if width % d_head == 0 else n_kv


def _mlp_width(base: nn.Module, layer: str, mlp_out: str) -> int:
    """d_mlp: the input width of the last Linear/Conv1D inside the MLP write module."""
    mlp = base.get_submodule(f"{layer}.{mlp_out}")
    linears = [m for m in mlp.modules() if hasattr(m, "weight") and getattr(m.weight, "ndim", 0) == 2]
    return _in_out(linears[-1])[0] if linears else 0
