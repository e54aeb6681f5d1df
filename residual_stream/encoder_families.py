"""The encoders' rows of the architecture table (BERT and its descendants), post- or pre-LayerNorm.

``families.ARCHITECTURES`` merges them with the decoders' rows.
"""

from __future__ import annotations

import math
from dataclasses import replace

from .arch_spec import ArchSpec
from .family_rules import any_of, flag

CROSS = "cross-attention (a third sublayer, with its own norm, reading an encoder)"
BERT = ArchSpec(
    family="BERT encoder (post-LayerNorm, LayerNorm on the embeddings)",
    layers="encoder.layer", placement="post", embed_norm="embeddings.LayerNorm",
    embeds={"embed": "embeddings.word_embeddings", "type_embed": "embeddings.token_type_embeddings",
            "pos_embed": "embeddings.position_embeddings"},
    block_norms={"ln_resid_attn": "attention.output.LayerNorm", "ln_resid_mlp": "output.LayerNorm"},
    attn_out="attention.output.dense", mlp_out="output.dense",
    qkv=("attention.self.query", "attention.self.key", "attention.self.value"),
    mlp_in="intermediate.dense", mlp_gate=None, mlp_down="output.dense",
    head_transform="cls.predictions.transform", causal=lambda cfg: bool(cfg.is_decoder),
    refuse=flag("add_cross_attention", CROSS),
)
ROBERTA = replace(BERT, family="RoBERTa encoder (post-LayerNorm, LayerNorm on the embeddings)",
                   head_transform=("lm_head.dense", "act:gelu", "lm_head.layer_norm"))
_PRE = "pre-LayerNorm, LayerNorm on the final stream"  # BERT's descendants with pre-LN blocks
# ELECTRA's and RoFormer's embeddings are embedding_size wide: where that is not hidden_size, their
# LayerNorm is followed by a linear map into the stream (embeddings_project), which no row describes
_PROJECTED = any_of(BERT.refuse, lambda cfg: "embeddings LayerNormed in embedding_size, then projected "
                    "into the stream (embeddings_project: embedding_size ≠ hidden_size)" if (
                        cfg.embedding_size != cfg.hidden_size) else None)

_MODERNBERT = ArchSpec(
    family="ModernBERT encoder (pre-LayerNorm, none before block 0's attention, fused projections)",
    layers="layers", embeds={"embed": "embeddings.tok_embeddings"}, embed_norm="embeddings.norm",
    final_norm="final_norm", block_norms={"ln_attn_in": "attn_norm", "ln_mlp_in": "mlp_norm"},
    attn_out="attn.Wo", mlp_out="mlp", qkv=("attn.Wqkv",), qkv_layout="blocks",
    mlp_in="mlp.Wi", mlp_gate="mlp.Wi", mlp_layout="gate_up", mlp_down="mlp.Wo",
    head_transform="head", causal=False,
)
# Llama's block without the causal mask (EuroBERT); post-LayerNorm blocks with rotary, a gated MLP (NomicBERT)
_BIDI_LLAMA = ArchSpec(family="EuroBERT encoder (pre-RMSNorm, rotary, bidirectional)", layers="layers",
                       embeds={"embed": "embed_tokens"}, final_norm="norm", attn_out="self_attn.o_proj",
                       block_norms={"ln_attn_in": "input_layernorm", "ln_mlp_in": "post_attention_layernorm"},
                       mlp_out="mlp", causal=False)
_NOMIC = ArchSpec(
    family="NomicBERT encoder (post-LayerNorm, LayerNorm on the embeddings, rotary, gated MLP)",
    layers="layers", placement="post", embed_norm="embeddings.LayerNorm", attn_out="self_attn.o_proj",
    mlp_out="mlp",
    embeds={"embed": "embeddings.word_embeddings", "type_embed": "embeddings.token_type_embeddings"},
    block_norms={"ln_resid_attn": "post_attention_layernorm", "ln_resid_mlp": "post_mlp_layernorm"},
    head_transform="cls.predictions.transform", causal=False)
# ESM: ESM-2's rotary checkpoints scale the token embeddings inside the embeddings module
# (token_dropout: a mask token's zeroed, the rest × 0.88 / (1 − the sequence's share of mask tokens)),
# so the module's output is the embedding write; with learned positions or a LayerNorm in that module
# the scaling falls between hooks (ESM-1b, ESM-1v), described only with token_dropout off
_ESM_WHOLE = lambda cfg: cfg.position_embedding_type == "rotary" and not cfg.emb_layer_norm_before  # noqa: E731
_ESM_REFUSE = any_of(BERT.refuse, flag("is_folding_model", "ESMFold's folding trunk (is_folding_model)"),
                     lambda cfg: "token embeddings scaled by the share of mask tokens (token_dropout) before "
                     "learned positions are added or the embeddings' LayerNorm" if (
                         cfg.token_dropout and not _ESM_WHOLE(cfg)) else None)

