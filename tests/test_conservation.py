"""Conservation on tiny models built in code: every family and every placement.

For each model: the captured stream equals the framework's ``hidden_states``, every hook
holds what the stream program says, and ``decompose(L)`` sums to the stream at every point,
each within ``REL_F32`` × the stream's RMS. The decomposition is then checked contribution by
contribution against the independent frozen-forward ablation in float64 (``reference.py``).
"""

import copy

import pytest
import torch
import transformers as tf
from conftest import REL_F32, TEXTS, max_rel_error
from reference import ablation_contributions
from tiny_hf import BUILDERS, T5GEMMA, build

import residual_stream as rs
from residual_stream.architectures import has_lm_head
from residual_stream.errors import NotAvailableError
from residual_stream.families import CONTAINERS
from residual_stream.inputs import ByteTokenizer
from residual_stream.program import PLACEMENTS
from residual_stream.seq2seq_families import DECODER_TYPES
from residual_stream.twins import twin

TWINS = [(n, p) for n in ("layernorm", "rmsnorm", "none") for p in PLACEMENTS]


def perturbed_twin(norm: str, placement: str) -> rs.Model:
    # Vary every option across the grid so each is exercised somewhere.
    model = twin(norm=norm, placement=placement, n_layers=3, d_model=32, n_heads=4, seed=1,
                 bias=norm == "layernorm", init="xavier", mlp="swiglu" if norm == "rmsnorm" else "gelu",
                 positions="rotary" if placement in ("pre", "sandwich") else "learned")
    with torch.no_grad():  # γ = 1, β = 0 at init would hide norm arithmetic errors
        for name, p in model.module.named_parameters():
            if ".ln_" in name or name.startswith("ln_"):
                p.add_(0.3 * torch.randn_like(p))
    return model


def hf_model(name: str) -> rs.Model:
    return rs.load(build(name), tokenizer=ByteTokenizer())


def models():
    yield from ((f"hf-{n}", lambda n=n: hf_model(n)) for n in BUILDERS)
    yield from ((f"twin-{p}-{n}", lambda n=n, p=p: perturbed_twin(n, p)) for n, p in TWINS)


CASES = dict(models())


@pytest.mark.parametrize("case", list(CASES))
def test_conservation_report(case):
    model = CASES[case]()
    trace = rs.trace(model, TEXTS)
    report = trace.check()
    assert report.ok, report.to_frame().sort_values("relative_error").tail(5).to_string()
    assert report.tolerance == REL_F32
    frame = report.to_frame()
    n = model.anatomy.n_layers
    # every point was compared against the framework and against the decomposition
    assert (frame.check == "hidden_states").sum() == n + 1 + model.anatomy.states_before_final_norm
    assert (frame.check == "decomposition").sum() == n + 1
    # every norm module against its description (a constant multiplier has no module)
    assert (frame.check == "norm").sum() == sum(not s.constant for s in model.anatomy.norms.values())


@pytest.mark.parametrize("case", list(CASES))
def test_decomposition_matches_frozen_forward_ablation(case):
    model = CASES[case]()
    trace = rs.trace(model, TEXTS, verify=True)
    n = model.anatomy.n_layers
    last = trace.decompose("final")  # the framework's last hidden state is this point
    ref = ablation_contributions(trace, list(last.labels))
    points = [(L, trace.decompose(L), L) for L in range(n)] + [("final", last, n)]
    out = model.anatomy.modules.unembed_in  # OPT-350m returns the final stream through project_out
    W_out = None if out is None else model.module.get_submodule(out).weight.detach().T
    for name, parts, index in points:
        seen = (lambda x: x) if name != "final" or W_out is None else (lambda x: x @ W_out)
        stream = seen(parts.total())
        for label in parts.labels:  # error relative to the stream, not to the contribution
            err = max_rel_error(seen(parts.get(label)), ref[label][index], trace.attention_mask, stream)
            assert err <= REL_F32, f"{label} at point {name}: {err:.2e}"


