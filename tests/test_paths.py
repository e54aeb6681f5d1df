"""Path patching (``rs.path_patch``) against hooks of the test's own on the Hugging Face module.

The reference is written from the HF modules alone: each sender's write difference is taken
from its output projection's input (or the MLP's output, or the embedding's), carried by hand
in float64 through the norms the test names between sender and receiver (with the clean run's
scales, read from those modules' inputs), and given to the receiver by replacing its
projections' outputs (their columns, for a head) with the projection of the HF norm module's
output on the patched stream.
"""

import pytest
import torch
from conftest import TEXTS, hooks_of, metric_failing_after_clean
from test_patching import CORRUPT, _diff, _setup
from tiny_hf import COMMON, GRANITE, MINICPM3, build

import residual_stream as rs
from residual_stream.errors import InputError, NotAvailableError, UnknownNameError
from residual_stream.inputs import ByteTokenizer

ATOL = 2e-6  # float32 logits (~1e-7 apart): the library's hooks add a difference, the test's replace
# the output, and runs stacked in one pass round as their own batch
HEADS, KV = 4, {"llama": 2, "gemma2": 2, "olmo2": 2, "phi3": 2, "gpt_bigcode": 1, "mixtral": 2,  # d_model 64
                "gpt_oss": 2, "granite": 2, "granitemoe": 2, "falcon": 1, "falcon_new": 2, "glm4_moe": 2,
                "dbrx": 2, "nanochat": 2, "minimax_m2": 2, "gemma4_text": 2,
                "gemma4_moe": 2}
MINICPM3_M = MINICPM3["scale_depth"] / COMMON["num_hidden_layers"] ** 0.5  # MiniCPM3's write multiplier
ALPHA = 6 ** 0.25  # DeepNorm's α = (2N)^¼ for the twin's 3 blocks
EMBED_M, WRITE_M = GRANITE["embedding_multiplier"], GRANITE["residual_multiplier"]  # Granite's

