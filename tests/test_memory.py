"""The memory a trace keeps, counted before the forward pass, and the refusal when it will not fit."""

import pytest
import torch
from conftest import TEXTS, hooks_of
from tiny_hf import build

import residual_stream as rs
from residual_stream import memory
from residual_stream.errors import InputError, TraceTooLargeError
from residual_stream.inputs import ByteTokenizer, encode


def _kept(cap) -> int:
    """Bytes of every tensor a finished trace holds, walked from the ``Captured`` itself (a norm
    module's input kept once for all the names it serves)."""
    tensors = [t for f in ("resid", "embeds", "z", "mlp_out", "norm_scale", "attn_out")
               for t in getattr(cap, f).values()]
    tensors += list({id(t): t for t in cap.norm_in.values()}.values())
    tensors += [cap.logits] if cap.logits is not None else []
    tensors += list(cap.patterns or ())
    return sum(t.numel() * t.element_size() for t in tensors)


@pytest.mark.parametrize("name", ["llama", "gpt2", "bert", "gemma2", "gpt_neox_parallel"])
@pytest.mark.parametrize("extra", [False, True])
def test_the_count_is_what_a_trace_keeps(name, extra):
    model = rs.load(build(name), tokenizer=ByteTokenizer())
    t = rs.trace(model, TEXTS, verify=extra, patterns=extra)
    counted = memory.trace_bytes(model.anatomy, tuple(t.tokens.shape), verify=extra, patterns=extra)
    assert counted == _kept(t.captured)


@pytest.mark.parametrize("placement", ["post", "sandwich", "deepnorm"])
def test_the_count_is_what_a_twins_trace_keeps(placement):
    for d_mlp in (None, 0):  # with an MLP, and attention only
        options = {} if d_mlp is None else {"d_mlp": d_mlp}
        model = rs.twin(norm="layernorm", placement=placement, n_layers=2, d_model=32, **options)
        t = rs.trace(model, TEXTS, verify=True)
        assert memory.trace_bytes(model.anatomy, tuple(t.tokens.shape), verify=True) == _kept(t.captured)


@pytest.mark.parametrize("verify", [False, True])
def test_the_count_without_heads_is_what_an_ablation_capture_keeps(verify):
    """``heads=False`` (``ablation_check``'s captures) keeps each attention's output, d_model,
    not its ``z``: counted for a Qwen3 whose n_heads × d_head (32) is not d_model (64)."""
    import transformers as tf
    from tiny_hf import COMMON

    from residual_stream.capture import capture

    torch.manual_seed(0)
    module = tf.Qwen3ForCausalLM(tf.Qwen3Config(**COMMON, intermediate_size=96, num_key_value_heads=2,
                                                head_dim=8)).eval()
    model = rs.load(module, tokenizer=ByteTokenizer())
    enc = encode(model, TEXTS)
    shape = tuple(enc.tokens.shape)
    cap = capture(module, model.anatomy, enc.tokens, enc.attention_mask, heads=False, verify=verify)
    assert memory.trace_bytes(model.anatomy, shape, heads=False, verify=verify) == _kept(cap)
    with_heads = memory.trace_bytes(model.anatomy, shape, verify=verify)
    assert with_heads - memory.trace_bytes(model.anatomy, shape, heads=False, verify=verify) == (
        3 * shape[0] * shape[1] * (32 - (0 if verify else 64)) * 4)


