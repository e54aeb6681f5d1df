"""The contribution buffer of ``streaming.flow`` in a 16-bit model's own dtype.

Where nothing rescales a carried write (``carry.carry_dtype``), the bf16 buffer holds the same
numbers as a float32 one, so survival, read attribution and subspaces must come out equal to
the float32-buffer scan (every sum, within float32 summation order: ``REL``), and a write
that is not a bf16 value is reported.
"""

from __future__ import annotations

import pytest
import torch
from spies import watch

import residual_stream as rs
from residual_stream.streaming import carry, flow

REL = 1e-6  # the same float32 products, token chunk by token chunk instead of all at once
TEXTS = ["Residual streams grow with depth.", "Zebras Zigzag.", "a", "print('hello')",
         "Attention reads; the MLP writes back.", "for i in range(10): total += i"]
STATS = ["survival", "read_attribution", "subspaces"]


def _bf16(name: str) -> rs.Model:
    from tiny_hf import build

    from residual_stream.inputs import ByteTokenizer

    return rs.load(build(name).to(torch.bfloat16), tokenizer=ByteTokenizer())


@pytest.mark.filterwarnings("error::RuntimeWarning")  # exact writes: no rounding report
@pytest.mark.parametrize("name,carried", [("llama", torch.bfloat16), ("gpt2", torch.bfloat16),
                                          ("gpt_neox_parallel", torch.bfloat16),
                                          ("gemma2", torch.float32), ("bert", torch.float32)])
def test_a_bf16_buffer_gives_the_float32_buffers_sums(name, carried, monkeypatch):
    m = _bf16(name)
    assert flow.carry_dtype(m) == carried  # Gemma 2 writes through norms; BERT normalizes the stream
    kw = dict(batch_size=3, seq_len=24, progress=False)
    used = []
    watch(monkeypatch, flow.FlowSums, "_append", lambda self, *_: used.append(self.buf.dtype),
          after=True)
    monkeypatch.setattr("residual_stream.analyses.subspace_measures.CHUNK_ELEMENTS", 5000)
    got = rs.scan(m, TEXTS, STATS, **kw)
    assert set(used) == {carried}
    monkeypatch.setattr(flow, "carry_dtype", lambda model: torch.float32)
    ref = rs.scan(m, TEXTS, STATS, **kw)
    for stat in STATS:
        a, b = got.accumulators[stat], ref.accumulators[stat]
        assert a.sums.keys() == b.sums.keys()
        for key, x in b.sums.items():
            y = a.sums[key]
            assert torch.equal(x.isnan(), y.isnan()), (stat, key)
            scale = float(x.nan_to_num().abs().max().clamp_min(1e-30))
            assert float((x - y).nan_to_num().abs().max()) <= REL * scale, (stat, key)


def test_a_write_that_is_not_a_bf16_value_is_reported():
    m = _bf16("llama")
    sums = flow.FlowSums(m, torch.ones(1, 2, dtype=torch.bool))
    sums.ask(flow.SURVIVAL)
    exact = torch.tensor([[[1.0] * m.anatomy.d_model] * 2])
    sums._append("embed", exact)
    sums._check_rounding()  # a bf16 value: nothing to say
    sums._append("L0.attn", exact * (1 + 2 ** -12))  # between two bf16 values
    flow._WARNED.discard(m.name)
    with pytest.warns(RuntimeWarning, match="rounded by up to 0.000244"):
        sums._check_rounding()


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_the_compiled_form_of_survival_dots_equals_the_chunked_product(dtype):
    """``carry._dots`` is what a GPU compiles (one read of the buffer); the CPU runs the chunked
    product. Both against a float64 reference, within float32 summation order."""
    g = torch.Generator().manual_seed(0)
    c = torch.randn(37, 9, 48, generator=g).to(dtype)  # (token, source, d): 37 tokens, 8 chunks
    x = torch.randn(37, 48, generator=g)
    ref = torch.einsum("tid,td->ti", c.double(), x.double())
    for got in (carry._dots(c, x), carry._dots_chunked(c, x), carry.token_dots(c, x)):
        assert got.dtype == torch.float32 and got.shape == (37, 9)
        assert float((got.double() - ref).abs().max()) <= 1e-6 * float(ref.abs().max())


def test_a_sampled_batch_that_chooses_no_token_adds_nothing_to_a_bf16_buffer(monkeypatch):
    """One short text a batch, one token in 64: some batches choose none. The bf16 buffer's
    products over no token are empty (they raised before), and the sums equal the float32
    buffer's."""
    from residual_stream.streaming import Corpus, corpus_batches
    from residual_stream.streaming.sampling import sampled

    m = _bf16("llama")
    texts = ["ab", "cd", "ef", "gh", *TEXTS]
    stats = ["survival:every=64", "read_attribution:every=64"]
    kw = dict(batch_size=1, seq_len=8, order="text")
    chosen = [int(sampled(b, 64).sum()) for b in corpus_batches(m, Corpus(texts), **kw)]
    assert 0 in chosen and sum(chosen) > 0
    got = rs.scan(m, texts, stats, progress=False, **kw)
    monkeypatch.setattr(flow, "carry_dtype", lambda model: torch.float32)
    ref = rs.scan(m, texts, stats, progress=False, **kw)
    for stat in stats:
        assert int(got.accumulators[stat].sums["n"].sum()) > 0
        for key, x in ref.accumulators[stat].sums.items():
            y = got.accumulators[stat].sums[key]
            scale = float(x.nan_to_num().abs().max().clamp_min(1e-30))
            assert float((x - y).nan_to_num().abs().max()) <= REL * scale, (stat, key)
