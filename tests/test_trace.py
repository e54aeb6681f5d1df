"""Tracing: inputs, padding, errors, hook hygiene, and the analysis-facing views."""

import pytest
import torch
from conftest import REL_F32, TEXTS, max_rel_error
from tiny_hf import build

import residual_stream as rs
from residual_stream.errors import ContextLengthError, EmptyTextError, InputError, NonFiniteError
from residual_stream.inputs import ByteTokenizer
from residual_stream.twins import twin


@pytest.fixture(scope="module")
def llama():
    return rs.load(build("llama"), tokenizer=ByteTokenizer())


@pytest.mark.parametrize("texts", ["", "   ", [], ["fine", ""]])
def test_empty_text(llama, texts):
    with pytest.raises(EmptyTextError, match="empty|no texts"):
        rs.trace(llama, texts)


def test_too_long_names_the_limit_and_chunking_splits(llama):
    text = "x" * 200  # 201 byte tokens with BOS; the tiny model's context is 128
    with pytest.raises(ContextLengthError, match="201 tokens.*limit of 128"):
        rs.trace(llama, text)
    trace = rs.trace(llama, text, overflow="chunk")
    assert trace.tokens.shape == (2, 128)
    assert trace.attention_mask.sum().item() == 201
    assert trace.batch.text_index == (0, 0) and trace.batch.text_start == (0, 128)
    assert "1 text in 2 rows × 128 positions, 201 real tokens" in repr(trace)  # was "2 texts"
    two = rs.trace(llama, [text, "short"], overflow="chunk")
    assert two.batch.text_index == (0, 0, 1) and "2 texts in 3 rows × 128 positions" in repr(two)


def test_batched_equals_one_by_one(llama):
    batch = rs.trace(llama, TEXTS)
    for i, text in enumerate(TEXTS):
        alone = rs.trace(llama, text)
        n = alone.tokens.shape[1]
        for L in (0, 2, 3):
            assert max_rel_error(batch.stream(L)[i:i + 1, :n], alone.stream(L),
                                 alone.attention_mask) <= REL_F32
        torch.testing.assert_close(batch.decompose(3).values[:, i:i + 1, :n],
                                   alone.decompose(3).values, atol=1e-5, rtol=1e-4)


def test_padding_is_excluded_from_tables(llama):
    batch = rs.trace(llama, TEXTS).decompose(2).to_frame()
    long_only = rs.trace(llama, TEXTS[1:]).decompose(2).to_frame()
    short_only = rs.trace(llama, TEXTS[:1]).decompose(2).to_frame()
    n0, n1 = (len(t.encode()) + 1 for t in TEXTS)
    expected = (short_only.norm_mean * n0 + long_only.norm_mean * n1) / (n0 + n1)
    torch.testing.assert_close(torch.tensor(batch.norm_mean.values),
                               torch.tensor(expected.values), atol=1e-5, rtol=1e-5)


def test_shares_sum_to_one(llama):
    frame = rs.trace(llama, TEXTS).decompose(3).to_frame()
    assert frame.share_mean.sum() == pytest.approx(1.0, abs=1e-4)


def test_hooks_removed_even_when_forward_raises():
    model = twin(norm="layernorm", placement="post", n_layers=2)  # learned positions, n_ctx 256

    def count():
        return sum(len(m._forward_hooks) + len(m._forward_pre_hooks)
                   for m in model.module.modules())

    def fails(*args, **kwargs):
        raise RuntimeError("block 1 failed")

    before = count()
    model.module.blocks[1].forward = fails  # the model itself fails mid-capture
    with pytest.raises(RuntimeError, match="block 1 failed"):
        rs.trace(model, "y" * 30)
    assert count() == before
    del model.module.blocks[1].forward
    context = "max_length must be a whole number between 1 and the model's context of 256, got 400"
    with pytest.raises(InputError, match=context):
        rs.trace(model, "y" * 300, max_length=400)  # past the context: refused before the model
    with pytest.raises(InputError, match="got 0"):
        rs.trace(model, "y", max_length=0)
    with pytest.raises(InputError, match="text 0 is not valid Unicode at character 3"):
        rs.trace(model, "caf\udce9 latte")  # a byte the shell could not decode


def test_nan_in_the_stream_names_layer_and_component():
    model = twin(norm="layernorm", placement="pre", n_layers=4)
    with torch.no_grad():
        model.module.blocks[2].mlp.fc_out.weight[0, 0] = float("nan")
    with pytest.raises(NonFiniteError, match="layer 2, in MLP"):
        rs.trace(model, "hello")