# DeBERTa-v2's scores add, to q·k, each query's product with relative-position keys and each key's with
# relative-position queries (c2p, p2c): maps of the position embeddings, which never enter the stream
_DEBERTA_REFUSE = any_of(
    flag("conv_kernel_size", "a convolution over the embeddings (then an activation) added to block 0's "
         "output, under a LayerNorm of its own (conv_kernel_size)"),
    lambda cfg: "embeddings summed in embedding_size, then projected into the stream (embed_proj)" if (
        getattr(cfg, "embedding_size", cfg.hidden_size) != cfg.hidden_size) else None,
    lambda cfg: None if cfg.legacy else "an MLM head that multiplies by the word embeddings itself "
    "(legacy=False: its output embeddings name the head's dense map, not the unembedding)")
_DEBERTA_MAPS = lambda cfg: None if not (cfg.relative_attention and cfg.pos_att_type) else (  # noqa: E731
    "its attention scores add to each q·k the query's product with relative-position keys and the key's with "
    "relative-position queries (disentangled attention: c2p, p2c), and divide by √(d_head·(1 + terms)): the "
    "weights' W_Q and W_K are how queries and keys read the stream, but their bilinear form (QK circuits, "
    "Q/K-composition) is the content-to-content term alone; the stream, its decomposition, patching and "
    "attention patterns are exact")
# ESM C's (ESM3's block) LayerNorms on all heads' queries together and on all keys, before the rotary
_ESMC_QK = ("a LayerNorm without bias on all heads' queries together and one on all keys (q_norm, "
            "k_norm, over hidden_size), which centres them and scales them by a gain after the projection: "
            "the weights' read maps (W_Q, W_K, composition, read attribution of queries and keys) describe "
            "them before those norms; the stream, its decomposition, values and patching are exact")

# BERT's block in families whose embeddings module sums more writes, each a module's output: TAPAS's
# token types (segment, column, row, ... one embedding each), MarkupLM's XPath embedding (one MLP's output,
# of padding XPaths on text alone); RoC-BERT's shape and pronunciation embeddings are added to its
# embeddings (after their LayerNorm) only where their ids are given, never on text alone
_TAPAS_EMBEDS = lambda cfg: {  # noqa: E731
    "embed": "embeddings.word_embeddings", "pos_embed": "embeddings.position_embeddings",
    **{f"type_embed_{i}": f"embeddings.token_type_embeddings_{i}" for i in range(len(cfg.type_vocab_sizes))}}
# RoC-BERT's map_inputs_layer (concat_input) would be its token's write, but the embeddings module adds the
# token types and positions to that module's output in place, over what a hook on it keeps
_ROC_REFUSE = any_of(BERT.refuse, flag(
    "concat_input", "its token, shape and pronunciation embeddings concatenated and mapped into the stream "
    "(concat_input), the types and positions then added to that map's output in place"))
_NO_HEAD = "no LM head"
# LiLT's text blocks' scores add a layout stream's (its own blocks beside the text's, from the boxes)
_LILT_MAPS = (
    "its attention scores add to each q·k/√d_head the layout stream's (bounding boxes and positions, through "
    "blocks of its own beside the text's, which read the text's scores): the weights' W_Q and W_K are how "
    "queries and keys read the stream, but their bilinear form (QK circuits, Q/K-composition) is the text "
    "term alone; the stream, its decomposition, patching and attention patterns are exact")