def test_a_trace_that_would_not_fit_is_refused_before_anything_runs(monkeypatch):
    """One byte short of the count: refused, saying how much and what to do, with no forward
    pass (a spy on the model) and no hook left; exactly the count: traced. The count is what
    the trace keeps and what the pass adds (logits in the model's dtype, a block's largest
    activations; no attention scores under SDPA)."""
    module = build("llama")
    model = rs.load(module, tokenizer=ByteTokenizer())
    shape = tuple(encode(model, TEXTS).tokens.shape)
    keep = memory.trace_bytes(model.anatomy, shape)
    a, tokens = model.anatomy, shape[0] * shape[1]
    need = keep + 4 * tokens * (a.d_vocab + 3 * a.d_mlp + 4 * a.d_model)  # float32, by hand
    calls = []
    module.register_forward_pre_hook(lambda m, a: calls.append(1))
    before = hooks_of(module)
    monkeypatch.setattr(memory, "available_bytes", lambda device: need - 1)
    with pytest.raises(TraceTooLargeError) as err:
        rs.trace(model, TEXTS)
    kb = f"{need / 1024:.1f} KB"
    assert f"tracing 2 × {shape[1]} tokens would need about {kb}: it keeps {keep / 1024:.1f} KB (" in str(
        err.value)
    assert f"the forward pass adds {(need - keep) / 1024:.1f} KB at its peak" in str(err.value)
    assert f"cpu has {(need - 1) / 1024:.1f} KB available: trace fewer or shorter texts" in str(err.value)
    assert "rs.scan" in str(err.value)
    assert isinstance(err.value, InputError) and isinstance(err.value, MemoryError)
    assert not calls
    assert hooks_of(module) == before
    monkeypatch.setattr(memory, "available_bytes", lambda device: need)
    assert rs.trace(model, TEXTS).tokens.shape == shape and calls == [1]
    scores = 2 * shape[0] * a.n_heads * shape[1] ** 2 * 4  # eager attention's, for the patterns
    patterns = memory.trace_bytes(a, shape, patterns=True) + need - keep + scores
    monkeypatch.setattr(memory, "available_bytes", lambda device: patterns - 1)
    with pytest.raises(TraceTooLargeError):
        rs.trace(model, TEXTS, patterns=True)
    monkeypatch.setattr(memory, "available_bytes", lambda device: patterns)
    assert rs.trace(model, TEXTS, patterns=True).patterns is not None


def test_available_memory_is_the_systems():
    """On Linux, the kernel's own MemAvailable (within what changes between the two reads)."""
    with open("/proc/meminfo") as f:
        kernel = next(int(line.split()[1]) * 1024 for line in f if line.startswith("MemAvailable:"))
    assert memory.available_bytes(torch.device("cpu")) == pytest.approx(kernel, rel=0.05)
    assert memory.available_bytes(torch.device("meta")) is None


@pytest.mark.parametrize("name, widest", [
    ("mixtral", lambda mlp: mlp.experts.down_proj.shape[-1]),          # [expert, d_model, hidden]
    ("olmoe", lambda mlp: mlp.experts.down_proj.shape[-1]),
    ("qwen3_moe", lambda mlp: mlp.experts.down_proj.shape[-1]),
    ("gpt_oss", lambda mlp: mlp.experts.down_proj.shape[1]),           # [expert, hidden, d_model]
    ("qwen2_moe", lambda mlp: max(mlp.experts.down_proj.shape[-1],     # its shared expert, wider
                                  mlp.shared_expert.down_proj.in_features)),
    ("granitemoe", lambda mlp: mlp.experts.down_proj.shape[-1]),
    ("phimoe", lambda mlp: mlp.experts.down_proj.shape[-1]),
    ("hunyuan_v1_moe", lambda mlp: max(mlp.experts.down_proj.shape[-1],  # and its shared MLP's
                                       mlp.shared_mlp.down_proj.in_features)),
    ("kolibri1", lambda mlp: max(mlp.experts.down_proj.shape[-1], mlp.shared_experts.down_proj.in_features)),
    ("flex_olmo", lambda mlp: mlp.experts.down_proj.shape[-1]),
])
def test_the_mlp_width_of_experts_is_the_widest_hidden_layer(name, widest):
    """An MLP of experts has no single map to read ``d_mlp`` from (it feeds ``pass_bytes``): it
    is the widest hidden layer a token's MLP computes, read here from the module's weights."""
    module = build(name)
    model = rs.load(module, tokenizer=ByteTokenizer())
    block = module.model.layers[0]
    mlp = getattr(block, "mlp", None) or block.block_sparse_moe
    assert model.anatomy.d_mlp == widest(mlp) > 0
    # the experts a token uses (the config's) and the experts there are (the weights')
    assert model.anatomy.routing == (module.config.num_experts_per_tok, mlp.experts.down_proj.shape[0])


