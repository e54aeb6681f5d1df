"""The lean pass on a 16-bit model's own tensors (``capture(dtype=None)``, ``native_dtype``).

Growth widens what it reads inside its reductions and the walk adds in float32
(``walk.plus``), so a bf16 model's growth scan from the hooks' own bf16 tensors must equal the
scan from float32 copies of them: every sum within float32 summation order (``REL``; the
norms are reduced from the bf16 values instead of from their exact float32 copies), the
counts, histograms and massive activations identical.
"""

from __future__ import annotations

import pytest
import torch
from spies import watch

import residual_stream as rs
from residual_stream.streaming import Corpus, corpus_batches, growth, lean, make_accumulators
from residual_stream.walk import plus

REL = 2e-6  # float32 reductions of the same values, in another order
TEXTS = ["Residual streams grow with depth.", "Zebras Zigzag.", "a", "print('hello')",
         "Attention reads; the MLP writes back.", "for i in range(10): total += i"]


def _bf16(name: str) -> rs.Model:
    from tiny_hf import build

    from residual_stream.inputs import ByteTokenizer

    return rs.load(build(name).to(torch.bfloat16), tokenizer=ByteTokenizer())


def _dtypes_seen(monkeypatch, cls=None, method: str = "point") -> list[torch.dtype]:
    """The dtype of the tensor (last argument) each call of ``cls.method`` gets, recorded."""
    seen: list[torch.dtype] = []
    watch(monkeypatch, growth.GrowthSums if cls is None else cls, method,
          lambda self, key, x: seen.append(x.dtype))
    return seen


# llama: pre-norm; gemma2 and olmo2: writes through norms (Add via); bert: the stream normalized
# (Norm after each Mark); gpt_neox_parallel: both writes read the same stream
@pytest.mark.parametrize("name", ["llama", "gemma2", "olmo2", "bert", "gpt_neox_parallel"])
def test_growth_from_native_bf16_tensors_equals_growth_from_float32_copies(name, monkeypatch):
    m = _bf16(name)
    kw = dict(batch_size=4, seq_len=24, progress=False, graphs=False)
    seen = _dtypes_seen(monkeypatch)
    got = rs.scan(m, TEXTS, ["growth"], **kw).accumulators["growth"]
    assert set(seen) == {torch.bfloat16}  # the hooks kept the model's tensors
    seen.clear()
    monkeypatch.setattr(growth.GrowthSums, "native_dtype", False)
    ref = rs.scan(m, TEXTS, ["growth"], **kw).accumulators["growth"]
    assert set(seen) == {torch.float32}  # the positive control: float32 copies
    assert got.sums.keys() == ref.sums.keys()
    for key, x in ref.sums.items():
        y = got.sums[key]
        if not x.is_floating_point() or key == "hist":
            assert torch.equal(x, y), key
            continue
        assert torch.equal(x.isnan(), y.isnan()), key
        scale = float(x.nan_to_num().abs().max().clamp_min(1e-30))
        assert float((x - y).nan_to_num().abs().max()) <= REL * scale, key
    assert got.meta["massive"] == ref.meta["massive"]


def test_a_lean_pass_with_one_float32_reducer_captures_float32(monkeypatch):
    """``native_dtype`` must hold for every reducer; one without it gets float32 copies."""
    m = _bf16("llama")
    batch = next(iter(corpus_batches(m, Corpus(TEXTS[:2]), batch_size=2, seq_len=16)))
    seen = _dtypes_seen(monkeypatch)
    keep = lean._KeepPoints([0])
    sums = make_accumulators(["growth"])["growth"].sums_for(m, batch)
    lean.lean_pass(m, batch, [sums, keep])
    assert set(seen) == {torch.float32} and keep.streams[0].dtype == torch.float32


@pytest.mark.parametrize("a,b", [(torch.bfloat16, torch.bfloat16), (torch.float32, torch.bfloat16),
                                 (torch.float16, torch.float32), (torch.float64, torch.float64)])
def test_plus_adds_in_at_least_float32(a, b):
    x = torch.tensor([1.0, 2.0**-9], dtype=a)
    w = torch.tensor([2.0**-9, 1.0], dtype=b)
    got = plus(x, w)
    assert got.dtype == (torch.float64 if torch.float64 in (a, b) else torch.float32)
    # 1 + 2^-9 is not a bf16 or fp16 value: a 16-bit sum would round it to 1
    assert torch.equal(got, torch.tensor([1 + 2.0**-9] * 2, dtype=got.dtype))


FLOW_STATS = ["survival", "read_attribution", "subspaces"]


@pytest.mark.filterwarnings("error::RuntimeWarning")  # no rounding report either way
@pytest.mark.parametrize("name", ["llama", "gemma2", "gpt2"])
def test_flow_statistics_from_native_bf16_writes_equal_those_from_float32_copies(name, monkeypatch):
    """``FlowSums`` stores a bf16 write as it is (bf16 buffer) or widened (float32 buffer)."""
    from residual_stream.streaming import flow

    m = _bf16(name)
    kw = dict(batch_size=3, seq_len=24, progress=False)
    stored = _dtypes_seen(monkeypatch, flow.FlowSums, "_append")
    got = rs.scan(m, TEXTS, FLOW_STATS, **kw)
    assert torch.bfloat16 in stored  # native writes reached the buffer
    stored.clear()
    monkeypatch.setattr(flow.FlowSums, "native_dtype", False)
    ref = rs.scan(m, TEXTS, FLOW_STATS, **kw)
    assert torch.bfloat16 not in stored  # the positive control: float32 copies
    for stat in FLOW_STATS:
        a, b = got.accumulators[stat], ref.accumulators[stat]
        for key, x in b.sums.items():
            y = a.sums[key]
            assert torch.equal(x.isnan(), y.isnan()), (stat, key)
            scale = float(x.nan_to_num().abs().max().clamp_min(1e-30))
            assert float((x - y).nan_to_num().abs().max()) <= REL * scale, (stat, key)