# Per family: blocks, each write's module ("o": the output projection, whose input is z),
# whether its weight is a Conv1D's [in, out], what each component reads the stream through
# (None: raw, from the block input or the named module's input), the projections reading it,
# the final read, and where a head's q/k/v columns are.
FAMILIES = {
    "llama": dict(blocks="model.layers", o="self_attn.o_proj", mlp="mlp", conv=False,
                  read={"attn": "input_layernorm", "mlp": "post_attention_layernorm"},
                  qkv=("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj"),
                  mlp_in=("mlp.gate_proj", "mlp.up_proj"), final="model.norm", layout="separate"),
    "gemma2": dict(blocks="model.layers", o="self_attn.o_proj", mlp="mlp", conv=False,
                   read={"attn": "input_layernorm", "mlp": "pre_feedforward_layernorm"},
                   qkv=("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj"),
                   mlp_in=("mlp.gate_proj", "mlp.up_proj"), final="model.norm", layout="separate"),
    "gpt2": dict(blocks="transformer.h", o="attn.c_proj", mlp="mlp", conv=True,
                 read={"attn": "ln_1", "mlp": "ln_2"}, qkv=("attn.c_attn",), mlp_in=("mlp.c_fc",),
                 final="transformer.ln_f", layout="blocks", embed="transformer.wte"),
    "gpt_neox_parallel": dict(blocks="gpt_neox.layers", o="attention.dense", mlp="mlp", conv=False,
                              read={"attn": "input_layernorm", "mlp": "post_attention_layernorm"},
                              qkv=("attention.query_key_value",), mlp_in=("mlp.dense_h_to_4h",),
                              final="gpt_neox.final_layer_norm", layout="per_head"),
    "bert_mlm": dict(blocks="bert.encoder.layer", o="attention.output.dense", mlp="output.dense",
                     conv=False, read={"attn": None, "mlp": "intermediate"}, raw_mlp=True,
                     qkv=("attention.self.query", "attention.self.key", "attention.self.value"),
                     mlp_in=("intermediate.dense",), final=None, layout="separate"),
    "megatron-bert_mlm": dict(blocks="bert.encoder.layer", o="attention.output.dense", mlp="output.dense",
                              conv=False, read={"attn": "attention.ln", "mlp": "ln"},  # BERT, pre-LN
                              qkv=("attention.self.query", "attention.self.key", "attention.self.value"),
                              mlp_in=("intermediate.dense",), final="bert.encoder.ln", layout="separate",
                              embed="bert.embeddings.word_embeddings"),
    # DeepSeek's latent attention: the modules reading the stream are two low-rank maps
    "deepseek_v3": dict(blocks="model.layers", o="self_attn.o_proj", mlp="mlp", conv=False,
                        read={"attn": "input_layernorm", "mlp": "post_attention_layernorm"},
                        qkv=("self_attn.q_a_proj", "self_attn.kv_a_proj_with_mqa"),
                        mlp_in=("mlp",), final="model.norm", layout="latent"),
    # DeepSeek-V3.2: its sparse-attention indexer reads the stream too, through modules of its own
    "deepseek_v32": dict(blocks="model.layers", o="self_attn.o_proj", mlp="mlp", conv=False,
                         read={"attn": "input_layernorm", "mlp": "post_attention_layernorm"},
                         qkv=("self_attn.q_a_proj", "self_attn.kv_a_proj_with_mqa", "self_attn.indexer.wk",
                              "self_attn.indexer.weights_proj"), mlp_in=("mlp",), final="model.norm",
                         layout="latent"),
    "glm_moe_dsa": dict(blocks="model.layers", o="self_attn.o_proj", mlp="mlp", conv=False,  # V3.2's
                        read={"attn": "input_layernorm", "mlp": "post_attention_layernorm"},
                        qkv=("self_attn.q_a_proj", "self_attn.kv_a_proj_with_mqa", "self_attn.indexer.wk",
                             "self_attn.indexer.weights_proj"), mlp_in=("mlp",), final="model.norm",
                        layout="latent"),
    # MiniMax-M2: one RMSNorm over all heads' queries (keys), as OLMo 2's; an MLP of experts
    "minimax_m2": dict(blocks="model.layers", o="self_attn.o_proj", mlp="mlp", conv=False,
                       read={"attn": "input_layernorm", "mlp": "post_attention_layernorm"},
                       qkv=("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj"),
                       qk_norm=("self_attn.q_norm", "self_attn.k_norm", None), mlp_in=("mlp",),
                       final="model.norm", layout="separate", embed="model.embed_tokens"),
    # Gemma 4: sandwich RMSNorms (γ, not 1 + γ), the stream times each block's layer_scalar as the block
    # ends; its last block's (full) attention has heads 32 wide, one key/value head, and keys as values
    "gemma4_text": dict(blocks="model.layers", o="self_attn.o_proj", mlp="mlp", conv=False,
                        read={"attn": "input_layernorm", "mlp": "pre_feedforward_layernorm"},
                        qkv=("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj"),
                        heads_at={2: (32, 1)}, qkv_at={2: ("self_attn.q_proj", "self_attn.k_proj",
                                                          "self_attn.k_proj")},
                        mlp_in=("mlp.gate_proj", "mlp.up_proj"), final="model.norm", layout="separate",
                        embed="model.embed_tokens"),
    # Gemma 4 26B-A4B's blocks: a dense MLP and experts, their normed outputs' sum the input of the
    # write's norm (mlp_input: the write recorded there), read from the raw stream
    "gemma4_moe": dict(blocks="model.layers", o="self_attn.o_proj", mlp="post_feedforward_layernorm",
                       mlp_input=True, conv=False, read={"attn": "input_layernorm", "mlp": None},
                       qkv=("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj"), mlp_in=(),
                       final="model.norm", layout="separate", embed="model.embed_tokens"),
    # MiniCPM3: latent attention, writes times scale_depth / √layers, scaled embeddings and logits
    "minicpm3": dict(blocks="model.layers", o="self_attn.o_proj", mlp="mlp", conv=False,
                     read={"attn": "input_layernorm", "mlp": "post_attention_layernorm"},
                     qkv=("self_attn.q_a_proj", "self_attn.kv_a_proj_with_mqa"),
                     mlp_in=("mlp.gate_proj", "mlp.up_proj"), final="model.norm", layout="latent",
                     embed="model.embed_tokens"),
    # nanochat: one norm module run twice, on the embeddings and on the final stream (final=None:
    # the logits' delta goes on the last block's output, not into both of that module's calls)
    "nanochat": dict(blocks="model.layers", o="self_attn.o_proj", mlp="mlp", conv=False,
                     read={"attn": "input_layernorm", "mlp": "post_attention_layernorm"},
                     qkv=("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj"),
                     mlp_in=("mlp.fc1",), final=None, layout="separate"),
    "olmo2": dict(blocks="model.layers", o="self_attn.o_proj", mlp="mlp", conv=False,  # reads raw
                  read={"attn": None, "mlp": "mlp"}, raw_mlp=True, final="model.norm", layout="separate",
                  qkv=("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj"),
                  qk_norm=("self_attn.q_norm", "self_attn.k_norm", None),  # over every head at once
                  mlp_in=("mlp.gate_proj", "mlp.up_proj"), embed="model.embed_tokens"),
    # fused [q | k | v] (2 key/value heads) and [gate | up]
    "phi3": dict(blocks="model.layers", o="self_attn.o_proj", mlp="mlp", conv=False,
                 read={"attn": "input_layernorm", "mlp": "post_attention_layernorm"},
                 qkv=("self_attn.qkv_proj",), mlp_in=("mlp.gate_up_proj",), final="model.norm",
                 layout="blocks"),
    "gpt_bigcode": dict(blocks="transformer.h", o="attn.c_proj", mlp="mlp", conv=False,  # 1 kv head
                        read={"attn": "ln_1", "mlp": "ln_2"}, qkv=("attn.c_attn",), mlp_in=("mlp.c_fc",),
                        final="transformer.ln_f", layout="blocks", embed="transformer.wte"),
    "gpt_bigcode_mha": dict(blocks="transformer.h", o="attn.c_proj", mlp="mlp", conv=False,  # [h: q k v]
                            read={"attn": "ln_1", "mlp": "ln_2"}, qkv=("attn.c_attn",), mlp_in=("mlp.c_fc",),
                            final="transformer.ln_f", layout="per_head", embed="transformer.wte"),
    "mixtral": dict(blocks="model.layers", o="self_attn.o_proj", mlp="mlp", conv=False,  # experts
                    read={"attn": "input_layernorm", "mlp": "post_attention_layernorm"},
                    qkv=("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj"),
                    mlp_in=("mlp",), final="model.norm", layout="separate"),  # the whole MLP reads
    "gpt_oss": dict(blocks="model.layers", o="self_attn.o_proj", mlp="mlp", conv=False,  # (write, scores)
                    read={"attn": "input_layernorm", "mlp": "post_attention_layernorm"},
                    qkv=("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj"),
                    mlp_in=("mlp",), final="model.norm", layout="separate"),
    "gptj": dict(blocks="transformer.h", o="attn.out_proj", mlp="mlp", conv=False,  # one norm, both read
                 read={"attn": "ln_1", "mlp": "ln_1"}, qkv=("attn.q_proj", "attn.k_proj", "attn.v_proj"),
                 mlp_in=("mlp.fc_in",), final="transformer.ln_f", layout="separate"),
    "granite": dict(blocks="model.layers", o="self_attn.o_proj", mlp="mlp", conv=False,  # multipliers
                    read={"attn": "input_layernorm", "mlp": "post_attention_layernorm"},
                    qkv=("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj"),
                    mlp_in=("mlp.gate_proj", "mlp.up_proj"), final="model.norm", layout="separate",
                    embed="model.embed_tokens"),
    "granitemoe": dict(blocks="model.layers", o="self_attn.o_proj", mlp="block_sparse_moe", conv=False,
                       read={"attn": "input_layernorm", "mlp": "post_attention_layernorm"},
                       qkv=("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj"),
                       mlp_in=("block_sparse_moe",), final="model.norm", layout="separate"),
    # the MLP (and BLOOM's attention) module adds the residual itself: the write is a projection's
    "bloom": dict(blocks="transformer.h", o="self_attention.dense", mlp="mlp.dense_4h_to_h", conv=False,
                  read={"attn": "input_layernorm", "mlp": "post_attention_layernorm"},
                  qkv=("self_attention.query_key_value",), mlp_in=("mlp.dense_h_to_4h",),
                  final="transformer.ln_f", layout="per_head", embed="transformer.word_embeddings"),
    "mpt": dict(blocks="transformer.blocks", o="attn.out_proj", mlp="ffn.down_proj", conv=False,
                read={"attn": "norm_1", "mlp": "norm_2"}, qkv=("attn.Wqkv",), mlp_in=("ffn.up_proj",),
                final="transformer.norm_f", layout="blocks"),
    "dbrx": dict(blocks="transformer.blocks", o="norm_attn_norm.attn.out_proj", mlp="ffn", conv=False,
                 read={"attn": "norm_attn_norm.norm_1", "mlp": "norm_attn_norm.norm_2"},  # nested maps
                 qkv=("norm_attn_norm.attn.Wqkv",), mlp_in=("ffn",), final="transformer.norm_f",
                 layout="blocks", embed="transformer.wte"),  # [q | k | v], 2 key/value heads; experts
    "falcon": dict(blocks="transformer.h", o="self_attention.dense", mlp="mlp", conv=False,  # 1 kv head
                   read={"attn": "input_layernorm", "mlp": "input_layernorm"},
                   qkv=("self_attention.query_key_value",), mlp_in=("mlp.dense_h_to_4h",),
                   final="transformer.ln_f", layout="blocks"),
    "falcon_new": dict(blocks="transformer.h", o="self_attention.dense", mlp="mlp", conv=False,
                       read={"attn": "ln_attn", "mlp": "ln_mlp"}, qkv=("self_attention.query_key_value",),
                       mlp_in=("mlp.dense_h_to_4h",), final="transformer.ln_f", layout="groups"),
    "glm4_moe": dict(blocks="model.layers", o="self_attn.o_proj", mlp="mlp", conv=False,  # block 0 dense
                     read={"attn": "input_layernorm", "mlp": "post_attention_layernorm"},
                     qkv=("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj"),  # per-head norms
                     mlp_in=("mlp.gate_proj", "mlp.up_proj"), final="model.norm", layout="separate"),
    # OPT: its MLP and that norm run on tokens flattened to [batch·pos, d]; 350m post-LayerNorm
    "opt": dict(blocks="model.decoder.layers", o="self_attn.out_proj", mlp="fc2", conv=False,
                read={"attn": "self_attn_layer_norm", "mlp": "final_layer_norm"},
                qkv=("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj"), mlp_in=("fc1",),
                final="model.decoder.final_layer_norm", layout="separate",
                embed="model.decoder.embed_tokens"),
    "opt_post": dict(blocks="model.decoder.layers", o="self_attn.out_proj", mlp="fc2", conv=False,
                     read={"attn": None, "mlp": "fc1"}, raw_mlp=True,
                     qkv=("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj"), mlp_in=("fc1",),
                     final=None, layout="separate", embed="model.decoder.project_in"),
    "openai-gpt": dict(blocks="transformer.h", o="attn.c_proj", mlp="mlp", conv=True,  # post-LayerNorm
                       read={"attn": None, "mlp": "mlp"}, raw_mlp=True, qkv=("attn.c_attn",),
                       mlp_in=("mlp.c_fc",), final=None, layout="blocks", embed="transformer.tokens_embed"),
    "codegen": dict(blocks="transformer.h", o="attn.out_proj", mlp="mlp", conv=False, heads=8,
                    read={"attn": "ln_1", "mlp": "ln_1"}, qkv=("attn.qkv_proj",), mlp_in=("mlp.fc_in",),
                    final="transformer.ln_f", layout="shards4"),  # [shard: q v k], 2 heads a shard
    "twin_deepnorm": dict(blocks="blocks", o="attn.o_proj", mlp="mlp", conv=False,
                          read={"attn": None, "mlp": "mlp"}, raw_mlp=True,
                          qkv=("attn.q_proj", "attn.k_proj", "attn.v_proj"), mlp_in=("mlp.fc_in",),
                          final=None, layout="separate"),
}