@pytest.mark.parametrize("dense", [dict(mlp_only_layers=[1]), dict(decoder_sparse_step=2)])
def test_a_dense_mlp_among_experts_counts_where_it_is_the_widest(dense):
    """Qwen3-MoE with dense MLPs (``mlp_only_layers``, or every other block by
    ``decoder_sparse_step``) 160 wide among experts 48 wide: ``d_mlp`` is the widest hidden
    layer over every block's MLP, read from the modules' weights (it was the experts' 48)."""
    import transformers as tf
    from tiny_hf import COMMON

    cfg = tf.Qwen3MoeConfig(**COMMON, intermediate_size=160, moe_intermediate_size=48, num_experts=4,
                            num_experts_per_tok=2, num_key_value_heads=2, head_dim=16, **dense)
    module = tf.Qwen3MoeForCausalLM(cfg).eval()
    widths = [b.mlp.down_proj.in_features if hasattr(b.mlp, "down_proj")  # dense, or experts [e, d, hidden]
              else b.mlp.experts.down_proj.shape[-1] for b in module.model.layers]
    assert sorted(set(widths)) == [48, 160]
    assert rs.load(module, tokenizer=ByteTokenizer()).anatomy.d_mlp == max(widths)


def test_experts_given_per_layer_count_their_most():
    """Hunyuan MoE may give the experts a token uses per layer (a list): the memory estimate
    takes the largest (each block's gate reads its own, checked here)."""
    import transformers as tf
    from tiny_hf import COMMON

    cfg = tf.HunYuanMoEV1Config(**COMMON, intermediate_size=96, num_key_value_heads=2, head_dim=16,
                                num_experts=4, moe_topk=[1, 3, 2], pad_token_id=None,
                                bos_token_id=1, eos_token_id=2)
    module = tf.HunYuanMoEV1ForCausalLM(cfg).eval()
    gates = [b.mlp.gate for b in module.model.layers]
    assert [g.top_k for g in gates] == [1, 3, 2]
    assert rs.load(module, tokenizer=ByteTokenizer()).anatomy.routing == (3, 4)


def _widest_hidden_layer(module) -> int:
    """The widest hidden layer of any block's MLP, read from the weights: a dense or shared
    MLP's ``down_proj`` [d_model, hidden], the experts' stacked ``down_proj`` [expert, d_model,
    hidden]."""
    widths = [p.shape[-1] for n, p in module.named_parameters()
              if n.endswith(("down_proj.weight", "experts.down_proj")) and ".layers." in n]
    return max(widths)


@pytest.mark.parametrize("name, shared", [
    ("glm4_moe", "n_shared_experts"), ("sarvam_moe", "n_shared_experts"), ("dots1", "n_shared_experts"),
    ("solar_open", "n_shared_experts"), ("hy_v3", "num_shared_experts"),
    ("exaone_moe", "num_shared_experts"), ("ernie4_5_moe", "moe_num_shared_experts"),
    ("cohere2_moe", "num_shared_experts"), ("deepseek_v3", "n_shared_experts"),
    ("deepseek_v2", "n_shared_experts"), ("sarvam_mla", "n_shared_experts"),
    ("glm4_moe_lite", "n_shared_experts"), ("axk1", "n_shared_experts"), ("deepseek_v32", "n_shared_experts"),
    ("glm_moe_dsa", "n_shared_experts"), ("aria_text", "moe_num_shared_experts"),
])
def test_shared_experts_count_as_wide_as_they_are(name, shared):
    """DeepSeek-style shared experts are one MLP, an expert's width times how many there are:
    with 3 of them it is the widest hidden layer (``d_mlp`` took one expert's width before)."""
    built = build(name)
    setattr(built.config, shared, 3)
    module = type(built)(built.config).eval()
    anatomy = rs.load(module, tokenizer=ByteTokenizer()).anatomy
    widths = {m.down_proj.in_features for n, m in module.named_modules() if n.endswith("shared_experts")}
    assert anatomy.d_mlp == _widest_hidden_layer(module) == max(widths)


def _width_rows() -> list[str]:
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING

    from residual_stream.families import ARCHITECTURES

    return [t for t, spec in ARCHITECTURES.items() if spec.d_mlp_keys and t in CONFIG_MAPPING]


