"""The rows of encoder-decoder models, whose ENCODER's stream is analysed (T5 and its descendants).

An encoder-decoder model (``T5ForConditionalGeneration``, ``T5Model``, ``T5EncoderModel``) is analysed
through its encoder stack alone (``architectures.text_lm``: ``model.get_encoder()``), which runs on
text by itself: a bidirectional encoder without an LM head, as T5's encoder conditions Flux and
Stable Diffusion 3. The decoder's stream has a third writer, cross-attention reading the encoder's
output, which no row describes; a decoder stack passed in alone is refused by name. A folder of such a
checkpoint loads its encoder only (``AutoModelForTextEncoding``'s class where it has one).

``families.ARCHITECTURES`` merges these rows with the others.
"""

from __future__ import annotations

from dataclasses import replace

from .arch_spec import ArchSpec

DECODER = "a decoder stack (its cross-attention, a third sublayer reading the encoder's output)"
_FF = "layer.1.DenseReluDense"  # T5LayerFF's MLP: wi (or wi_0 gating wi_1), then wo
_T5 = ArchSpec(
    family="T5 encoder (pre-RMSNorm, relative position bias, bidirectional; the encoder of an "
    "encoder-decoder model)",
    layers="block", embeds={"embed": "embed_tokens"}, final_norm="final_layer_norm",
    block_norms={"ln_attn_in": "layer.0.layer_norm", "ln_mlp_in": "layer.1.layer_norm"},
    attn_out="layer.0.SelfAttention.o", mlp_out=_FF,
    qkv=("layer.0.SelfAttention.q", "layer.0.SelfAttention.k", "layer.0.SelfAttention.v"),
    mlp_in=lambda cfg: f"{_FF}.wi_1" if cfg.is_gated_act else f"{_FF}.wi",
    mlp_gate=f"{_FF}.wi_0", mlp_down=f"{_FF}.wo",
    norm_kind="rmsnorm",  # T5LayerNorm: x / rms(x) · γ, no mean subtracted, no bias
    causal=False, n_ctx_keys=("n_positions",),
    refuse=lambda cfg: DECODER if cfg.is_decoder else None,
)

SEQ2SEQ: dict[str, ArchSpec] = {
    "t5": _T5,
    "mt5": replace(_T5, family=_T5.family.replace("T5 encoder", "mT5 encoder")),
    # UMT5: a relative position bias of each block's own, not block 0's shared
    "umt5": replace(_T5, family=_T5.family.replace("T5 encoder", "UMT5 encoder").replace(
        "relative position bias", "relative position bias in every block")),
}
# model types analysed through their encoder (``model.get_encoder()``)
ENCODER_DECODERS: frozenset[str] = frozenset(SEQ2SEQ)