# (family, senders, receiver, what stands between them by hand, in order: a norm module's path,
# or DeepNorm's α as a number)
L = {f: FAMILIES[f]["blocks"] for f in FAMILIES}
CASES = [
    ("llama", ["L0H1"], "L1H2.q", []),
    ("llama", ["L0H1"], "L1H3.k", []),              # grouped-query: key head 1, shared with head 2
    ("llama", ["L0.mlp"], "L1.attn", []),
    ("llama", ["L0H0", "L0H1"], "L2.mlp", []),
    ("llama", ["L1H2"], "logits", []),
    ("llama", ["L0.attn"], "L0.mlp", []),
    ("llama", ["L0.mlp"], ("L1H0.k", "L1H1.k"), []),  # one key head: changed once
    ("llama", ["L0.mlp"], ("L1.attn", "L1H0"), []),
    ("llama", ["L0.mlp"], ("L1.attn", "L2.mlp"), []),  # block 2's MLP reads what block 1 then wrote
    ("gemma2", ["L0H1"], "L1H2.q", [f"{L['gemma2']}.0.post_attention_layernorm"]),
    ("gemma2", ["L0.mlp"], "logits", [f"{L['gemma2']}.0.post_feedforward_layernorm"]),
    ("gpt2", ["L0H1"], "L1H2.k", []),
    ("gpt2", ["embed"], "L0H1.v", []),
    ("gpt2", ["L0.mlp"], "logits", []),
    ("gpt_neox_parallel", ["L0H1"], "L1H1.v", []),
    ("gpt_neox_parallel", ["L0.mlp"], "L1.attn", []),
    ("bert_mlm", ["L0H1"], "L1.attn", [f"{L['bert_mlm']}.0.attention.output.LayerNorm",
                                       f"{L['bert_mlm']}.0.output.LayerNorm"]),
    ("bert_mlm", ["L0.mlp"], "L1H2.q", [f"{L['bert_mlm']}.0.output.LayerNorm"]),
    ("deepseek_v3", ["L0H1"], "L1.attn", []),          # through both low-rank maps
    ("deepseek_v3", ["L0.mlp"], ("L1.mlp", "L2.attn"), []),  # a dense MLP sending, experts receiving
    ("deepseek_v3", ["L1.mlp"], "logits", []),
    ("deepseek_v32", ["L0H1"], "L1.attn", []),         # through MLA's maps and the indexer's
    ("deepseek_v32", ["L0.mlp"], ("L1.mlp", "L2.attn"), []),
    ("deepseek_v32", ["L1.mlp"], "logits", []),
    ("glm_moe_dsa", ["L0H1"], "L1.attn", []),
    ("glm_moe_dsa", ["L0.mlp"], ("L1.mlp", "L2.attn"), []),
    ("minimax_m2", ["L0.mlp"], "L1H2.q", []),          # one head's query, after the all-heads norm
    ("minimax_m2", ["L0H1"], ("L1H3.k", "L2.mlp"), []),
    ("minimax_m2", ["embed"], ("L0H0.v", "L1.attn"), []),
    ("gemma4_text", ["L0H1"], "L1H2.q", [f"{L['gemma4_text']}.0.{n}" for n in ("post_attention_layernorm",
                                                                                "layer_scalar")]),
    ("gemma4_text", ["L0.mlp"], ("L1H3.v", "L1.mlp"), [f"{L['gemma4_text']}.0.{n}" for n in (
        "post_feedforward_layernorm", "layer_scalar")]),
    ("gemma4_text", ["L0.mlp"], "L2H1", [f"{L['gemma4_text']}.{n}" for n in (  # its key head is its value
        "0.post_feedforward_layernorm", "0.layer_scalar", "1.layer_scalar")]),  # head (attention_k_eq_v)
    ("gemma4_text", ["L1H0"], "L2.attn", [f"{L['gemma4_text']}.1.{n}" for n in (
        "post_attention_layernorm", "layer_scalar")]),
    ("gemma4_text", ["L2.mlp"], "logits", [f"{L['gemma4_text']}.2.{n}" for n in (
        "post_feedforward_layernorm", "layer_scalar")]),  # through the final norm, soft-capped
    ("gemma4_moe", ["L0.mlp"], "L1H2.q", [f"{L['gemma4_moe']}.0.{n}" for n in ("post_feedforward_layernorm",
                                                                              "layer_scalar")]),
    ("gemma4_moe", ["L0H3"], ("L1.attn", "L1H0"), [f"{L['gemma4_moe']}.0.{n}" for n in (
        "post_attention_layernorm", "layer_scalar")]),
    ("gemma4_moe", ["L1.mlp"], "logits", [f"{L['gemma4_moe']}.{n}" for n in (
        "1.post_feedforward_layernorm", "1.layer_scalar", "2.layer_scalar")]),
    ("minicpm3", ["L0H1"], "L1.attn", [MINICPM3_M]),   # each write is added times the multiplier
    ("minicpm3", ["embed"], "L0.mlp", []),             # (scaled inside the embedding module)
    ("minicpm3", ["L0.mlp"], "logits", [MINICPM3_M]),  # (the model scales the final stream itself)
    ("nanochat", ["L0H1"], "L1H2.v", []),
    ("nanochat", ["L0.mlp"], ("L1.mlp", "L2H0.q"), []),   # (q normed after rotary, per head)
    ("nanochat", ["L1.mlp"], "logits", []),                # through the final norm, soft-capped
    ("megatron-bert_mlm", ["L0H1"], "L1H2.v", []),
    ("megatron-bert_mlm", ["L0.mlp"], ("L1.mlp", "L2H0.q"), []),
    ("megatron-bert_mlm", ["embed"], "L0H3.v", []),
    ("megatron-bert_mlm", ["L1.mlp"], "logits", []),       # through the final norm and the MLM head
    ("bert_mlm", ["L0H1"], "L0.mlp", [f"{L['bert_mlm']}.0.attention.output.LayerNorm"]),
    ("bert_mlm", ["L1.attn"], "logits", [f"{L['bert_mlm']}.{i}.{n}" for i in (1, 2) for n in
                                         ("attention.output.LayerNorm", "output.LayerNorm")]),
    ("olmo2", ["L0.mlp"], "L1H2.q", [f"{L['olmo2']}.0.post_feedforward_layernorm"]),
    ("olmo2", ["L0H1"], "L1H3.k", [f"{L['olmo2']}.0.post_attention_layernorm"]),
    ("olmo2", ["embed"], ("L0H0.q", "L1.mlp"), []),
    ("olmo2", ["L0.mlp"], ("L1.attn", "L1H0"), [f"{L['olmo2']}.0.post_feedforward_layernorm"]),
    ("phi3", ["L0H1"], "L1H3.k", []),
    ("phi3", ["L0.attn"], "L1.mlp", []),             # gate and up: one projection, changed once
    ("phi3", ["L0.mlp"], ("L1H0.v", "L1H2.q"), []),
    ("gpt_bigcode", ["L0H1"], "L1H2.v", []),         # the one value head every query head reads
    ("gpt_bigcode", ["embed"], "L0H3.v", []),        # (its queries and keys barely move the metric)
    ("gpt_bigcode", ["L0.mlp"], "L1.mlp", []),
    ("gpt_bigcode_mha", ["L0H1"], "L1H2.v", []),
    ("gpt_bigcode_mha", ["embed"], "L0H3.v", []),
    ("mixtral", ["L0H1"], "L1.mlp", []),
    ("mixtral", ["L0.mlp"], ("L1.mlp", "L1H2.q"), []),
    ("mixtral", ["L1.mlp"], "L2.mlp", []),
    ("gpt_oss", ["L0H1"], "L1.mlp", []),
    ("gpt_oss", ["L0.mlp"], ("L2.mlp", "L1H3.k"), []),
    ("gptj", ["L0H1"], "L1.mlp", []),
    ("gptj", ["L0.mlp"], "L1H2.q", []),
    ("granite", ["L0H1"], "L1H2.q", [WRITE_M]),     # each write is added times the multiplier
    ("granite", ["embed"], "L0H1.v", [EMBED_M]),    # the embeddings' sum times its own
    ("granite", ["L0.mlp"], "logits", [WRITE_M]),   # (the model divides the logits itself)
    ("granite", ["L0H0", "L0.mlp"], ("L1.mlp", "L2H3.k"), [WRITE_M]),
    ("granitemoe", ["L0.mlp"], ("L1.mlp", "L1H2.q"), [WRITE_M]),
    ("granitemoe", ["L1H2"], "L2.mlp", [WRITE_M]),
    ("bloom", ["L0H1"], "L1H2.k", []),
    ("bloom", ["embed"], "L0H1.v", ["transformer.word_embeddings_layernorm"]),
    ("bloom", ["L0.mlp"], ("L1.mlp", "L2H0.q"), []),
    ("bloom", ["L1.mlp"], "logits", []),
    ("mpt", ["L0H1"], "L1H2.v", []),
    ("mpt", ["L0.mlp"], "L2.mlp", []),
    ("dbrx", ["L0H1"], "L1H3.k", []),               # key head 1 of 2, read by query heads 2 and 3
    ("dbrx", ["L0.mlp"], ("L1.mlp", "L2H0.v"), []),
    ("dbrx", ["embed"], "logits", []),
    ("falcon", ["L0H1"], "L1H2.v", []),
    ("falcon", ["L0.mlp"], ("L1.mlp", "L2H3.q"), []),  # (its block adds the attention to it in place)
    ("falcon_new", ["L0H1"], "L1H3.q", []),           # [kv head: q q k v]: query head 3 in group 1
    ("falcon_new", ["L0H2"], ("L1H1.k", "L2H2.v"), []),
    ("falcon_new", ["L0.mlp"], "L1.mlp", []),
    ("glm4_moe", ["L0H1"], "L0.mlp", []),            # the dense MLP of a model of experts: its maps
    ("glm4_moe", ["L1.mlp"], "L2H0.q", []),          # experts, sending
    ("opt", ["L0H1"], "L1H2.q", []),
    ("opt", ["L0.mlp"], ("L1.mlp", "L2H0.k"), []),     # an MLP on flat tokens, sending and receiving
    ("opt", ["embed"], "L0.mlp", []),
    ("opt", ["L1.mlp"], "logits", []),
    ("opt_post", ["L0H1"], "L0.mlp", [f"{L['opt_post']}.0.self_attn_layer_norm"]),
    ("opt_post", ["L0.mlp"], "L1H2.v", [f"{L['opt_post']}.0.final_layer_norm"]),
    ("opt_post", ["embed"], "L0H3.q", []),
    ("opt_post", ["L1.attn"], "logits", [f"{L['opt_post']}.{i}.{n}" for i in (1, 2) for n in
                                         ("self_attn_layer_norm", "final_layer_norm")]),
    ("openai-gpt", ["L0H1"], "L1H2.k", [f"{L['openai-gpt']}.0.ln_1", f"{L['openai-gpt']}.0.ln_2"]),
    ("openai-gpt", ["embed"], "L0H3.v", []),
    ("openai-gpt", ["L1.mlp"], "logits", [f"{L['openai-gpt']}.{i}.{n}" for i, n in
                                          ((1, "ln_2"), (2, "ln_1"), (2, "ln_2"))]),
    ("codegen", ["L0H1"], "L1H3.q", []),              # shard 1's second head
    ("codegen", ["L0H6"], ("L1H5.k", "L2H2.v"), []),
    ("codegen", ["L0.mlp"], "L1H7", []),
    ("twin_deepnorm", ["L0.attn"], "L1.attn", ["blocks.0.ln_resid_attn", ALPHA, "blocks.0.ln_resid_mlp"]),
    ("twin_deepnorm", ["L0H2"], "L0.mlp", ["blocks.0.ln_resid_attn"]),
    ("twin_deepnorm", ["L1.mlp"], "L2H1.k", ["blocks.1.ln_resid_mlp"]),
    ("twin_deepnorm", ["L1H0"], "logits", ["blocks.1.ln_resid_attn", ALPHA, "blocks.1.ln_resid_mlp",
                                           ALPHA, "blocks.2.ln_resid_attn", ALPHA, "blocks.2.ln_resid_mlp"]),
]