@pytest.mark.parametrize("name", [n for n in BUILDERS if n != "bert"])
def test_the_unembedding_of_the_final_stream_gives_the_frameworks_logits(name):
    """``model.unembed()`` (``W_U``, ``b_U``, a masked-LM head's transform: BERT's module,
    RoBERTa's and DistilBERT's dense, activation and LayerNorm) applied to ``stream("final")``
    gives the logits the framework's own forward pass returned, on real tokens. A model without an
    LM head (an encoder-decoder's encoder) has no logits, and its unembedding is refused, saying why."""
    model = hf_model(name)
    trace = rs.trace(model, TEXTS)
    if not has_lm_head(model.module):
        assert not model.anatomy.has_lm_head
        for unavailable in (lambda: trace.logits, model.unembed):
            with pytest.raises(NotAvailableError, match="no LM head"):
                unavailable()
        return
    logits = model.unembed().logits(trace.stream("final"))
    assert max_rel_error(logits, trace.logits, trace.attention_mask) <= REL_F32


def test_a_stream_returned_through_a_projection_is_compared_through_it():
    """OPT-350m returns its last hidden state through ``project_out`` (48 wide here, the stream
    64): the check's last hidden-states row maps the final stream through it, and says so."""
    model = hf_model("opt_post")
    frame = rs.trace(model, TEXTS).check().to_frame()
    last = frame[frame.check == "hidden_states"].iloc[-1]
    assert last.point == f"resid_pre {model.anatomy.n_layers} @ project_out" and last.ok
    assert last.reference_rms > 0 and last.relative_error <= REL_F32


def test_one_norm_module_run_twice_gives_each_role_its_own_call():
    """nanochat runs one parameterless RMSNorm module on the embeddings and again on the final
    stream: each role keeps its own call's scale (the second call used to overwrite the
    first), against the module's inputs recorded by a hook of our own, in float64. GPT-J's
    ``ln_1``, read by attention and MLP from one call, is one call serving both roles."""
    from residual_stream.capture import norm_calls

    model = hf_model("nanochat")
    norm = model.module.model.norm
    inputs = []
    handle = norm.register_forward_pre_hook(lambda m, a: inputs.append(a[0].detach().double()))
    try:
        trace = rs.trace(model, TEXTS)
    finally:
        handle.remove()
    assert len(inputs) == 2
    assert norm_calls(model.anatomy, ["ln_embed", "ln_final"]) == [["ln_embed"], ["ln_final"]]
    real = trace.attention_mask.bool()
    for name, x in zip(("ln_embed", "ln_final"), inputs, strict=True):
        want = (x.pow(2).mean(-1) + norm.eps).sqrt()
        assert torch.allclose(trace.norm_scale(name).double()[real], want[real], rtol=1e-6), name
    gptj = hf_model("gptj").anatomy
    assert norm_calls(gptj, ["L1.ln_attn_in", "L1.ln_mlp_in"]) == [["L1.ln_attn_in", "L1.ln_mlp_in"]]


@pytest.mark.parametrize("gemma", ["gemma3_text", "gemma4_text"])
def test_a_bidirectional_gemma_is_described_as_one(gemma):
    """EmbeddingGemma is Gemma 3 with ``use_bidirectional_attention``: it was described as causal
    (ablations and head scores then read next-token predictions it does not make). Its eager
    patterns put weight on later keys, which the anatomy now says it may. Gemma 4's option says
    ``"all"`` (bidirectional) or ``"vision"`` (only among image tokens: causal on text)."""
    model = hf_model(f"{gemma}_bidirectional")
    assert not model.anatomy.causal and hf_model(gemma).anatomy.causal
    patterns = rs.trace(model, TEXTS, patterns=True).patterns
    assert all(A.triu(1).sum() > 0.1 for A in patterns)


def test_gemma_4s_blocks_have_heads_of_their_own_widths():
    """Gemma 4's full attentions have wider heads and fewer key/value heads than its sliding
    ones: each block's, from its config's own per-layer view, is the anatomy's ``heads_at`` and the
    shape of its weights' maps (values from the keys' projection in a full block), and the
    anatomy's one-line summary names both."""
    model = hf_model("gemma4_text")
    config, a = model.module.config, model.anatomy
    for L in range(a.n_layers):
        view = config.per_layer_config[L]
        assert a.heads_at(L) == (view.head_dim, view.num_key_value_heads)
        w = model.weights(L)
        assert w.W_Q.shape == w.W_K.shape == (a.n_heads, a.d_model, view.head_dim)
        assert w.W_O.shape == (a.n_heads, view.head_dim, a.d_model) and w.v_norm_eps == config.rms_norm_eps
        if config.layer_types[L] == "full_attention":
            assert model.module.model.layers[L].self_attn.v_proj is None and torch.equal(w.W_V, w.W_K)
    assert a.d_head == 32 and "4 heads (1/2 kv) of 16/32" in repr(a)


