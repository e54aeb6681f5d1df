"""Patched passes skip the blocks before the first edit, taking their clean output from the trace."""

import pytest
import torch
from conftest import TEXTS, metric_failing_after_clean
from test_patching import CORRUPT, _diff, _setup

import residual_stream as rs
import residual_stream.analyses.patching as patching


def _calls(module, model):
    """Count each block's attention output projection's calls: one per pass that computes it."""
    counts, handles = {}, []
    for layer, path in enumerate(model.anatomy.modules.attn_out):
        handles.append(module.get_submodule(path).register_forward_pre_hook(
            lambda m, a, layer=layer: counts.__setitem__(layer, counts.get(layer, 0) + 1)))
    return counts, handles


@pytest.mark.parametrize("name", ["llama", "gpt2", "bert_mlm"])
def test_skipped_blocks_give_the_results_of_computed_ones_and_are_not_computed(name, monkeypatch):
    """Path patching into block 2 and the logits, and stream patching at points 2 and 3: equal
    with and without skipping (a run computes only from its first edit's block on: nothing of
    blocks 0–1 runs in the patched passes); every block's ``forward`` is the class's afterwards."""
    module, model, clean, other = _setup(name)
    metric = _diff(clean)

    def both():
        return (rs.path_patch(clean, other, metric, senders=["L0H1", "L1.mlp"],
                              receivers=["L2.attn", "logits"], batch_size=1),
                rs.patch_stream(clean, other, metric, points=[2, 3], positions=[5, -1], batch_size=1))

    counts, handles = _calls(module, model)
    try:
        skipped = both()
        seen = dict(counts)
        monkeypatch.setattr(patching, "SKIP_CLEAN_BLOCKS", False)
        counts.clear()
        computed = both()
    finally:
        for h in handles:
            h.remove()
    assert torch.allclose(skipped[0].metric, computed[0].metric, atol=1e-6)
    assert torch.allclose(skipped[1].metric, computed[1].metric, atol=1e-6)
    assert (skipped[0].metric - skipped[0].metric_clean).abs().max() > 1e-3  # the patches matter
    # one pass per run: 4 path runs (2 into block 2) and 4 stream patches (2 at point 2); with
    # skipping, blocks 0 and 1 run only in the probe, block 2 in the runs patched there
    assert seen.get(0, 0) <= 1 and seen.get(1, 0) <= 1 and seen[2] - seen.get(0, 0) == 4
    assert counts[0] == counts[2] == 8  # without skipping every block runs in every pass
    blocks = [module.get_submodule(p) for p in model.anatomy.modules.layers]
    assert all("forward" not in b.__dict__ for b in blocks)


def test_a_forward_set_on_the_instance_is_restored_even_when_the_metric_fails():
    """accelerate sets ``forward`` on a module instance: skipping puts that one back, also after an error."""
    module, model, clean, other = _setup("llama")
    block = module.model.layers[0]
    own = block.forward  # the bound method, set on the instance as accelerate's wrapper would be
    block.forward = own
    fails = metric_failing_after_clean()

    with pytest.raises(RuntimeError, match="metric failed"):
        rs.path_patch(clean, other, fails, senders="L0H1", receivers="L2.attn")
    assert block.__dict__["forward"] is own
    assert all("forward" not in b.__dict__ for b in module.model.layers[1:])
    with torch.no_grad():  # and the model computes as before
        logits = module(input_ids=clean.tokens, attention_mask=clean.attention_mask).logits
    assert torch.allclose(logits, clean.logits, atol=1e-5)


def test_a_float64_model_is_not_skipped():
    """A float64 model's trace keeps float32 states, not its own: its blocks always run."""
    module, model, clean, other = _setup("llama")
    module.double()
    model = rs.load(module, tokenizer=model.tokenizer)
    clean, other = rs.trace(model, TEXTS), rs.trace(model, CORRUPT)
    counts, handles = _calls(module, model)
    try:
        rs.path_patch(clean, other, _diff(clean), senders=["L0H1"], receivers=["L2.attn"])
    finally:
        for h in handles:
            h.remove()
    assert counts[0] == counts[2] > 0


def test_a_transformer_lens_bridge_is_skipped_and_left_as_it_was(monkeypatch):
    """A bridge's blocks wrap the HF layers and pass attribute writes on to them; the stub goes
    into the block's own ``__dict__`` and comes out again: the results equal computed blocks,
    no ``forward`` is left on any block or wrapped layer, and the model traces other texts."""
    import copy

    import transformers as tf
    from transformers import AutoTokenizer

    from residual_stream.registry import REGISTRY
    from residual_stream.tl_compat import boot_bridge

    tok = AutoTokenizer.from_pretrained(REGISTRY["minilm-l6"].location())
    torch.manual_seed(0)
    hf = tf.LlamaForCausalLM(tf.LlamaConfig(vocab_size=tok.vocab_size, hidden_size=64, intermediate_size=96,
                                            num_hidden_layers=3, num_attention_heads=4, num_key_value_heads=2,
                                            max_position_embeddings=128)).eval()
    with torch.no_grad():
        for name, p in hf.named_parameters():
            if name.endswith(("o_proj.weight", "down_proj.weight")):
                p.mul_(10)
    model = rs.load(boot_bridge(copy.deepcopy(hf), tok, "tiny-llama"), tokenizer=tok)
    texts = ["the capital of france is paris", "residual streams grow with depth"]
    clean = rs.trace(model, texts)
    other = rs.trace(model, ["the capital of germany is paris", "residual streams shrink with depth"])

    def metric(logits):
        return (logits[:, -1, 1000] - logits[:, -1, 2000]).mean()

    def both():
        paths = rs.path_patch(clean, other, metric, senders=["L0H1", "L1.mlp"],
                              receivers=["L2.attn", "logits"])
        return paths, rs.patch_stream(clean, other, metric, points=[2, 3], positions=[3, -1])

    skipped = both()
    monkeypatch.setattr(patching, "SKIP_CLEAN_BLOCKS", False)
    computed = both()
    for a, b in zip(skipped, computed, strict=True):
        assert torch.allclose(a.metric, b.metric, atol=1e-6)
    assert (skipped[1].metric - skipped[1].metric_clean).abs().max() > 1e-3  # the patches matter
    everything = [m for m in model.module.modules()]
    assert not [m for m in everything if "forward" in m.__dict__]
    again = rs.trace(model, ["a text of another shape"])
    with torch.no_grad():
        want = hf(input_ids=again.tokens).logits
    assert torch.allclose(again.logits, want, atol=1e-4)


def test_ablated_runs_of_outputs_only_skip_the_blocks_before_their_write(monkeypatch):
    """``ablation_check(reads=False)`` of writes in blocks 1–2: equal with and without skipping,
    and block 0 computes only in the probe."""
    module, model, clean, other = _setup("gpt2")
    kw = dict(writes=["L1H0", "L2.mlp", "L1.attn"], mode="patch", reference=other, metric=_diff(clean),
              reads=False)
    counts, handles = _calls(module, model)
    try:
        skipped = rs.ablation_check(clean, **kw).outputs()
        seen = dict(counts)
        monkeypatch.setattr(patching, "SKIP_CLEAN_BLOCKS", False)
        computed = rs.ablation_check(clean, **kw).outputs()
    finally:
        for h in handles:
            h.remove()
    for col in ("logit_kl", "last_kl", "top_logit_change", "metric"):
        assert skipped[col].to_numpy() == pytest.approx(computed[col].to_numpy(), abs=1e-6), col
    assert (computed.metric_change.abs() > 1e-3).all()
    assert seen.get(0, 0) <= 1 and seen[1] >= 1