def _twin_setup():
    """A DeepNorm twin (x ← LN(α·x + F(x)), α = (2N)^¼ for 3 blocks), LayerNorm gains and biases
    perturbed and writes made large, as ``_setup`` makes the HF families'."""
    model = rs.twin(norm="layernorm", placement="deepnorm", n_layers=3, d_model=64, n_heads=4, n_ctx=128)
    assert model.anatomy.alpha == pytest.approx(ALPHA)
    with torch.no_grad():
        for n, p in model.module.named_parameters():
            if "ln_" in n:
                p.add_(0.2 * torch.randn_like(p))
            elif n.endswith(("o_proj.weight", "fc_out.weight")):
                p.mul_(10)
    return model.module, model, rs.trace(model, TEXTS), rs.trace(model, CORRUPT)


def _record(module, paths, tokens, mask, inputs=True):
    """Each named module's input (or output), from one plain forward pass."""
    seen, handles = {}, []

    def keep(path):
        def pre(m, args, kwargs):
            seen[path] = (args[0] if args else kwargs["hidden_states"]).detach().clone()

        def post(m, args, out):
            seen[path] = (out[0] if isinstance(out, tuple) else out).detach().clone()
        return pre, post

    for path, is_input in paths:
        pre, post = keep(path)
        m = module.get_submodule(path)
        handles.append(m.register_forward_pre_hook(pre, with_kwargs=True) if is_input
                       else m.register_forward_hook(post))
    try:
        with torch.no_grad():
            module(input_ids=tokens, attention_mask=mask)
    finally:
        for h in handles:
            h.remove()
    return seen