def test_every_supported_family_has_a_tiny_model_here():
    """A row of the architecture table is verified only through a model of its family built
    here (and the twins, for ``rs-twin``): none is listed without one."""
    configs = [BUILDERS[n]().config for n in BUILDERS]  # (a multimodal container: its text model's too)
    built = {c.model_type for c in configs} | {c.get_text_config().model_type for c in configs}
    built -= set(DECODER_TYPES)  # (T5Gemma 2's text config is its decoder's, refused by name)
    assert built | {"rs-twin"} == set(rs.supported_architectures())


@pytest.mark.parametrize("name", ["gemma3", "mistral3", "mistral3_ministral3", "qwen2_vl", "qwen2_5_vl",
                                  "qwen3_vl", "llava", "llava_next", "llava_onevision", "llava_next_video",
                                  "vipllava", "internvl", "smolvlm", "idefics3", "ovis2", "lighton_ocr",
                                  "exaone4_5", "kimi_k25", "apertus1p5", "qwen3_vl_moe", "glm4v", "glm46v",
                                  "glm4v_moe", "aria", "gemma4", "aya_vision", "cohere2_vision",
                                  "llava_next_granite", "ernie4_5_vl_moe", "hunyuan_vl", "molmo2",
                                  "molmo2_olmo", "granite4_vision", "granite_docling",
                                  "idefics2", "paddleocr_vl", "glm_ocr", "video_llava", "qianfan_ocr",
                                  "video_llama_3", "deepseek_vl", "hyperclovax_vision_v2", "janus",
                                  "cosmos3_edge", "gemma4_unified"])
def test_a_multimodal_container_gives_its_text_models_stream(name):
    """A multimodal container (Gemma 3 4B, Mistral Small 3.1) on text alone is its text model:
    described by the text model's row at the text model's paths, it gives the stream, every
    contribution and the logits of that model wrapped on its own (the same weights), through the
    container's head: Aya Vision's, Command A Vision's and Granite Vision's scale no logits, though the
    heads of their text models' own families (Cohere 2's, Granite's) do."""
    container = hf_model(name)
    path = CONTAINERS[container.module.config.model_type]  # language_model, or text_model (SmolVLM)
    text = container.module.model.get_submodule(path)
    alone = rs.load(text, tokenizer=ByteTokenizer())
    assert container.anatomy.architecture == alone.anatomy.architecture == text.config.model_type
    layers = alone.anatomy.modules.layers
    assert container.anatomy.modules.layers == tuple(f"model.{path}.{p}" for p in layers)
    assert container.anatomy.has_lm_head and not alone.anatomy.has_lm_head
    both, one = rs.trace(container, TEXTS), rs.trace(alone, TEXTS)
    for L in range(container.anatomy.n_layers + 1):
        a, b = both.decompose(L), one.decompose(L)
        assert a.labels == b.labels
        for label in a.labels:
            torch.testing.assert_close(a.get(label), b.get(label), rtol=0, atol=0)
    with torch.no_grad():
        logits = container.module.lm_head(one.stream("final"))
    text_config = container.module.config.get_text_config()  # what the container's head does after it:
    model_type = container.module.config.model_type
    if model_type in ("granite4_vision", "granite_docling"):  # Granite 4 Vision divides by its scaling
        logits = logits / text_config.logits_scaling
    if model_type == "hyperclovax_vision_v2":  # HyperCLOVA X Vision V2 multiplies by it
        logits = logits * text_config.logits_scaling
    cap = getattr(text_config, "final_logit_softcapping", None)  # Gemma 4 soft-caps
    logits = logits if cap is None else cap * torch.tanh(logits / cap)
    unembedded = container.unembed().logits(both.stream("final"))
    assert max_rel_error(unembedded, logits, one.attention_mask) <= REL_F32


def test_a_containers_head_scales_its_logits_only_where_it_does():
    """Cohere 2's own head multiplies its logits by ``logit_scale``; Aya Vision's, a plain Linear
    over the same text model, does not, and its anatomy says so (the scale and the family line);
    Granite 4 Vision's head divides them as Granite's does (``SCALING_HEADS``). Reference: each
    container's own logits against its unembedding (the battery), and here the configs."""
    alone, aya, granite = hf_model("cohere2"), hf_model("aya_vision"), hf_model("granite4_vision")
    assert alone.anatomy.logit_scale == alone.module.config.logit_scale
    assert aya.anatomy.logit_scale is None and "'aya_vision'; its head scales no logits" in aya.anatomy.family
    text = granite.module.config.get_text_config()
    assert granite.anatomy.logit_scale == pytest.approx(1 / text.logits_scaling)
    assert "scales no logits" not in granite.anatomy.family