def test_nan_weights_of_a_model_object_are_refused_at_load_and_nan_logits_at_trace():
    """A model object was never checked (only files were): NaN in its LM head gave NaN logits,
    and the lens reported top-1 agreement 1.0 and rank 0 over them. Now ``rs.load`` names the
    first bad parameter, and a head corrupted after loading is named by the trace."""
    from residual_stream.errors import CorruptModelFileError

    module = build("llama")
    with torch.no_grad():
        module.lm_head.weight[5, 0] = float("nan")
    with pytest.raises(CorruptModelFileError, match=r"first in lm_head.weight\); set or reload its weights"):
        rs.load(module, tokenizer=ByteTokenizer())
    with torch.no_grad():
        module.lm_head.weight[5, 0] = 0.0
    model = rs.load(module, tokenizer=ByteTokenizer())
    with torch.no_grad():
        module.lm_head.weight[5, 0] = float("inf")
    with pytest.raises(NonFiniteError, match="in the logits \\(the stream is finite\\)"):
        rs.trace(model, "hello")


def test_head_writes_sum_to_attention_output_and_scales_are_recorded(llama):
    trace = rs.trace(llama, TEXTS, verify=True)
    torch.testing.assert_close(trace.attn_write(1), trace.captured.attn_out[1],
                               atol=1e-6, rtol=1e-5)
    spec = llama.anatomy.norms["L1.ln_mlp_in"]
    x = trace.captured.norm_in["L1.ln_mlp_in"]
    expected = torch.sqrt(x.pow(2).mean(-1) + spec.eps)
    torch.testing.assert_close(trace.norm_scale("L1.ln_mlp_in"), expected)


def test_bad_layer_index(llama):
    trace = rs.trace(llama, "hi")
    with pytest.raises(IndexError, match=r"0\.\.3"):
        trace.stream(4)
    with pytest.raises(IndexError, match=r"0\.\.3"):
        trace.decompose(7)


@pytest.mark.parametrize("name", ["llama", "gpt2", "gemma2"])
def test_component_sources_decompose_the_stream_like_the_head_sources(name):
    """``sources(heads=False)``: each attention as one piece; the replay sums to the same stream."""
    from residual_stream.decomposition import replay

    model = rs.load(build(name), tokenizer=ByteTokenizer())
    trace = rs.trace(model, TEXTS)
    last = model.anatomy.n_layers
    whole = replay(model.anatomy.program, trace.sources(heads=False), upto=last)
    per_head = trace.decompose(last)
    assert "L1.attn" in whole.labels and not any("H" in lab for lab in whole.labels)
    assert len(whole.labels) < len(per_head.labels)
    assert max_rel_error(whole.total(), trace.stream(last), trace.attention_mask) <= REL_F32
    torch.testing.assert_close(whole.get("L1.attn"), per_head.values[
        [i for i, lab in enumerate(per_head.labels) if lab.startswith("L1H") or lab == "L1.b_O"]
    ].sum(0), atol=1e-5, rtol=1e-4)


@pytest.mark.parametrize("name", ["llama", "gpt2", "gemma2", "bert"])
def test_final_stream_is_what_the_framework_hands_its_head(name):
    """``stream("final")`` against the framework's own last hidden state: Llama, GPT-2 and
    Gemma 2 put their final norm before it, BERT (post-norm) has none, so there it is the
    last block's output; and it is what ``decompose("final")`` sums to."""
    model = rs.load(build(name), tokenizer=ByteTokenizer())
    trace = rs.trace(model, TEXTS)
    dev = model.device
    with torch.no_grad():
        out = model.module(input_ids=trace.tokens.to(dev),
                           attention_mask=trace.attention_mask.to(dev), output_hidden_states=True)
    final = trace.stream("final")
    assert max_rel_error(final, out.hidden_states[-1].float(), trace.attention_mask) <= REL_F32
    assert max_rel_error(trace.decompose("final").total(), final, trace.attention_mask) <= REL_F32
    last = trace.stream(model.anatomy.n_layers)
    assert (max_rel_error(last, final, trace.attention_mask) <= REL_F32) == (name == "bert")


def test_a_head_as_a_reader_is_refused_with_how_heads_read(llama):
    trace = rs.trace(llama, "hi")
    for call in (trace.read_input, trace.decompose_read):
        with pytest.raises(rs.errors.UnknownNameError, match=r"read_input\('L1.attn'\).*L1H2.k"):
            call("L1H2.k")
        with pytest.raises(rs.errors.UnknownNameError, match=r"components are \['L0.attn'"):
            call("L9H2.q")


@pytest.mark.parametrize("name", ["falcon", "falcon_new"])
def test_patterns_of_a_model_transformers_cannot_switch_to_eager_attention(name):
    """transformers switches attention only for models using its ``AttentionInterface``;
    Falcon's stayed SDPA, whose boolean mask its eager arithmetic (run for
    ``output_attentions``) added to the scores: every token attended to later ones and the
    stream moved by 0.07. Now its patterns are causal rows summing to 1, the traced stream is
    the plain one's, the check passes, and the model is SDPA again afterwards."""
    module = build(name)
    model = rs.load(module, tokenizer=ByteTokenizer())
    plain, tr = rs.trace(model, TEXTS), rs.trace(model, TEXTS, patterns=True)
    real = tr.attention_mask.bool()
    for A in tr.patterns:
        rows = A.permute(0, 2, 1, 3)[real]  # (real query, head, key)
        assert (A.triu(1).sum(-1).permute(0, 2, 1)[real]).abs().max() < 1e-6  # no later key
        assert (rows.sum(-1) - 1).abs().max() < 1e-5
    n = model.anatomy.n_layers
    assert max_rel_error(tr.stream(n), plain.stream(n), tr.attention_mask) <= REL_F32
    assert tr.check().ok
    assert module.config._attn_implementation == "sdpa"