def _write_paths(f, name):
    """What to record for sender ``name``'s write: (path, is_input), and how to make the write."""
    blocks = FAMILIES[f]["blocks"]
    if name == "embed":
        path = FAMILIES[f]["embed"]
        return [(path, False)], lambda seen, m: seen[path]
    layer, rest = int(name[1]), name[2:]
    if rest == ".mlp":  # the MLP's output, or the input of the write's norm (Gemma 4's experts)
        path = f"{blocks}.{layer}.{FAMILIES[f]['mlp']}"
        return [(path, FAMILIES[f].get("mlp_input", False))], lambda seen, m: seen[path]
    path = f"{blocks}.{layer}.{FAMILIES[f]['o']}"
    n, d = _heads(f)
    heads = range(n) if rest == ".attn" else [int(rest[1:])]

    def write(seen, module):
        W = module.get_submodule(path).weight.double()
        W = W if FAMILIES[f]["conv"] else W.T  # [H·d_head, d_model]
        cols = torch.cat([torch.arange(h * d, (h + 1) * d) for h in heads])
        return seen[path].double()[..., cols] @ W[cols]
    return [(path, True)], write


def _frozen(norm, x, delta):
    """``delta`` through norm module ``norm`` with its scale on ``x`` frozen, by hand (float64)."""
    x, w = x.double().reshape(delta.shape), norm.weight.double()
    if isinstance(norm, torch.nn.LayerNorm):
        s = (x.var(-1, unbiased=False, keepdim=True) + norm.eps).sqrt()
        return w * (delta - delta.mean(-1, keepdim=True)) / s
    eps = getattr(norm, "eps", getattr(norm, "variance_epsilon", None))
    s = (x.pow(2).mean(-1, keepdim=True) + eps).sqrt()
    name = type(norm).__name__  # Gemma's RMSNorm (1 to 3): (1 + γ); Gemma 4's: γ
    return (1 + w if "Gemma" in name and "Gemma4" not in name else w) * delta / s