def test_labels_cover_every_writer():
    model = perturbed_twin("layernorm", "post")
    parts = rs.trace(model, TEXTS).decompose(2)
    assert parts.labels[:2] == ("embed", "pos_embed")
    assert {"L0H0", "L0H3", "L0.b_O", "L0.mlp", "L0.ln_resid_attn.bias", "L1.mlp"} <= set(
        parts.labels)
    assert "L2.mlp" not in parts.labels  # block 2 has not run yet at its input
    assert set(parts.kinds) == {"embed", "head", "attn_bias", "mlp", "norm_bias"}


def test_pre_norm_contributions_pass_unchanged_and_post_norm_rescales():
    pre = rs.trace(perturbed_twin("rmsnorm", "pre"), TEXTS)
    torch.testing.assert_close(pre.decompose(3).get("L0.mlp"), pre.mlp_write(0))
    post = rs.trace(perturbed_twin("layernorm", "post"), TEXTS)
    carried = post.decompose(3).get("L0.mlp")
    assert (carried - post.mlp_write(0)).abs().max() > 1e-2  # renormalized by 5 LayerNorms
    # LayerNorm re-centers: after the last one, every contribution divided by its gain γ
    # has zero mean over d_model
    gamma = post.anatomy.norms["L2.ln_resid_mlp"].gain(carried)
    assert (carried / gamma).mean(-1).abs().max() < 1e-5
    assert carried.mean(-1).abs().max() > 1e-3  # (γ ≠ 1, so without dividing it is not)


@pytest.mark.parametrize("name", list(BUILDERS))
def test_every_family_gives_the_attention_patterns_it_attends_with(name):
    """``patterns=True`` runs a model with eager attention for one pass. That pass is the
    plain (SDPA) one's, the check passes, and the patterns are rows of weights on real keys
    (summing to at most 1: attention sinks take the rest), none on later keys in a decoder.
    Falcon's eager pass once attended to later tokens (transformers cannot switch it); where
    the framework's eager attention is not the model's, patterns are refused by name."""
    model = hf_model(name)
    if model.anatomy.patterns_note:
        with pytest.raises(rs.errors.NotAvailableError, match=model.anatomy.patterns_note[:30]):
            rs.trace(model, TEXTS, patterns=True)
        return
    plain, tr = rs.trace(model, TEXTS), rs.trace(model, TEXTS, patterns=True)
    n, mask = model.anatomy.n_layers, tr.attention_mask
    assert max_rel_error(tr.stream(n), plain.stream(n), mask) <= REL_F32
    assert tr.check().ok
    real = mask.bool()
    for A in tr.patterns:
        rows = A.permute(0, 2, 1, 3)[real]  # (real query, head, key)
        assert rows.min() >= 0 and (rows.sum(-1) - 1).max() <= 1e-5 and rows.sum(-1).min() > 0
        padding = (A * (~real)[:, None, None, :]).permute(0, 2, 1, 3)[real]  # on padded keys
        assert padding.abs().max() <= 1e-6
        if model.anatomy.causal:
            assert A.triu(1).sum(-1).permute(0, 2, 1)[real].max() <= 1e-6