ENCODERS: dict[str, ArchSpec] = {
    "bert": BERT,
    "roberta": ROBERTA, "xlm-roberta": ROBERTA, "camembert": ROBERTA, "data2vec-text": ROBERTA,
    "ernie": replace(BERT, family="ERNIE encoder (post-LayerNorm, LayerNorm on the embeddings, task "
                     "embeddings)", embeds={**BERT.embeds, "task_embed": "embeddings.task_type_embeddings"}),
    "bert-generation": replace(BERT, family="BERT-Generation encoder (post-LayerNorm, LayerNorm on the "
                               "embeddings, no token types)", head_transform=None),
    "roberta-prelayernorm": replace(
        ROBERTA, family=f"RoBERTa-PreLayerNorm encoder ({_PRE} and the embeddings)", placement="pre",
        final_norm="LayerNorm",
        block_norms={"ln_attn_in": "attention.LayerNorm", "ln_mlp_in": "intermediate.LayerNorm"}),
    "xlm-roberta-xl": replace(
        ROBERTA, family=f"XLM-RoBERTa-XL encoder ({_PRE})", placement="pre", embed_norm=None,
        final_norm="encoder.LayerNorm", block_norms={"ln_attn_in": "attention.self_attn_layer_norm",
                                                     "ln_mlp_in": "LayerNorm"}),
    "megatron-bert": replace(
        BERT, family=f"Megatron-BERT encoder ({_PRE})", placement="pre", embed_norm=None,
        final_norm="encoder.ln", block_norms={"ln_attn_in": "attention.ln", "ln_mlp_in": "ln"}),
    "electra": replace(
        BERT, family="ELECTRA encoder (post-LayerNorm, LayerNorm on the embeddings)", refuse=_PROJECTED,
        head_transform=("generator_predictions.dense", "act:gelu", "generator_predictions.LayerNorm")),
    "roformer": replace(  # rotary inside attention: no position embeddings in the stream
        BERT, family="RoFormer encoder (post-LayerNorm, LayerNorm on the embeddings, rotary)",
        embeds={"embed": "embeddings.word_embeddings", "type_embed": "embeddings.token_type_embeddings"},
        refuse=_PROJECTED, maps_caveat=lambda cfg: None if not cfg.rotary_value else (
            "its values are rotated by position as its queries and keys are (rotary_value): the weights' "
            "value maps (W_V, OV circuits, composition through values) describe them before the rotation; "
            "the stream, its decomposition and patching are exact")),
    "big_bird": replace(
        BERT, family="BigBird encoder with full attention (post-LayerNorm, LayerNorm on the embeddings)",
        refuse=any_of(BERT.refuse, lambda cfg: "block-sparse attention (attention_type='block_sparse': "
                      "global, sliding and random blocks, the sequence padded to whole blocks)" if (
                          cfg.attention_type != "original_full") else None,
                      flag("rescale_embeddings", "token embeddings scaled by √hidden_size outside their "
                           "module (rescale_embeddings)"))),
    "distilbert": ArchSpec(
        family="DistilBERT encoder (post-LayerNorm, LayerNorm on the embeddings)",
        layers="transformer.layer", placement="post", embed_norm="embeddings.LayerNorm",
        embeds={"embed": "embeddings.word_embeddings", "pos_embed": "embeddings.position_embeddings"},
        block_norms={"ln_resid_attn": "sa_layer_norm", "ln_resid_mlp": "output_layer_norm"},
        attn_out="attention.out_lin", mlp_out="ffn",
        qkv=("attention.q_lin", "attention.k_lin", "attention.v_lin"),
        mlp_in="ffn.lin1", mlp_gate=None, mlp_down="ffn.lin2",
        head_transform=("vocab_transform", "activation", "vocab_layer_norm"), causal=False,
    ),
    "modernbert": _MODERNBERT,
    "esm": replace(  # rotary (ESM-2) or learned positions and a LayerNorm on the embeddings (ESM-1b)
        ROBERTA, family=f"ESM encoder ({_PRE})", placement="pre", embed_norm="embeddings.layer_norm",
        embeds=lambda cfg: {"embed": "embeddings"} if _ESM_WHOLE(cfg) else {
            "embed": "embeddings.word_embeddings", "pos_embed": "embeddings.position_embeddings"},
        final_norm="encoder.emb_layer_norm_after", refuse=_ESM_REFUSE, unembed_bias="lm_head.bias",
        block_norms={"ln_attn_in": "attention.LayerNorm", "ln_mlp_in": "LayerNorm"}),
    "deberta-v2": replace(  # (DeBERTa-v3 too: no position embeddings in the stream, no token types)
        BERT, family="DeBERTa-v2 encoder (post-LayerNorm, LayerNorm on the embeddings, disentangled "
        "attention)",
        embeds={**BERT.embeds, "pos_embed": "embeddings.position_embeddings"}, causal=False,
        qkv=("attention.self.query_proj", "attention.self.key_proj", "attention.self.value_proj"),
        refuse=_DEBERTA_REFUSE, maps_caveat=_DEBERTA_MAPS),
    "modernbert-decoder": replace(  # ModernBERT's block with separate projections and a causal mask
        _MODERNBERT, family="ModernBERT decoder (pre-LayerNorm, none before block 0's attention)",
        qkv=("attn.q_proj", "attn.k_proj", "attn.v_proj"), qkv_layout="separate", head_transform="lm_head",
        causal=True),
    "eurobert": _BIDI_LLAMA,
    "nomic_bert": _NOMIC,
    "gte": replace(  # (its down_proj and q, k, v, o with biases)
        _NOMIC, family="GTE encoder (post-LayerNorm, LayerNorm on the embeddings, rotary, gated MLP)",
        head_transform=ROBERTA.head_transform),
    "jina_embeddings_v3": replace(
        _NOMIC, family="Jina Embeddings v3 encoder (post-LayerNorm, LayerNorm on the embeddings, rotary)",
        mlp_in="mlp.fc1", mlp_gate=None, mlp_down="mlp.fc2", head_transform=ROBERTA.head_transform),
    "mpnet": replace(  # a bias on the scores by relative position, shared by the blocks (the eager patterns')
        BERT, family="MPNet encoder (post-LayerNorm, LayerNorm on the embeddings, relative position bias)",
        embeds={"embed": "embeddings.word_embeddings", "pos_embed": "embeddings.position_embeddings"},
        attn_out="attention.attn.o", qkv=("attention.attn.q", "attention.attn.k", "attention.attn.v"),
        block_norms={"ln_resid_attn": "attention.LayerNorm", "ln_resid_mlp": "output.LayerNorm"},
        head_transform=ROBERTA.head_transform, causal=False, refuse=lambda cfg: None),
    "esmc": replace(  # its writes divided by √(layers / 36) as the block adds them: multipliers
        _BIDI_LLAMA, family="ESM C encoder (pre-LayerNorm, rotary, LayerNorms on queries and keys, scaled "
        "writes)",
        multipliers=lambda cfg: dict.fromkeys(("ln_attn_out", "ln_mlp_out"),
                                              1 / math.sqrt(cfg.num_hidden_layers / 36)),
        head_transform=ROBERTA.head_transform, maps_caveat=lambda cfg: _ESMC_QK),
    "ultrabert": replace(  # EuroBERT's block, sliding windows in some blocks; a two-layer MLM head
        _BIDI_LLAMA, family="UltraBERT encoder (pre-RMSNorm, rotary, bidirectional, sliding windows)",
        head_transform=("head.linear1", "act:gelu_pytorch_tanh", "head.linear2", "act:gelu_pytorch_tanh")),
    # AltCLIP's text encoder: XLM-RoBERTa's blocks (base model roberta); its pre_LN and transformation map
    # the last hidden state outside the stream, and it has no LM head
    "altclip_text_model": replace(
        ROBERTA, family="AltCLIP text encoder (XLM-RoBERTa's: post-LayerNorm, LayerNorm on the embeddings; "
        "pre_LN and projection outside the stream, no LM head)", layers="encoder.layers", head_transform=None,
        causal=False),
    "rembert": replace(  # embeddings summed, LayerNormed in input_embedding_size, then projected: one write
        BERT, family="RemBERT encoder (post-LayerNorm; embeddings LayerNormed, then projected into the "
        "stream)",
        embeds={"embed": "encoder.embedding_hidden_mapping_in"}, embed_norm=None,
        head_transform=("cls.predictions.dense", "cls.predictions.activation", "cls.predictions.LayerNorm")),
    "splinter": replace(
        BERT, family=f"Splinter encoder (BERT's: post-LayerNorm, LayerNorm on the embeddings; {_NO_HEAD})",
        head_transform=None, causal=False),
    "tapas": replace(
        BERT, family="TAPAS encoder (post-LayerNorm, LayerNorm on the embeddings, an embedding per kind of "
        "token type)", embeds=_TAPAS_EMBEDS, causal=False),
    "markuplm": replace(
        BERT, family=f"MarkupLM encoder (post-LayerNorm, LayerNorm on the embeddings, XPath embeddings; "
        f"{_NO_HEAD})", embeds={**BERT.embeds, "xpath_embed": "embeddings.xpath_embeddings"},
        head_transform=None, causal=False),
    "roc_bert": replace(
        BERT, family="RoC-BERT encoder on text alone (BERT's: post-LayerNorm, LayerNorm on the embeddings; "
        "no shape or pronunciation embeddings)", refuse=_ROC_REFUSE),
    "luke": replace(
        ROBERTA, family="LUKE encoder on text alone (RoBERTa's: post-LayerNorm, LayerNorm on the "
        "embeddings)", causal=False, refuse=lambda cfg: None),
    "lilt": replace(
        BERT, family=f"LiLT text encoder (post-LayerNorm, LayerNorm on the embeddings, scores with a layout "
        f"stream's; {_NO_HEAD})", head_transform=None, causal=False, refuse=lambda cfg: None,
        maps_caveat=lambda cfg: _LILT_MAPS),
}