def _heads(f):
    """(heads, d_head) of family ``f``'s tiny model (d_model 64)."""
    n = FAMILIES[f].get("heads", HEADS)
    return n, 64 // n


def _columns(f, head, channel, layer):
    c, layout = "qkv".index(channel), FAMILIES[f]["layout"]
    (n, d), kv = _heads(f), KV.get(f, _heads(f)[0])
    d, kv = FAMILIES[f].get("heads_at", {}).get(layer, (d, kv))  # (Gemma 4's wider full attention)
    group = head if c == 0 else head // (n // kv)
    if layout == "per_head":  # NeoX: [head, (q k v), d_head]
        start, module = (head * 3 + c) * d, 0
    elif layout == "groups":  # Falcon's new decoder: [kv head: (its query heads, k, v), d_head]
        rep = n // kv
        slot = head % rep if c == 0 else rep + c - 1
        start, module = ((head // rep) * (rep + 2) + slot) * d, 0
    elif layout == "blocks":  # GPT-2, Phi-3, GPTBigCode: [q | k | v], k and v KV heads wide
        start, module = (0 if c == 0 else (n + (c - 1) * kv) * d) + group * d, 0
    elif layout == "shards4":  # CodeGen: [shard of 4: (q v k) of its n/4 heads, d_head]
        per = n // 4
        start, module = ((head // per) * 3 + "qvk".index(channel)) * per * d + (head % per) * d, 0
    else:
        start, module = group * d, c
    return module, torch.arange(start, start + d)


def _receiving(module, f, receiver, delta):
    """Hooks giving ``receiver`` the stream as this pass has it where it reads, plus ``delta``.

    A pre-hook on the module whose input is that stream (the read norm, or the block or MLP
    for a raw read) keeps it; each projection's output (a head's columns, after a norm on the
    queries or keys that spans every head) is replaced by its ``forward`` of the HF norm's
    ``forward`` of stream + delta. The logits: ``delta`` added before the final norm.
    """
    fam, blocks = FAMILIES[f], FAMILIES[f]["blocks"]
    if receiver == "logits":
        if fam["final"]:
            return [module.get_submodule(fam["final"]).register_forward_pre_hook(
                lambda m, a: (a[0] + delta.to(a[0].dtype).reshape(a[0].shape),))]
        return [module.get_submodule(f"{blocks}.2").register_forward_hook(
            lambda m, a, out: (out[0] + delta.to(out[0].dtype).reshape(out[0].shape), *out[1:])
            if isinstance(out, (tuple, list))  # (GPT-1's blocks return a list)
            else out + delta.to(out.dtype).reshape(out.shape))]
    layer, rest = int(receiver[1]), receiver[2:]
    kind = "mlp" if rest == ".mlp" else "attn"
    read = fam["read"][kind]
    source = module.get_submodule(f"{blocks}.{layer}" + (f".{read}" if read else ""))
    raw = read is None or fam.get("raw_mlp") and kind == "mlp"
    seen = {}
    handles = [source.register_forward_pre_hook(
        lambda m, a, kw: seen.__setitem__("x", a[0] if a else kw["hidden_states"]), with_kwargs=True)]
    if rest.startswith("H"):
        head, channels = int(rest[1]), rest.split(".")[1:] or ["q", "k", "v"]
        qkv = fam.get("qkv_at", {}).get(layer, fam["qkv"])
        targets = [(qkv[i], cols, fam.get("qk_norm", (None, None, None))[i])
                   for i, cols in (_columns(f, head, c, layer) for c in channels)]
    else:
        qkv = dict.fromkeys(fam.get("qkv_at", {}).get(layer, fam["qkv"]))  # (each projection once)
        targets = [(p, None, None) for p in (qkv if kind == "attn" else fam["mlp_in"])]
    for path, cols, after in targets:
        proj = module.get_submodule(f"{blocks}.{layer}.{path}")
        post = after and module.get_submodule(f"{blocks}.{layer}.{after}")

        def replace(m, a, out, proj=proj, post=post, cols=cols):
            dtype = (out[0] if isinstance(out, tuple) else out).dtype  # gpt-oss's MLP: a tuple
            x = (seen["x"].double() + delta.reshape(seen["x"].shape)).to(dtype)
            new = proj.forward(x if raw else source.forward(x))
            new = post.forward(new) if post else new
            if cols is None:
                return new
            out = out.clone()
            out[..., cols] = new[..., cols]
            return out
        handles.append((post or proj).register_forward_hook(replace))
    return handles


def _by_hand(module, f, clean, other, senders, receivers, norms, metric):
    """The metric with ``receivers`` (one, or a tuple) alone reading the stream plus the senders'
    difference carried through ``norms``."""
    record, makers = [(n, True) for n in norms if isinstance(n, str) and not n.endswith("scalar")], []
    for s in senders:
        paths, make = _write_paths(f, s)
        record += paths
        makers.append(make)
    seen_clean = _record(module, record, clean.tokens, clean.attention_mask)
    seen_other = _record(module, record, other.tokens, other.attention_mask)
    shape = (*clean.tokens.shape, -1)  # (OPT's MLP writes [batch·pos, d])
    delta = sum((make(seen_other, module) - make(seen_clean, module)).reshape(shape) for make in makers)
    for n in norms:  # a number (DeepNorm's α), a buffer multiplying the stream (Gemma 4's), a norm
        delta = delta * n if isinstance(n, float) else delta * module.get_buffer(n).double() \
            if n.endswith("scalar") else _frozen(module.get_submodule(n), seen_clean[n], delta)
    receivers = receivers if isinstance(receivers, tuple) else (receivers,)
    handles = [h for r in receivers for h in _receiving(module, f, r, delta)]
    try:
        with torch.no_grad():
            logits = module(input_ids=clean.tokens, attention_mask=clean.attention_mask)
    finally:
        for h in handles:
            h.remove()
    return float(metric(getattr(logits, "logits", logits).double()))


@pytest.mark.parametrize("f", list(FAMILIES))
def test_path_patching_matches_hooks_of_our_own(f):
    """Every case of the family in one call (stacked 3 per pass), each against the reference."""
    module, model, clean, other = _twin_setup() if f.startswith("twin") else _setup(f)
    metric = _diff(clean)
    cases = [c for c in CASES if c[0] == f]
    senders = list(dict.fromkeys(tuple(c[1]) for c in cases))
    receivers = list(dict.fromkeys(c[2] for c in cases))
    got = rs.path_patch(clean, other, metric, senders=senders, receivers=receivers, batch_size=3)
    assert got.senders == tuple("+".join(s) for s in senders)
    assert got.receivers == tuple(r if isinstance(r, str) else "+".join(r) for r in receivers)
    moved = 0
    for _, s, r, norms in cases:
        want = _by_hand(module, f, clean, other, s, r, norms, metric)
        value = float(got.metric[senders.index(tuple(s)), receivers.index(r)])
        assert value == pytest.approx(want, abs=ATOL), (s, r)
        moved += abs(want - got.metric_clean) > 10 * ATOL
    assert moved >= len(cases) - 1  # the check has teeth: the paths carry something
    assert got.metric_clean == pytest.approx(float(metric(clean.logits)), abs=1e-6)
    assert got.metric_reference == pytest.approx(float(metric(other.logits)), abs=1e-6)


def test_an_mlp_of_experts_receives_in_a_model_set_to_return_router_logits():
    """With ``output_router_logits=True`` in its config, a stacked path-patching pass into
    Mixtral's ``L1.mlp`` failed inside transformers' load-balancing loss (the receiver's hook
    runs the router again on one copy's rows: 42 tokens against the pass's 84; helper 39).
    Passes ask for no router logits. Reference: the same model with the option off."""
    module, model, clean, other = _setup("mixtral")
    metric = _diff(clean)
    want = rs.path_patch(clean, other, metric, senders=["L0H1", "L0H2"], receivers="L1.mlp")
    module.config.output_router_logits = True
    got = rs.path_patch(clean, other, metric, senders=["L0H1", "L0H2"], receivers="L1.mlp")
    assert torch.equal(got.metric, want.metric)
    assert abs(float(got.metric[0, 0]) - got.metric_clean) > 10 * ATOL


def test_the_carried_norms_matter_in_a_post_norm_model():
    """Sending BERT's L1.attn to the logits without the four LayerNorms between misses the
    library's value by far more than the tolerance: the reference's carry is what it checks."""
    module, model, clean, other = _setup("bert_mlm")
    metric = _diff(clean)
    got = float(rs.path_patch(clean, other, metric, senders="L1.attn").metric[0, 0])
    bare = _by_hand(module, "bert_mlm", clean, other, ["L1.attn"], "logits", [], metric)
    assert abs(got - bare) > 20 * ATOL and abs(got - bare) > 0.1 * abs(got - metric(clean.logits))


def test_all_writes_to_the_logits_is_the_reference_run_and_a_group_is_its_parts_together():
    """In a pre-norm model the stream after the last block is exactly the sum of the embedding and
    every write, so sending all of them to the logits gives the corrupted run's last-token logits
    (= patching the stream there, ``patch_stream``); an attention is the group of its heads."""
    _, model, clean, other = _setup("llama")
    last = clean.attention_mask.sum(1) - 1

    def metric(logits):
        return (logits[[0, 1], last, 101] - logits[[0, 1], last, 32]).mean()

    everything = tuple(["embed"] + [c.name for c in model.anatomy.components])
    heads = tuple(f"L1H{h}" for h in range(HEADS))
    got = rs.path_patch(clean, other, metric, senders=[everything, "L1.attn", heads],
                        receivers=["logits", "L2.attn"])
    assert float(got.metric[0, 0]) == pytest.approx(got.metric_reference, abs=1e-4)
    stream = rs.patch_stream(clean, other, metric, points=[-1], positions=[-1])
    assert float(got.metric[0, 0]) == pytest.approx(float(stream.metric[0, 0]), abs=1e-4)
    assert torch.allclose(got.metric[1], got.metric[2], atol=ATOL)  # L1.attn = its four heads
    assert float(got.share()[0, 0]) == pytest.approx(1.0, abs=1e-3)
    assert got.run.all() and got.connected.all()


def test_a_receiver_before_its_sender_is_not_connected_and_not_run():
    """No path: an earlier reader, a block's own attention, a parallel block's MLP (which reads
    the block input, not its attention's write); and a sender whose writes are equal in both
    runs (positions before the corrupted token of a causal model) is not run either."""
    _, model, clean, other = _setup("gpt_neox_parallel")
    metric = _diff(clean)
    got = rs.path_patch(clean, other, metric, senders=["L1H0", "L1.attn"],
                        receivers=["L0.mlp", "L1.attn", "L1.mlp", "L2.attn"])
    assert got.connected.tolist() == [[False, False, False, True]] * 2
    assert not got.run[:, :3].any() and (got.metric[:, :3] == got.metric_clean).all()
    early = rs.path_patch(clean, other, metric, senders=["L0.mlp"], receivers=["L1.attn"], positions=[2, 3])
    assert early.connected.all() and not early.run.any() and float(early.metric) == early.metric_clean
    frame = got.to_frame()
    assert list(frame.columns[:2]) == ["sender", "receiver"] and len(frame) == 8
    row = frame[(frame.sender == "L1H0") & (frame.receiver == "L2.attn")].iloc[0]
    assert row.metric == pytest.approx(float(got.metric[0, 3])) and row.run and row.connected
    assert "PathPatching(senders=(2: 'L1H0', 'L1.attn')" in repr(got)


def test_positions_send_the_difference_at_those_tokens_only():
    """The sender's difference sent at the corrupted token alone equals the reference computed
    with the difference zeroed elsewhere; stacked runs equal runs one per pass."""
    module, model, clean, other = _setup("llama")
    metric = _diff(clean)
    one = rs.path_patch(clean, other, metric, senders=["L0H1", "L0.mlp"], receivers=["L1.attn", "L2H0"],
                        positions=[4], batch_size=1)
    many = rs.path_patch(clean, other, metric, senders=["L0H1", "L0.mlp"], receivers=["L1.attn", "L2H0"],
                         positions=[4], batch_size=4)
    assert torch.allclose(one.metric, many.metric, atol=ATOL)
    everywhere = rs.path_patch(clean, other, metric, senders=["L0H1"], receivers=["L1.attn"])
    assert abs(float(everywhere.metric[0, 0]) - float(one.metric[0, 0])) > 10 * ATOL  # token 5 on matters


def test_a_metric_per_text_gives_each_text_its_own_paths():
    _, model, clean, other = _setup("gpt2")
    last = clean.attention_mask.sum(1) - 1
    rows = torch.arange(2)

    def per_text(logits):
        return logits[rows, last, 101] - logits[rows, last, 32]

    kw = dict(senders=["L0H1", "L1.mlp"], receivers=["L2.attn", "logits"])
    got = rs.path_patch(clean, other, per_text, **kw)
    assert got.per_text.shape == (2, 2, 2) and torch.allclose(got.metric, got.per_text.mean(-1))
    for r in range(2):
        alone = rs.path_patch(rs.trace(model, TEXTS[r]), rs.trace(model, CORRUPT[r]),
                              lambda logits: logits[0, -1, 101] - logits[0, -1, 32], **kw)
        assert torch.allclose(got.per_text[..., r], alone.metric, atol=1e-4), r
    frame = got.to_frame(per_text=True)
    assert len(frame) == 8 and set(frame.text) == {0, 1} and frame.run.all()


def test_path_patch_refuses_bad_arguments_saying_what_to_pass():
    module, model, clean, other = _setup("llama")
    metric = _diff(clean)
    before = hooks_of(module)
    with pytest.raises(UnknownNameError, match="no sender 'L3H0': senders are heads"):
        rs.path_patch(clean, other, metric, senders=["L3H0"])
    with pytest.raises(UnknownNameError, match="no sender 'pos_embed'"):
        rs.path_patch(clean, other, metric, senders="pos_embed")  # Llama has none
    with pytest.raises(UnknownNameError, match="no receiver 'L0H4.q'"):
        rs.path_patch(clean, other, metric, senders="L0H0", receivers="L0H4.q")
    with pytest.raises(UnknownNameError, match="no receiver 'logit'"):
        rs.path_patch(clean, other, metric, senders="L0H0", receivers=["logit"])
    with pytest.raises(InputError, match="senders is a name or a list"):
        rs.path_patch(clean, other, metric, senders=[])
    with pytest.raises(InputError, match="a tuple of names patched together"):
        rs.path_patch.__wrapped__(clean, other, metric, senders=[("L0H0", 3)])
    with pytest.raises(InputError, match="senders patched together share a write: 'L0.attn' and 'L0H1'"):
        rs.path_patch(clean, other, metric, senders=[("L0.attn", "L0H1")])  # head 1 counted twice
    with pytest.raises(InputError, match="share a write: 'L0H1' and 'L0H1'"):
        rs.path_patch(clean, other, metric, senders=[("L0H1", "L0H1")])
    with pytest.raises(InputError, match="reference=rs.trace"):
        rs.path_patch(clean, None, metric)
    with pytest.raises(InputError, match="batch_size is the number of patched runs"):
        rs.path_patch(clean, other, metric, batch_size=0)
    with pytest.raises(InputError, match="position 30 is outside"):
        rs.path_patch(clean, other, metric, senders="L0H0", positions=[30])
    headless = rs.load(build("bert"), tokenizer=ByteTokenizer())
    with pytest.raises(NotAvailableError, match="metric reads logits"):
        rs.path_patch(rs.trace(headless, TEXTS), rs.trace(headless, CORRUPT), metric)
    fails = metric_failing_after_clean()

    with pytest.raises(RuntimeError, match="metric failed"):
        rs.path_patch(clean, other, fails, senders="L0H0", receivers="L1.attn")
    assert hooks_of(module) == before


def test_path_patching_figure_shows_the_largest_senders_and_blanks_pairs_without_a_path():
    from residual_stream.plotting import path_patching_figure

    _, model, clean, other = _setup("llama")
    got = rs.path_patch(clean, other, _diff(clean), receivers=["L1.attn", "logits"])
    assert len(got.senders) == 3 * HEADS  # every head by default
    fig = path_patching_figure(got, top=5)
    z = torch.tensor(fig.data[0].z, dtype=torch.float64)
    rows = [got.senders.index(s) for s in fig.data[0].y]
    assert len(rows) == 5 and rows == sorted(rows) and list(fig.data[0].x) == ["L1.attn", "logits"]
    share = got.share()[rows]
    assert torch.allclose(z.nan_to_num(), share.where(got.connected[rows], 0.0))
    assert z[:, 0].isnan().equal(~got.connected[rows, 0])  # a block-1 or -2 head reaches no L1 read
    largest = got.share().where(got.connected, 0.0).abs().amax(1)
    assert largest[rows].min() >= largest.sort(descending=True).values[4]
    every = path_patching_figure(got, "change", top=None)
    assert len(every.data[0].y) == 12 and "largest" not in every.layout.title.text
    for bad in (0, -1, 2.5, "3"):
        with pytest.raises(InputError, match="top is how many senders to show"):
            path_patching_figure.__wrapped__(got, top=bad)
    with pytest.raises(InputError, match="measure must be one of"):
        path_patching_figure(got, "kl")


def test_an_mlp_with_experts_beside_it_receives_nothing_and_sends():
    """Gemma 4's MLP sublayer with experts is a dense MLP, a router and experts reading the raw
    stream through norms of their own: no one module computes it, so it cannot be rerun on a
    patched read and is refused as a receiver, by name; as a sender (the cases above) its
    write, the input of its write's norm, is sent."""
    module, model, clean, other = _setup("gemma4_moe")
    with pytest.raises(NotAvailableError, match="'L1.mlp'.*dense MLP and experts.*rs.patch_stream"):
        rs.path_patch(clean, other, _diff(clean), senders="L0.mlp", receivers="L1.mlp")


def test_a_value_head_that_is_its_key_head_is_refused_alone():
    """Gemma 4's full attentions (attention_k_eq_v) take the key projection's output as values:
    one projection's columns are a key head and its value head, so neither can receive alone
    (patching those columns changes both); the head as a whole (its ``L2H1`` case above) and
    its query can, and a sliding block's value head still can."""
    module, model, clean, other = _setup("gemma4_text")
    metric = _diff(clean)
    for channel in ("k", "v"):
        with pytest.raises(NotAvailableError, match="attention_k_eq_v.*patch 'L2H1'"):
            rs.path_patch(clean, other, metric, senders="L0.mlp", receivers=f"L2H1.{channel}")
    got = rs.path_patch(clean, other, metric, senders="L0.mlp", receivers=["L1H1.v", "L2H1.q"])
    assert got.run.all()