def _implementations(config, at: str = "") -> dict:
    """Every (sub-)config's attention implementation, by its path, walked here by hand."""
    out = {at: getattr(config, "_attn_implementation", None)}
    for key in getattr(config, "sub_configs", {}):
        if getattr(config, key, None) is not None:
            out |= _implementations(getattr(config, key), f"{at}.{key}")
    return out


@pytest.mark.parametrize("name", ["dbrx", "llava", "apertus1p5", "gemma3"])
def test_patterns_leave_every_sub_config_as_it_was(name):
    """Patterns switch a model to eager attention and back; every sub-config gets its own
    implementation back: Apertus 1.5's vision tower keeps eager (it takes no SDPA), LLaVA's
    tower and text model SDPA, and DBRX's attention and MLP configs none (they were set to
    what the model was switched to)."""
    model = rs.load(build(name), tokenizer=ByteTokenizer())
    before = _implementations(model.module.config)
    assert "eager" not in before[""] and len(before) > 1
    rs.trace(model, TEXTS, patterns=True)
    assert _implementations(model.module.config) == before


def test_patterns_the_framework_gets_wrong_are_refused():
    """Falcon with ALiBi: transformers' eager attention adds the bias twice (its SDPA path
    once), so patterns would describe another model; they are refused by name, and the
    plain trace still passes its check."""
    model = rs.load(build("falcon_rw"), tokenizer=ByteTokenizer())
    with pytest.raises(rs.errors.NotAvailableError, match="ALiBi adds the bias twice"):
        rs.trace(model, TEXTS, patterns=True)
    assert model.module.config._attn_implementation == "sdpa"
    assert rs.trace(model, TEXTS).check().ok


SINK_ATOL = 1e-5  # float32 patterns, each sink scale computed two ways


@pytest.mark.parametrize("name", ["granite_swa", "granitemoe_swa"])
def test_patterns_of_sinks_applied_after_the_softmax_carry_their_scale(name):
    """Granite SWA scales each head's output by ``sigmoid(logsumexp(scores) − sink)`` after the
    softmax; the framework's patterns leave that out. Reference, independent of the library:
    the framework's own eager patterns ``A`` and, per token and head, ``logsumexp = S_ii −
    log A_ii`` with the diagonal score ``S_ii`` from the framework's own projections (the
    rotary embedding cancels between a query and a key at one position). The traced patterns
    are ``A`` times that scale, rows summing to it (< 1), and ``z`` is their product with ``v``."""
    model = rs.load(build(name), tokenizer=ByteTokenizer())
    module, cfg, a = model.module, model.module.config, model.anatomy
    seen = {}
    hooks = [getattr(layer.self_attn, p).register_forward_hook(
        lambda m, args, out, key=(L, p): seen.__setitem__(key, out.detach()))
        for L, layer in enumerate(module.model.layers) for p in ("q_proj", "k_proj", "v_proj")]
    try:
        tr = rs.trace(model, TEXTS, patterns=True)
        module.set_attn_implementation("eager")
        with torch.no_grad():
            framework = module(input_ids=tr.tokens, attention_mask=tr.attention_mask,
                               output_attentions=True).attentions
    finally:
        for h in hooks:
            h.remove()
    real, rep = tr.attention_mask.bool(), a.n_heads // a.n_kv_heads
    for L, (ours, A) in enumerate(zip(tr.patterns, framework, strict=True)):
        q, k, v = (seen[(L, p)].unflatten(-1, (-1, a.d_head)) for p in ("q_proj", "k_proj", "v_proj"))
        k, v = k.repeat_interleave(rep, 2), v.repeat_interleave(rep, 2)    # (batch, pos, head, d_head)
        s_ii = cfg.attention_multiplier * (q * k).sum(-1)                  # (batch, pos, head)
        diag = A.diagonal(dim1=-2, dim2=-1).transpose(1, 2)                 # A_ii, (batch, pos, head)
        sinks = module.model.layers[L].self_attn.sinks.detach()
        scale = torch.sigmoid(s_ii - diag.log() - sinks).transpose(1, 2)    # (batch, head, pos)
        want = A * scale[..., None]
        at = real[:, None, :, None].expand_as(A)
        assert (ours - want)[at].abs().max() <= SINK_ATOL, L
        assert scale.transpose(1, 2)[real].max() < 1 - 1e-3  # the sinks took some weight
        z = torch.einsum("bhqk,bkhd->bqhd", ours, v).flatten(2)
        assert max_rel_error(z, tr.captured.z[L], tr.attention_mask) <= REL_F32