@pytest.mark.parametrize("name", list(BUILDERS))
def test_every_family_passes_the_check_in_bfloat16(name):
    """The model run in bfloat16 (the GPU's dtype) against its own hidden states, RMS errors
    within 2 ε: every hook and norm description holds when the framework rounds (experts'
    grouped matmuls, attention sinks, fused projections included)."""
    from residual_stream.conservation import HALF_EPS

    model = rs.load(build(name).to(torch.bfloat16), tokenizer=ByteTokenizer())
    report = rs.trace(model, TEXTS).check()
    assert report.ok and report.tolerance == HALF_EPS * torch.finfo(torch.bfloat16).eps, str(report)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_the_check_passes_a_16_bit_model_and_fails_a_wrong_hook_in_every_dtype(dtype):
    """A correct 16-bit model passes (before, bfloat16 SmolLM2 and MiniLM failed: the model
    rounds its stream at every addition, a float32 decomposition does not, and one rounding of
    an outlier is many times the stream's RMS); the same model with two layers' MLP hooks
    swapped fails, at a hook, by over 5× the tolerance (small writes: HF's initialization).
    Reference for the passing side: the framework's own hidden states; 16-bit rows are RMS
    errors within 2 ε of the dtype."""
    import dataclasses

    from residual_stream.conservation import HALF_EPS

    minilm = rs.load("minilm-l6", dtype=dtype)  # post-norm: LayerNorms magnify the rounding
    assert rs.trace(minilm, TEXTS).check().ok, str(rs.trace(minilm, TEXTS).check())
    model = rs.load(build("llama").to(dtype), tokenizer=ByteTokenizer())
    report = rs.trace(model, TEXTS).check()
    assert report.ok, str(report)
    wide = dtype == torch.float32
    assert report.tolerance == (REL_F32 if wide else HALF_EPS * torch.finfo(dtype).eps)
    frame = report.to_frame()
    assert set(frame.measure) == {"max" if wide else "rms"}
    n = model.anatomy.n_layers  # 16 bits: the final decomposition is a row of its own
    assert (frame.check == "decomposition").sum() == n + 1 + (not wide)
    assert frame[frame.check == "decomposition"].relative_error.max() <= REL_F32
    paths = model.anatomy.modules
    swapped = dataclasses.replace(paths, mlp_out=(paths.mlp_out[0], paths.mlp_out[2],
                                                  paths.mlp_out[1]))
    wrong = dataclasses.replace(model, anatomy=dataclasses.replace(model.anatomy, modules=swapped))
    bad = rs.trace(wrong, TEXTS).check()
    assert not bad.ok and bad.worst.check == "hook"
    assert bad.worst.relative_error > 5 * bad.tolerance  # bf16: 0.14 against 0.016
    with pytest.raises(rs.errors.ConservationError, match="relative"):
        bad.raise_if_failed()


def test_the_norm_checks_wait_for_another_threads_hooked_pass(monkeypatch):
    """``check()`` called each norm module of a shared model outside ``model_lock``: a pass
    hooked in another thread (the app's sessions share models) saw those calls as its own,
    wrong ``norm_scale`` values cached for everyone. Reference: a hook that another thread
    holds, with the lock, while the check reaches its norm calls fires on none of them."""
    import threading

    from residual_stream import conservation
    from residual_stream.contexts import model_lock

    model = perturbed_twin("layernorm", "pre")
    tr = rs.trace(model, ["abc de"])
    norm = model.module.get_submodule(next(iter(model.anatomy.norms.values())).module_path)
    fired, held, done = [], threading.Event(), threading.Event()

    def other_pass():
        with model_lock(model.module):
            handle = norm.register_forward_hook(lambda *a: fired.append(1))
            held.set()
            done.wait(0.5)  # the other pass's time: the check's norm calls must wait it out
            handle.remove()

    replay = conservation._replay_hooks

    def then_another_pass_starts(*args):
        replay(*args)  # the step just before the norm calls
        threading.Thread(target=other_pass).start()
        assert held.wait(10)

    monkeypatch.setattr(conservation, "_replay_hooks", then_another_pass_starts)
    report = tr.check()
    done.set()
    assert fired == [] and report.ok


def test_a_multiplier_the_model_applies_in_its_dtype_is_rounded_to_it():
    """T5Gemma multiplies its embeddings by √hidden_size as a tensor of the model's dtype: in bfloat16
    √48 = 6.928 is 6.9375. The multiplier is that value, so the stream entering block 0, replayed from the
    captured embedding, is the framework's up to the rounding of the product, without bias (at √48 itself
    every element was 0.13% low); in float32 it is √48."""
    cfg = dict(T5GEMMA, hidden_size=48)
    torch.manual_seed(0)
    whole = tf.T5GemmaForConditionalGeneration(tf.T5GemmaConfig(
        encoder=cfg, decoder=dict(cfg, num_hidden_layers=2), vocab_size=257)).eval()
    m32 = rs.load(whole, tokenizer=ByteTokenizer())
    assert m32.anatomy.norms["ln_embed"].weight[0].item() == float(torch.tensor(48 ** 0.5))
    m16 = rs.load(copy.deepcopy(whole).to(torch.bfloat16), tokenizer=ByteTokenizer())
    assert m16.anatomy.norms["ln_embed"].weight[0].item() == 6.9375
    trace = rs.trace(m16, TEXTS)
    own, ours = trace.captured.resid[0], trace.decompose(0).total()
    real = trace.attention_mask.bool()[..., None].expand_as(own) & (own != 0)
    bias = ((ours - own) / own)[real].mean()
    assert abs(float(bias)) < 2e-4, float(bias)