@pytest.mark.parametrize("model_type", _width_rows())
def test_every_width_key_names_a_field_of_its_config(model_type):
    """``config_width`` counts a factor the config leaves unset (``None``) as 0: a model without
    shared experts has none. A misspelt key would count 0 as well and lower ``d_mlp`` silently, so
    every factor of every row's width keys (dotted paths into nested configs included) must be a
    field the model type's config class defines, checked on its default config; an integer part an
    index within the list or tuple it reads (ERNIE 4.5 VL's ``moe_intermediate_size.0``)."""
    import transformers as tf

    from residual_stream.architectures import _read
    from residual_stream.families import ARCHITECTURES

    cfg = tf.AutoConfig.for_model(model_type)
    keys = _read(ARCHITECTURES[model_type].d_mlp_keys, cfg)
    assert keys
    for factor in (f for key in keys for f in key.split("*")):
        value = cfg
        for part in factor.split("."):
            if part.isdigit():
                assert isinstance(value, (list, tuple)) and int(part) < len(value), (
                    f"{model_type}: {factor!r} indexes past a list of its config")
                value = value[int(part)]
                continue
            assert hasattr(value, part), f"{model_type}: {factor!r} is not a field of its config"
            value = getattr(value, part)


def test_a_width_key_indexes_a_list_by_an_integer_part():
    """ERNIE 4.5 VL gives its experts' widths as one list, [text, vision]: ``moe_intermediate_size.0``
    reads the text experts' (in a product too); an index past the list's end counts as unset (0)."""
    from types import SimpleNamespace

    from residual_stream.family_rules import config_value, config_width

    cfg = SimpleNamespace(moe_intermediate_size=[48, 32], moe_num_shared_experts=2,
                          ffn=SimpleNamespace(widths=(7, 9)))
    assert config_value(cfg, "moe_intermediate_size.0") == 48
    assert config_value(cfg, "moe_intermediate_size.1") == 32
    assert config_value(cfg, "ffn.widths.1") == 9
    assert config_value(cfg, "moe_intermediate_size.2", "unset") == "unset"
    assert config_value(cfg, "moe_num_shared_experts.0") is None  # an index into no list
    assert config_width(cfg, "moe_intermediate_size.0*moe_num_shared_experts") == 96
    assert config_width(cfg, "moe_intermediate_size.2") == 0
    built = build("ernie4_5_vl_moe")  # every block of experts, none shared: the text experts' 48 wide
    text = built.config.text_config
    text.mlp_layer_types, text.moe_num_shared_experts = ["sparse"] * 3, 0
    module = type(built)(built.config).eval()
    blocks = [b.mlp for b in module.model.language_model.layers]
    widths = {(m.text_moe.experts.down_proj.shape[-1], m.vision_moe.experts.down_proj.shape[-1])
              for m in blocks}
    assert widths == {(48, 32)} and all(b.shared_experts is None for b in blocks)
    assert rs.load(module, tokenizer=ByteTokenizer()).anatomy.d_mlp == 48


def test_experts_described_in_a_nested_config_are_read_from_it():
    """DBRX keeps its experts' width and routing in ``ffn_config``: ``d_mlp`` is one expert's
    hidden width, read here from the weights (its experts' ``w1`` stacks [expert·hidden, d_model],
    the router has one output per expert), and the routing is (top-k, experts)."""
    module = build("dbrx")
    ffn = module.transformer.blocks[0].ffn
    experts = ffn.router.layer.out_features
    anatomy = rs.load(module, tokenizer=ByteTokenizer()).anatomy
    assert anatomy.d_mlp == ffn.experts.mlp.w1.shape[0] // experts > 0
    assert anatomy.routing == (ffn.top_k, experts) and anatomy.n_kv_heads == 2


def test_a_pass_of_experts_counts_each_expert_a_token_uses_and_the_routing_mask():
    """By hand from the tiny Mixtral's config: 2 experts a token, each 3 hidden activations of
    ``intermediate_size``, 4 states of ``d_model``, the logits, and the int64 one-hot mask of
    2 × 4 experts per token (float32, no attention term)."""
    cfg = build("mixtral").config
    model = rs.load(build("mixtral"), tokenizer=ByteTokenizer())
    b, p, k, e = 3, 10, cfg.num_experts_per_tok, cfg.num_local_experts
    per_token = cfg.vocab_size + 3 * cfg.intermediate_size * k + 4 * cfg.hidden_size
    by_hand = 4 * b * p * per_token + 8 * b * p * k * e
    assert memory.pass_bytes(model.anatomy, (b, p), 4, eager=False) == by_hand
    assert rs.load(build("llama"), tokenizer=ByteTokenizer()).anatomy.routing is None
