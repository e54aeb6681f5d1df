"""Rows of the text towers of contrastive and retrieval models (Chinese-CLIP, ALIGN, CLAP, FLAVA, TIPSv2).

Each is the text model's own ``model_type``; ``families.ARCHITECTURES`` merges them with the other rows.
``TEXT_TOWERS`` and ``WHOLE_TOWERS`` are the whole models (CLIP's, SigLIP's, these) whose ``text_model`` is
such a whole text model, analysed through it (``families.WHOLE_TEXT_MODELS``): the whole model's forward
needs images. Their pooling heads and projections read the final stream from outside; none has an LM head.
"""

from __future__ import annotations

import math
from dataclasses import replace

from .arch_spec import ArchSpec
from .encoder_families import BERT, ROBERTA
from .recent_families import CLIP_TEXT, SIGLIP_TEXT

_NO_HEAD = "pooler and projection outside the stream, no LM head"
# BERT's and RoBERTa's blocks, always bidirectional (their forward builds a bidirectional mask whatever the
# config says), without cross-attention modules
_BERT_TOWER = replace(BERT, head_transform=None, causal=False, refuse=lambda cfg: None,
                      family=f"BERT text encoder (post-LayerNorm, LayerNorm on the embeddings; {_NO_HEAD})")
_ROBERTA_TOWER = replace(_BERT_TOWER, family=_BERT_TOWER.family.replace("BERT", "RoBERTa"))

TOWERS: dict[str, ArchSpec] = {
    # OWL-ViT's, OWLv2's and GroupViT's text encoders: CLIP's (the public text class holds its body at
    # text_model, ``architectures._base_model``; the whole model's text_model is that body)
    **{t: replace(CLIP_TEXT, family=CLIP_TEXT.family.replace("CLIP", name)) for t, name in (
        ("owlvit_text_model", "OWL-ViT"), ("owlv2_text_model", "OWLv2"),
        ("groupvit_text_model", "GroupViT"))},
    # Chinese-CLIP's and ALIGN's text encoders: BERT's (token types, learned positions)
    "chinese_clip_text_model": replace(_BERT_TOWER,
                                       family=_BERT_TOWER.family.replace("BERT", "Chinese-CLIP")),
    "align_text_model": replace(_BERT_TOWER, family=_BERT_TOWER.family.replace("BERT", "ALIGN")),
    # CLAP's: RoBERTa's (positions counted past the padding index, in the embeddings module)
    "clap_text_model": replace(_ROBERTA_TOWER, family=_ROBERTA_TOWER.family.replace("RoBERTa", "CLAP")),
    # BridgeTower's text encoder (the whole model's text_model, a RoBERTa whose blocks the whole model runs
    # on text alone, its cross-modal layers reading their outputs from outside): causal only as a decoder
    "bridgetower_text_model": replace(
        ROBERTA, family=f"BridgeTower text encoder (RoBERTa's: post-LayerNorm, LayerNorm on the embeddings; "
        f"{_NO_HEAD})", head_transform=None),
    # FLAVA's text encoder: ViT's pre-LayerNorm blocks over BERT's embeddings (LayerNormed), its final
    # layernorm giving last_hidden_state; its hidden_states end before it. The MLP's output module adds the
    # residual itself, so the write is its dense map's output
    "flava_text_model": ArchSpec(
        family="FLAVA text encoder (pre-LayerNorm, LayerNorm on the embeddings and the final stream; "
        f"{_NO_HEAD})",
        layers="encoder.layer", embed_norm="embeddings.LayerNorm", final_norm="layernorm",
        embeds=BERT.embeds, block_norms={"ln_attn_in": "layernorm_before", "ln_mlp_in": "layernorm_after"},
        attn_out="attention.output.dense", mlp_out="output.dense",
        qkv=("attention.attention.query", "attention.attention.key", "attention.attention.value"),
        mlp_in="intermediate.dense", mlp_gate=None, mlp_down="output.dense", causal=False,
        states_before_final_norm=True),
    # TIPSv2's: SigLIP's blocks (bidirectional) over sinusoidal positions, the token embeddings multiplied by
    # √hidden_size inside the embeddings module before they are added (scale_sqrt_depth); mean pooling outside
    "tipsv2_text_model": replace(
        SIGLIP_TEXT, family="TIPSv2 text encoder (pre-LayerNorm, sinusoidal positions, scaled token "
        "embeddings, bidirectional, no LM head)",
        multipliers=lambda cfg: {"ln_embed_token": math.sqrt(cfg.hidden_size)} if (
            cfg.scale_sqrt_depth) else {}),
}
# model_type of a whole contrastive model → the class of its text_model, which a folder loads alone by the
# text config (the vision tower stays on disk): its weights are named as that class's own
TEXT_TOWERS: dict[str, str] = {
    "clip": "CLIPTextModel", "siglip": "SiglipTextModel", "siglip2": "Siglip2TextModel",
    "metaclip_2": "MetaClip2TextModel", "tipsv2": "Tipsv2TextModel", "owlvit": "OwlViTTextModel",
    "owlv2": "Owlv2TextModel", "groupvit": "GroupViTTextModel"}
# whole models analysed through their text_model whose checkpoints name its weights as the whole model's
# (text_model.…, which the text class alone does not strip): a folder loads the whole model (AutoModel),
# and the text model is kept (``families.WHOLE_TEXT_MODELS``)
WHOLE_TOWERS: tuple[str, ...] = ("chinese_clip", "align", "clap", "flava", "xclip", "bridgetower",
                                  "vision-text-dual-encoder")  # (its text_model: any supported text model)
