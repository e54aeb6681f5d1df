"""A model split by accelerate's ``device_map`` traces and decomposes like the whole model.

This machine has one device (the CPU), so the split is CPU + disk: accelerate leaves the
disk-mapped blocks' weights on the ``meta`` device and loads them from its offload map for
each forward pass, exactly as it does for blocks offloaded from a full GPU. Reference: the
same weights loaded whole, traced on the same texts. The GPU command (several real devices)
is in docs/architecture.md ("Several devices") and benchmarks/RESULTS.md.
"""

from __future__ import annotations

import pytest
import torch
from tiny_hf import build

import residual_stream as rs
from residual_stream.inputs import ByteTokenizer

ATOL = 1e-5
TEXTS = ["The stream is split over two devices.", "Offloaded blocks load their weights per pass."]
DEVICE_MAP = {"model.embed_tokens": "cpu", "model.rotary_emb": "cpu", "model.layers.0": "cpu",
              "model.layers.1": "disk", "model.layers.2": "disk", "model.norm": "cpu", "lm_head": "cpu"}


def _byte_tokenizer():
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {c: i for i, c in enumerate(sorted(pre_tokenizers.ByteLevel.alphabet()))}
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    return PreTrainedTokenizerFast(tokenizer_object=tok)


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    folder = tmp_path_factory.mktemp("tiny-llama")
    build("llama").save_pretrained(folder)
    _byte_tokenizer().save_pretrained(folder)
    whole = rs.load(str(folder), device="cpu", dtype="float32")
    split = rs.load(str(folder), dtype="float32", device_map=DEVICE_MAP,
                    offload_folder=str(tmp_path_factory.mktemp("offload")))
    return whole, split


def test_the_split_really_offloads(pair):
    _, split = pair
    offloaded = [n for n, p in split.module.named_parameters() if p.device.type == "meta"]
    assert offloaded and all(n.startswith(("model.layers.1.", "model.layers.2.")) for n in offloaded)
    assert split.device == torch.device("cpu")


def test_split_model_traces_weights_and_decomposes_like_the_whole(pair):
    whole, split = pair
    ta, tb = rs.trace(whole, TEXTS, verify=True), rs.trace(split, TEXTS, verify=True)
    assert tb.check().ok
    n = whole.anatomy.n_layers
    for L in range(n + 1):
        torch.testing.assert_close(tb.stream(L), ta.stream(L), atol=ATOL, rtol=0)
    for L in range(n):
        for field in ("W_Q", "W_K", "W_V", "W_O", "W_in", "W_gate", "W_out"):
            torch.testing.assert_close(getattr(split.weights(L), field), getattr(whole.weights(L), field))
        torch.testing.assert_close(tb.head_writes(L), ta.head_writes(L), atol=ATOL, rtol=0)
    da, db = ta.decompose("final"), tb.decompose("final")
    assert da.labels == db.labels
    torch.testing.assert_close(db.values, da.values, atol=ATOL, rtol=0)
    ra, rb = rs.read_attribution(ta), rs.read_attribution(tb)
    torch.testing.assert_close(rb.share, ra.share, atol=ATOL, rtol=0)


def test_scan_over_a_split_model_equals_the_whole(pair):
    whole, split = pair
    kw = dict(batch_size=1, seq_len=16, progress=False)
    stats = ["growth", "survival", "lens", "lens:every=2"]  # the sampled lens: logits of its pass
    a = rs.scan(whole, TEXTS, stats, **kw)
    b = rs.scan(split, TEXTS, stats, **kw)
    torch.testing.assert_close(b.stats["growth"].mean, a.stats["growth"].mean, atol=ATOL, rtol=0)
    torch.testing.assert_close(b.stats["survival"].retention, a.stats["survival"].retention,
                               atol=ATOL, rtol=0, equal_nan=True)
    for lens in ("lens", "lens:every=2"):
        la, lb = a.stats[lens], b.stats[lens]
        assert list(lb.tokens) == list(la.tokens) and list(lb.median_rank) == list(la.median_rank)
        torch.testing.assert_close(torch.tensor(lb.kl.values), torch.tensor(la.kl.values), atol=ATOL,
                                   rtol=0)
    assert 0 < a.stats["lens:every=2"].tokens[0] < a.stats["lens"].tokens[0]


def test_a_twin_refuses_a_device_map():
    with pytest.raises(rs.errors.InputError, match="drop device_map"):
        rs.load("twin-pre-rms", device_map={"": "cpu"})
    assert rs.load("twin-pre-rms").device == torch.device("cpu")
    assert isinstance(rs.load("twin-pre-rms").tokenizer, ByteTokenizer)


@pytest.mark.parametrize(("device_map", "message"), [
    ("bogus", "device_map: device 'bogus' is not a device name.*one of \\['auto', 'balanced'"),
    ({"": True}, "device_map\\[''\\]: True is not a device"),
    ({"": -1}, "device_map\\[''\\]: Device index must not be negative"),
    ({"model.layers.0": "cuda:99"}, "device_map\\['model.layers.0'\\]: device 'cuda:99' is not on this"),
    ({"": 99}, "device_map\\[''\\]: device 'cuda:99'"),
    ({"": "tpu"}, "device_map\\[''\\]: device 'tpu' is not a device name"),
])
def test_a_device_map_that_cannot_place_the_model_is_refused_before_loading(pair, device_map, message,
                                                                            monkeypatch):
    """A bad strategy or an absent device was "could not load the model …: Re-download or
    reinstall it", an error of the model's files; the files are never opened now."""
    from residual_stream import loading

    folder = pair[0].module.name_or_path
    monkeypatch.setattr(loading, "_load_path_or_name", lambda *a: pytest.fail("files opened"))
    with pytest.raises(rs.errors.InputError, match=message):
        rs.load(folder, device="cpu", device_map=device_map)


def test_a_device_map_of_one_device_places_the_whole_model(pair):
    """``device_map="cpu"`` (or ``{"": "cpu"}``, one device for every module) is accelerate's
    and transformers' own; a first version of the check above refused it."""
    whole = pair[0]
    folder = whole.module.name_or_path
    for device_map in ("cpu", {"": "cpu"}):
        placed = rs.load(folder, device="cpu", dtype="float32", device_map=device_map)
        torch.testing.assert_close(rs.trace(placed, TEXTS).stream(3), rs.trace(whole, TEXTS).stream(3),
                                   rtol=0, atol=ATOL)


def test_patching_a_split_model_equals_patching_the_whole(pair):
    """Stream and path patching run on the split model (blocks offloaded, none skipped: a skipped
    block's state would have to live where accelerate puts it) as on the whole one."""
    corrupt = [t[:4] + "X" + t[5:] for t in TEXTS]
    got = []
    for model in pair:
        clean, other = rs.trace(model, TEXTS), rs.trace(model, corrupt)

        def metric(logits):
            return (logits[:, -1, 101] - logits[:, -1, 32]).mean()

        paths = rs.path_patch(clean, other, metric, senders=["L0H1", "L1.mlp"],
                              receivers=["L2.attn", "logits"])
        got.append((paths, rs.patch_stream(clean, other, metric, points=[1, 3], positions=[5, -1])))
    (path_a, stream_a), (path_b, stream_b) = got
    torch.testing.assert_close(path_b.metric, path_a.metric, atol=ATOL, rtol=0)
    torch.testing.assert_close(stream_b.metric, stream_a.metric, atol=ATOL, rtol=0)
    assert (path_a.metric - path_a.metric_clean).abs().max() > 100 * ATOL
