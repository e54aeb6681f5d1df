"""Streaming statistics: a scan over batches equals the analyses on one trace of every row.

Reference: the package's analyses (each checked elsewhere against hand examples, float64
loops and TransformerLens) run on a single trace holding every row of the corpus, against
``rs.scan`` over the same rows in batches of 3. Tolerances:

* means: ``REL_MEAN`` relative (float32 per batch, float64 sums; only summation order differs);
* norm quantiles: within one histogram bin, ``BIN_WIDTH`` relative (the stated approximation);
* counts, ranks, massive-activation rows: exactly equal.
"""

from __future__ import annotations

import json
import os
import struct
import subprocess
import sys
import zipfile
from pathlib import Path

import numpy as np
import pytest
import torch
from spies import watch

import residual_stream as rs
from residual_stream.errors import EmptyTextError, InputError
from residual_stream.inputs import Batch, ByteTokenizer, pack
from residual_stream.streaming import Corpus, ScanResult, corpus_batches, row_batches
from residual_stream.streaming.accumulators import BIN_WIDTH, histogram_quantile, log_histogram
from residual_stream.streaming.corpus import builtin_corpus
from residual_stream.streaming.tokenize import Splitter
from residual_stream.trace import trace_batch

REL_MEAN = 1e-5
REL_ORDER = 1e-6  # the same float32 values summed in other batches (float64 sums)
KL_ATOL = 1e-6  # nats: float32 log-softmax over a vocabulary rounds ~1e-7 per token
TEXTS = [
    "Residual streams grow with depth.", "Zebras Zigzag.", "The norm is frozen per token, so the "
    "map is affine and every state is an exact sum.", "a", "Attention reads; the MLP writes back.",
    "Pre-norm keeps the stream; post-norm rescales it at every block.", "Zz", "print('hello')",
    "DeepNorm scales the residual by alpha.", "for i in range(10): total += i",
]
ALL = ["growth", "survival", "read_attribution", "subspaces", "lens", "composition"]


@pytest.fixture(scope="module")
def model() -> rs.Model:
    m = rs.twin(norm="layernorm", placement="pre", n_layers=3, d_model=32, n_heads=4, seed=3,
                n_ctx=64)
    with torch.no_grad():  # a planted massive activation on every "Z"
        m.module.embed.weight[ord("Z"), 5] = 4000.0
    return m


def _rows(model, corpus, **kw) -> list[list[int]]:
    rows = []
    for batch in corpus_batches(model, Corpus(corpus), **kw):
        rows += [r[m.bool()].tolist() for r, m in zip(batch.tokens, batch.attention_mask, strict=True)]
    return rows


def _whole(model, corpus, **kw):
    """One trace of every row a scan reads, in corpus order, each row's text and start kept."""
    corpus = corpus if isinstance(corpus, Corpus) else Corpus(corpus)
    parts = list(row_batches(model, corpus, **kw))
    return trace_batch(model, pack(model, [r for b in parts for r in b.rows],
                                   tuple(t for b in parts for t in b.text_index),
                                   tuple(s for b in parts for s in b.text_start),
                                   text_char=tuple(c for b in parts for c in b.text_char)))


def _close(a: torch.Tensor, b: torch.Tensor, rel: float = REL_MEAN, atol: float = 0.0) -> None:
    a, b = a.double(), b.double()
    assert a.shape == b.shape and torch.equal(a.isnan(), b.isnan())
    if b.numel() == 0:
        return
    scale = b.nan_to_num().abs().max().clamp_min(1e-12)
    assert float((a - b).nan_to_num().abs().max()) <= rel * float(scale) + atol


@pytest.fixture(scope="module")
def scanned(model):
    kw = dict(batch_size=3, seq_len=24)
    result = rs.scan(model, TEXTS, ALL, progress=False, **kw)
    whole = _whole(model, TEXTS, **kw)
    return result, whole


def test_rows_batches_and_token_budget(model):
    rows = _rows(model, TEXTS, batch_size=3, seq_len=24, order="text")
    assert all(len(r) <= 24 for r in rows)
    assert sum(map(len, rows)) == sum(len(t.encode()) + 1 for t in TEXTS)  # bytes + BOS
    assert sorted(_rows(model, TEXTS, batch_size=3, seq_len=24)) == sorted(rows)  # by length
    cut = _rows(model, TEXTS, batch_size=3, seq_len=24, max_tokens=50, order="text")
    assert sum(map(len, cut)) == 50 and cut[:-1] == rows[: len(cut) - 1]


def _assert_growth_equal(result, whole) -> None:
    got, ref = result.stats["growth"], rs.norm_growth(whole)
    for field in ("mean", "first_token", "per_position", "growth", "update_attn", "update_mlp",
                  "ones_share"):
        _close(getattr(got, field), getattr(ref, field))
    for q in ("median", "p5", "p95"):  # a quantile of 0 (a zeroed embedding) must read 0 exactly
        assert bool(((getattr(got, q) - getattr(ref, q)).abs() <= BIN_WIDTH * getattr(ref, q)).all())
    assert got.fit_rate == pytest.approx(ref.fit_rate, abs=1e-6)  # log units per layer
    assert list(got.norm_inputs.norm) == list(ref.norm_inputs.norm)
    assert list(got.norm_inputs.kind) == list(ref.norm_inputs.kind)
    for col in ("input_norm", "scale"):
        _close(torch.tensor(got.norm_inputs[col].to_numpy(float)),
               torch.tensor(ref.norm_inputs[col].to_numpy(float)))
    named = ref.massive.assign(  # the trace's row and position → the corpus's text and position
        text=[whole.batch.text_index[b] for b in ref.massive.batch],
        char=[whole.batch.text_char[b] for b in ref.massive.batch],
        pos=[whole.batch.text_start[b] + t for b, t in zip(ref.massive.batch, ref.massive.pos,
                                                           strict=True)])
    key = ["point", "text", "char", "pos", "dim"]
    a = got.massive.sort_values(key).reset_index(drop=True)
    b = named.sort_values(key).reset_index(drop=True)
    assert a[key + ["token"]].to_dict("records") == b[key + ["token"]].to_dict("records")
    assert int(result.accumulators["growth"].sums["massive_found"]) == len(ref.massive)


def test_both_batch_orders_give_the_same_sums(model, scanned):
    """Corpus order against rows sorted by length (``scanned``): other batches, the same
    tokens, so every accumulated sum agrees to float32 rounding (``REL_ORDER`` of its largest
    entry; the lens's KL sums within ``KL_ATOL`` nats a token) and every count exactly, the
    lens's sums over whole texts included. One depends on the batches by definition:
    ``subspaces``' PCA energy (its PCA is fixed from the scan's first batch)."""
    by_length = scanned[0]
    kw = dict(batch_size=3, seq_len=24)
    by_text = rs.scan(model, TEXTS, ALL, progress=False, order="text", **kw)
    assert by_text.tokens == by_length.tokens and by_text.batches == by_length.batches
    assert _rows(model, TEXTS, order="text", **kw) != _rows(model, TEXTS, **kw)  # other batches
    compared = 0
    for name, acc in by_length.accumulators.items():
        other = by_text.accumulators[name]
        assert acc.sums.keys() == other.sums.keys(), name
        for key, x in acc.sums.items():
            if (name, key) == ("subspaces", "named"):
                continue
            y = other.sums[key]
            if x.is_floating_point():
                scale = float(x.double().nan_to_num().abs().max())
                # a KL off by δ = KL_ATOL a token: Σ δ over tokens, Σ_t n_t δ n_t, Σ_t 2 S_t n_t δ
                sums = acc.sums if name == "lens" else {}
                atol = KL_ATOL * float({"kl": sums.get("n", 0), "kl_sq": sums.get("n", 0),
                                        "text_kl_n": sums.get("text_n_sq", 0),
                                        "text_kl_sq": 2 * sums.get("text_kl_n", torch.zeros(1)).max(),
                                        }.get(key, 0))
                assert float((x.double() - y.double()).nan_to_num().abs().max()) <= REL_ORDER * scale + atol
                assert torch.equal(x.isnan(), y.isnan()), (name, key)
            else:
                assert torch.equal(x, y), (name, key)
            compared += 1
    assert compared == 37 and {"text_kl_sq", "texts"} <= by_text.accumulators["lens"].sums.keys()


def test_growth_equals_the_single_trace(scanned):
    result, whole = scanned
    assert len(rs.norm_growth(whole).massive) > 0  # the planted "Z"s
    _assert_growth_equal(result, whole)
    # the second moment: population std of each point's norms over the tokens the mean counts
    rest = whole.attention_mask.bool().clone()
    rest[:, 0] = False
    _close(result.accumulators["growth"].std(), _counted_std(whole, rest), rel=1e-4)


def _counted_std(whole, counted: torch.Tensor) -> torch.Tensor:
    return torch.stack([whole.stream(L).norm(dim=-1)[counted].double().std(correction=0)
                        for L in range(whole.anatomy.n_layers + 1)])


@pytest.mark.parametrize("seq_len", [8, 1])
def test_growth_counts_first_tokens_only_when_no_row_has_a_second(model, seq_len):
    """The analysis leaves each row's first token out of the mean and quantiles unless no row
    of the whole trace has a second. At ``seq_len`` 8 the rows sorted by length end in a
    batch of one-token tails, which still leaves them out; at 1 every row is one token."""
    texts = ["Residual streams", "Zebras Zigzag...", "Attention reads.", "MLPs write back!"]
    assert {len(t) for t in texts} == {16}  # 17 ids with BOS: rows of 8, 8 and 1 at seq_len 8
    kw = dict(batch_size=2, seq_len=seq_len)
    assert {len(r) for r in list(row_batches(model, Corpus(texts), **kw))[-1].rows} == {1}
    result, whole = rs.scan(model, texts, ["growth"], progress=False, **kw), _whole(model, texts, **kw)
    _assert_growth_equal(result, whole)
    counted = whole.attention_mask.bool().clone()
    counted[:, 0] = seq_len == 1
    assert int(counted.sum()) == (4 * 17 if seq_len == 1 else 4 * (17 - 3))
    _close(result.accumulators["growth"].std(), _counted_std(whole, counted), rel=1e-4)


LEAN_CASES = [("layernorm", "pre"), ("layernorm", "post"), ("rmsnorm", "sandwich"),
              ("layernorm", "deepnorm"), ("rmsnorm", "parallel"), ("none", "pre")]


LEAN = ["growth", "survival", "read_attribution", "subspaces", "lens", "composition"]
SUBSPACE_FIELDS = ("named", "head_overlap", "read_fraction", "read_strength")
STATS_RESUMED = ["growth", "survival", "subspaces"]


def _subspaces_reference(model, whole, **kw):
    """``write_subspaces`` on one trace of every row, PCs from the first batch (as a scan fixes)."""
    first = next(corpus_batches(model, Corpus(TEXTS), **kw))
    return rs.write_subspaces(whole, pca_trace=trace_batch(model, first))


def _assert_subspaces_equal(result, ref) -> None:
    w = result.stats["subspaces"]
    assert (w.writes, w.subspaces, w.heads, w.readers) == (ref.writes, ref.subspaces, ref.heads,
                                                           ref.readers)
    for field in SUBSPACE_FIELDS:
        _close(getattr(w, field), getattr(ref, field))


def _assert_flow_equal(result, whole) -> None:
    """Survival and read attribution of a scan against the replay analyses on one trace."""
    s, ref = result.stats["survival"], rs.survival(whole)
    assert s.sources == ref.sources
    for field in ("norm", "share", "retention", "born_norm"):
        _close(getattr(s, field), getattr(ref, field))
    r, ref = result.stats["read_attribution"], rs.read_attribution(whole)
    assert (r.readers, r.sources) == (ref.readers, ref.sources)
    _close(r.share, ref.share)
    _close(r.abs_share, ref.abs_share)


def _assert_lens_equal(result, whole) -> None:
    lens, ref = result.stats["lens"], rs.logit_lens(whole).summary()
    _close(torch.tensor(lens.kl.values), torch.tensor(ref.kl.values), atol=KL_ATOL)
    _close(torch.tensor(lens.top1_agreement.values), torch.tensor(ref.top1_agreement.values))
    assert list(lens.median_rank) == list(ref.median_rank)
    assert set(lens.tokens) == {int(whole.attention_mask.sum())}


def _splitmix64_ref(x: int) -> int:
    """SplitMix64's output function in Python integers (the reference for ``sampling.sampled``)."""
    mask = (1 << 64) - 1
    z = (x + 0x9E3779B97F4A7C15) & mask
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & mask
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & mask
    return z ^ (z >> 31)


def _chosen(batch, every: int) -> torch.Tensor:
    """``[batch, pos]``: the real tokens whose (text, position in text) hash is a multiple of ``every``."""
    out = torch.zeros(batch.attention_mask.shape, dtype=torch.bool)
    for r, (text, start) in enumerate(zip(batch.text_index, batch.text_start, strict=True)):
        for j in range(int(batch.attention_mask[r].sum())):  # right-padded rows
            out[r, j] = _splitmix64_ref((text << 32) + start + j) % every == 0
    return out


def _assert_text_clustered_se(lens, whole, every: int, corpus=None, **kw) -> None:
    """``kl_se_texts`` against ``√(C/(C−1) Σ_c (S_c − m n_c)²) / N`` computed directly, a
    cluster being a text's reduced tokens in every batch: some text's rows lie in two
    batches of the scan (``row_batches`` with ``kw``), and count as one text."""
    parts = list(row_batches(whole.model, corpus or Corpus(TEXTS), **kw))
    batches_of: dict[int, set[int]] = {}
    for i, b in enumerate(parts):
        for t in b.text_index:
            batches_of.setdefault(t, set()).add(i)
    assert max(map(len, batches_of.values())) > 1
    rows = list(zip(whole.batch.text_index, whole.batch.text_char, strict=True))  # a text's part
    ids = {key: i for i, key in enumerate(dict.fromkeys(rows))}
    chosen = _chosen(whole.batch, every)
    kl = rs.logit_lens(whole).kl.double()                                      # [point, row, pos]
    S = torch.zeros(kl.shape[0], len(ids), dtype=torch.float64)
    n = torch.zeros(len(ids), dtype=torch.float64)
    for r, key in enumerate(rows):
        S[:, ids[key]] += kl[:, r][:, chosen[r]].sum(-1)
        n[ids[key]] += chosen[r].sum()
    S, n = S[:, n > 0], n[n > 0]
    C, N = len(n), n.sum()
    m = S.sum(-1) / N
    ref = (C / (C - 1) * (S - m[:, None] * n).square().sum(-1)).sqrt() / N
    assert set(lens.texts) == {C} and C > 3
    _close(torch.tensor(lens.kl_se_texts.values), ref, rel=1e-4, atol=KL_ATOL)


def _assert_sampled_lens_equal(result, whole, every: int) -> None:
    """The lens on one token in ``every`` equals the analysis's per-token values on those tokens."""
    lens, ref = result.stats[f"lens:every={every}"], rs.logit_lens(whole)
    chosen = _chosen(whole.batch, every)
    n = int(chosen.sum())
    assert 0 < n < int(whole.attention_mask.sum()) and set(lens.tokens) == {n}
    kl = ref.kl[:, chosen].double()  # [point, n]
    _close(torch.tensor(lens.kl.values), kl.mean(-1), atol=KL_ATOL)
    _close(torch.tensor(lens.kl_se.values), kl.std(-1) / n ** 0.5, rel=1e-4, atol=KL_ATOL)
    _close(torch.tensor(lens.top1_agreement.values), ref.top1_agree[:, chosen].double().mean(-1))
    assert list(lens.median_rank) == [float(r.float().median()) for r in ref.final_token_rank[:, chosen]]


@pytest.mark.parametrize("norm,placement", LEAN_CASES)
def test_lean_scan_equals_the_single_trace(norm, placement, monkeypatch):
    """Every statistic takes the lean pass, calibration included (no trace is ever built)."""
    m = rs.twin(norm=norm, placement=placement, n_layers=3, d_model=32, seed=1, n_ctx=64)
    with torch.no_grad():
        m.module.embed.weight[ord("Z"), 5] = 4000.0
    kw = dict(batch_size=3, seq_len=24)
    whole = _whole(m, TEXTS, **kw)
    subspaces = _subspaces_reference(m, whole, **kw)
    monkeypatch.setattr("residual_stream.streaming.adding.trace_batch", None)  # no full trace
    monkeypatch.setattr("residual_stream.streaming.lens.MIN_CHUNK", 16)  # 72 tokens: 5 chunks
    # read measures over 7-token chunks of a batch's 72 (padding inside chunks, a partial one)
    monkeypatch.setattr("residual_stream.analyses.subspace_measures.CHUNK_ELEMENTS", 7 * 6 * 12 * 8)
    result = rs.scan(m, TEXTS, LEAN + ["lens:every=2"], progress=False, **kw)
    _assert_growth_equal(result, whole)
    _assert_flow_equal(result, whole)
    _assert_lens_equal(result, whole)
    _assert_sampled_lens_equal(result, whole, 2)
    _assert_text_clustered_se(result.stats["lens"], whole, 1, **kw)
    _assert_text_clustered_se(result.stats["lens:every=2"], whole, 2, **kw)
    _assert_subspaces_equal(result, subspaces)


@pytest.mark.parametrize("name", ["deepseek_v3", "deepseek_v32", "minicpm3", "mistral4"])
def test_a_scan_of_latent_attention_runs_what_needs_no_reads_and_refuses_the_rest(name, monkeypatch):
    """DeepSeek's multi-head latent attention has no linear reads: a scan of growth and the lens
    equals the concatenated trace's; one asking for read attribution refuses by name (V3.2's
    keys chosen by its indexer; MiniCPM3's write and logit multipliers)."""
    from tiny_hf import build

    from residual_stream.inputs import ByteTokenizer

    m = rs.load(build(name), tokenizer=ByteTokenizer())
    kw = dict(batch_size=4, seq_len=32)
    whole = _whole(m, TEXTS, **kw)
    monkeypatch.setattr("residual_stream.streaming.adding.trace_batch", None)
    result = rs.scan(m, TEXTS, ["growth", "lens"], progress=False, **kw)
    _assert_growth_equal(result, whole)
    _assert_lens_equal(result, whole)
    with pytest.raises(rs.errors.NotAvailableError, match="multi-head latent attention"):
        rs.scan(m, TEXTS, ["growth", "read_attribution"], progress=False, **kw)


@pytest.mark.parametrize("name", ["llama", "gpt2", "bert", "bert_mlm", "gemma2", "gpt_neox_parallel",
                                  "qwen3", "mixtral", "phi3", "gptj", "granite", "bloom", "falcon", "opt",
                                  "opt_post", "openai-gpt", "biogpt", "codegen", "hunyuan_v1_dense",
                                  "dbrx", "roberta-prelayernorm_mlm", "megatron-bert_mlm", "ernie_mlm",
                                  "roformer_mlm", "big_bird_mlm",
                                  "hyperclovax", "mellum", "kolibri1", "cohere2_moe",
                                  "nanochat", "gemma3", "mistral3", "modernbert-decoder_causal",
                                  "esm_mlm", "esm_mlm_absolute", "llama4_text", "llava", "smolvlm",
                                  "minimax_m2", "qwen3_vl_moe", "gemma4_text", "gemma4", "gemma4_moe",
                                  "aya_vision", "ernie4_5_vl_moe", "hunyuan_vl", "molmo2_olmo",
                                  "granite_docling", "cosmos3_edge", "gemma4_unified", "persimmon",
                                  "esmc_mlm", "rembert_mlm", "t5", "umt5",
                                  "clip_text_model", "siglip_text_model", "bart", "t5gemma", "tapas_mlm",
                                  "lilt", "flava", "tipsv2", "t5gemma2", "nllb_moe"])
def test_lean_scan_on_framework_models(name, monkeypatch):
    from tiny_hf import build

    from residual_stream.inputs import ByteTokenizer

    m = rs.load(build(name), tokenizer=ByteTokenizer())
    kw = dict(batch_size=4, seq_len=32)
    whole = _whole(m, TEXTS, **kw)
    subspaces = _subspaces_reference(m, whole, **kw)
    monkeypatch.setattr("residual_stream.streaming.adding.trace_batch", None)
    if not m.anatomy.has_lm_head:  # the tiny BERT is a BertModel: no logits, no lens
        with pytest.raises(rs.errors.NotAvailableError, match="no LM head"):
            rs.scan(m, TEXTS, LEAN, progress=False, **kw)
    stats = LEAN + ["lens:every=3"] if m.anatomy.has_lm_head else [s for s in LEAN if s != "lens"]
    result = rs.scan(m, TEXTS, stats, progress=False, **kw)
    _assert_growth_equal(result, whole)
    _assert_flow_equal(result, whole)
    _assert_subspaces_equal(result, subspaces)
    if m.anatomy.has_lm_head:
        _assert_lens_equal(result, whole)
        _assert_sampled_lens_equal(result, whole, 3)
        _assert_text_clustered_se(result.stats["lens:every=3"], whole, 3, **kw)


def test_per_head_flow_statistics_replay_the_trace(model):
    """Per-head granularity is not lean: it runs the replay analysis batch by batch."""
    from residual_stream.streaming.accumulators import ReadAttributionStats, SurvivalStats

    kw = dict(batch_size=3, seq_len=24)
    whole = _whole(model, TEXTS, **kw)
    surv, read = SurvivalStats("head"), ReadAttributionStats("head")
    assert not surv.lean and not read.lean
    for batch in corpus_batches(model, Corpus(TEXTS), **kw):
        t = trace_batch(model, batch)
        surv.update(t)
        read.update(t)
    s, ref = surv.result(), rs.survival(whole, granularity="head")
    assert s.sources == ref.sources and any("H" in x for x in s.sources)
    _close(s.share, ref.share)
    r, ref = read.result(), rs.read_attribution(whole, granularity="head")
    assert r.sources == ref.sources
    _close(r.share, ref.share)


# growth offers the coordinate sums the check reads (``coordinate_sums``); the others do not
@pytest.mark.parametrize("stats", [["growth"], ["survival"], ["survival", "growth"]])
@pytest.mark.parametrize("bad", [float("nan"), float("inf")])
def test_lean_pass_refuses_nan_and_names_the_point(stats, bad):
    m = rs.twin(norm="rmsnorm", placement="pre", n_layers=3, d_model=32, seed=1)
    with torch.no_grad():
        m.module.blocks[1].mlp.fc_out.weight[0, 0] = bad
    with pytest.raises(rs.errors.NonFiniteError, match="block 2"):
        rs.scan(m, TEXTS, stats, progress=False)


def test_flow_subspaces_lens_and_composition_equal_the_single_trace(scanned, model):
    result, whole = scanned
    _assert_flow_equal(result, whole)
    _assert_subspaces_equal(result, _subspaces_reference(model, whole, batch_size=3, seq_len=24))
    _assert_lens_equal(result, whole)
    _close(result.stats["composition"].head_to_head, rs.composition(model).head_to_head)
    assert result.tokens == int(whole.attention_mask.sum())
    json.dumps(result.to_dict())  # every statistic serializes


def test_a_statistic_without_a_reducer_feeds_the_others_from_the_batch_trace(model, monkeypatch):
    """With per-head flow in the mix the batch is traced once; the lean statistics' reducers
    are fed from that trace's walk and give what the lean pass gives."""
    from residual_stream.streaming import make_accumulators
    from residual_stream.streaming.accumulators import SurvivalStats
    from residual_stream.streaming.adding import add_batch as _add_batch

    kw = dict(batch_size=3, seq_len=24)
    whole = _whole(model, TEXTS, **kw)
    batches = list(corpus_batches(model, Corpus(TEXTS), **kw))
    accs = make_accumulators(LEAN)
    accs["head_survival"] = SurvivalStats("head")
    calibration = trace_batch(model, batches[0])
    for acc in accs.values():
        acc.prepare(model, calibration)
    monkeypatch.setattr("residual_stream.streaming.adding.lean_pass", None)  # never lean
    for batch in batches:
        _add_batch(model, batch, accs)
    result = ScanResult({n: a.result() for n, a in accs.items()}, 0, 0, 0.0, model.name, accs)
    _assert_growth_equal(result, whole)
    _assert_flow_equal(result, whole)
    _assert_lens_equal(result, whole)
    _assert_subspaces_equal(result, _subspaces_reference(model, whole, **kw))
    _close(result.stats["head_survival"].share, rs.survival(whole, granularity="head").share)


def test_corpus_sources_read_the_same_texts(tmp_path):
    from residual_stream.streaming.corpus import builtin_corpus

    shipped = list(Corpus("builtin").texts())
    assert shipped == builtin_corpus() and not any(t.startswith("#") for t in shipped)
    assert len(shipped) == 320  # 220 sentences + 100 code lines, the header comment left out
    (tmp_path / "a.txt").write_text("  first text \n\n second\n")
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "b.txt").write_text("third\n")
    assert list(Corpus(tmp_path / "a.txt").texts()) == ["first text", "second"]
    assert list(Corpus(tmp_path).texts()) == ["first text", "second", "third"]
    (tmp_path / "empty").mkdir()
    assert list(Corpus(tmp_path / "empty").texts()) == []  # empty: the scan and report say so
    with pytest.raises(InputError, match="not 'builtin'"):
        list(Corpus(tmp_path / "missing.txt").texts())


def test_histogram_quantiles_are_within_one_bin():
    g = torch.Generator().manual_seed(0)
    values = torch.exp(torch.randn(3, 5000, generator=g) * 2.0)
    counts = log_histogram(values)
    for q in (0.05, 0.5, 0.95):
        exact = torch.quantile(values.double(), q, dim=-1)
        assert float(((histogram_quantile(counts, q) - exact).abs() / exact).max()) <= BIN_WIDTH


def test_histogram_quantiles_read_zero_norms_as_zero():
    """Exact zeros (ESM-2's token dropout zeroes a mask token's embedding) have a bin of their
    own: a quantile whose order statistics are zeros is 0, one interpolating between a zero and a
    positive value is that fraction of the value (within one bin), and tiny positive norms are
    still clamped into the first log bin, not counted as zeros."""
    g = torch.Generator().manual_seed(1)
    values = torch.exp(torch.randn(2, 1000, generator=g))
    values[0, :100] = 0.0                     # 10 % zeros: p5 is 0, the median is not
    values[1, :1] = 0.0                       # one zero: p5 positive
    counts = log_histogram(values)
    assert counts[:, 0].tolist() == [100, 1]
    assert counts.sum(-1).tolist() == [1000, 1000]
    for q in (0.05, 0.0999, 0.5, 0.95):
        exact = torch.quantile(values.double(), q, dim=-1)
        got = histogram_quantile(counts, q).double()
        assert bool(((got - exact).abs() <= BIN_WIDTH * exact + 1e-12).all()), (q, got, exact)
    assert float(histogram_quantile(counts, 0.05)[0]) == 0.0
    tiny = log_histogram(torch.tensor([[1e-9, 2e-9]]))
    assert int(tiny[0, 0]) == 0 and int(tiny[0, 1]) == 2


def test_histogram_counts_match_numpy_and_weights_select_values():
    """Against ``numpy.histogram`` on the same edges; 0/1 weights count only the selected values
    (as growth's ``hist`` leaves out each row's first token), and counts are exact integers."""
    from residual_stream.streaming.base import _EDGES, LOG_BINS

    g = torch.Generator().manual_seed(2)
    values = torch.exp(torch.randn(2, 3000, generator=g, dtype=torch.float64) * 3.0)
    values[0, :7] = 0.0
    keep = torch.rand(3000, generator=g) < 0.6
    counts = log_histogram(values, weights=keep)
    assert counts.dtype == torch.int64 and counts.shape == (2, LOG_BINS + 1)
    for row in range(2):
        v = values[row][keep].numpy()
        pos = np.clip(v[v > 0], float(_EDGES[0]), float(_EDGES[-1]))  # the end bins take the rest
        ref, _ = np.histogram(pos, bins=_EDGES.numpy())
        assert int(counts[row, 0]) == int((v <= 0).sum())
        assert counts[row, 1:].tolist() == ref.tolist()


def test_host_lists_read_every_tensor_back_at_once_exactly():
    from residual_stream.streaming.base import host_lists

    tensors = [torch.tensor([3, 0]), torch.tensor([[7, 2**40], [5, 1]]),
               torch.tensor([[1.5e30, -2.0**-20], [0.1, 3.0]], dtype=torch.float32),
               torch.zeros(2, 0, dtype=torch.long)]                    # top_k=0: no rows kept
    got = host_lists(tensors)
    assert got == [t.tolist() for t in tensors]
    assert all(type(v) is int for v in got[1][0]) and got[3] == [[], []]


def test_memory_does_not_grow_with_the_corpus(model):
    kw = dict(batch_size=4, seq_len=16, progress=False)
    small = rs.scan(model, TEXTS * 2, ["growth", "survival", "lens"], max_tokens=300, **kw)
    big = rs.scan(model, TEXTS * 20, ["growth", "survival", "lens"], max_tokens=3000, **kw)
    assert big.tokens == 10 * small.tokens
    for name, acc in big.accumulators.items():  # every sum has the same size at 10× the tokens
        assert {k: v.shape for k, v in acc.sums.items()} == \
            {k: v.shape for k, v in small.accumulators[name].sums.items()}


def test_massive_prefilter_keeps_exactly_the_tokens_that_can_hit():
    """Hand example at the thresholds: |x| > 100 and > 1000 × the token's (lower) median |x|."""
    from residual_stream.streaming.growth import GrowthSums

    base = [0.1, 0.1, 0.2, 0.2, 0.2, 0.3, 0.3]                 # lower median of 8 values: 0.2
    x = torch.tensor([[base + [201.0],                           # 201 > 200: a hit
                       base + [199.0],                           # over 100, under 1000 × 0.2
                       [150.0] * 8,                              # every coordinate over 100
                       [-0.1] * 7 + [-250.0]]])                  # median |x| 0.1: a hit, negative
    mask = torch.ones(1, 4, dtype=torch.long)
    batch = Batch(mask, mask, [list("abcd")], text_index=(7,), text_start=(100,))  # text 7, from 100
    sums = GrowthSums(mask.bool(), 0, 8, batch, top_k=10)
    sums.point(0, x)
    found, rows = sums.massive_rows()
    assert found == 2
    assert sorted((r["text"], r["pos"], r["dim"], r["value"], r["token"]) for r in rows) == \
        [(7, 100, 7, 201.0, "a"), (7, 103, 7, -250.0, "d")]


def test_massive_activations_keep_the_top_k_by_magnitude(model):
    from residual_stream.streaming.accumulators import GrowthStats

    acc = GrowthStats(top_k=5)
    found = []
    for batch in corpus_batches(model, Corpus(TEXTS * 3), batch_size=2, seq_len=16):
        t = trace_batch(model, batch)
        acc.update(t)
        found += rs.norm_growth(t).massive.value.abs().tolist()
    assert len(found) > 5 and int(acc.sums["massive_found"]) == len(found)
    kept = sorted(abs(r["value"]) for r in acc.meta["massive"])
    assert kept == sorted(found)[-5:]


class Interrupt(Exception):
    pass


@pytest.mark.parametrize("save_every", [1, 2])
def test_an_interrupted_scan_resumes_without_losing_or_double_counting(model, tmp_path, save_every,
                                                                       monkeypatch):
    from residual_stream.streaming import runner

    kw = dict(batch_size=2, seq_len=16, progress=False, save_every=save_every)
    whole = rs.scan(model, TEXTS, STATS_RESUMED, **kw)
    state = tmp_path / "scan.pt"

    def stop_after_3(key: tuple[int, int], tokens: int) -> None:
        if key == (0, 2):  # three batches added; with save_every=2 the third is not saved yet
            raise Interrupt

    with pytest.raises(Interrupt):
        rs.scan(model, TEXTS, STATS_RESUMED, state=state, on_batch=stop_after_3, **kw)
    saved = torch.load(state, weights_only=True)
    assert saved["next"] == [0, 3 if save_every == 1 else 2]
    seen: list[list[int]] = []
    calibrations = []
    points = runner.points
    monkeypatch.setattr(runner, "points", lambda *a: calibrations.append(1) or points(*a))
    resumed = rs.scan(model, TEXTS, STATS_RESUMED, state=state,
                      on_batch=lambda key, t: seen.append(list(key)), **kw)
    assert not calibrations  # the saved state holds the PCA: no calibration pass again
    assert seen[0] == saved["next"]  # continues where the saved sums end
    assert resumed.tokens == whole.tokens and resumed.batches == whole.batches
    for key, value in whole.accumulators["growth"].sums.items():
        _close(resumed.accumulators["growth"].sums[key], value, rel=1e-12)
    _close(resumed.stats["survival"].retention, whole.stats["survival"].retention, rel=1e-12)
    for field in SUBSPACE_FIELDS:  # its calibration (the PCA) came back with the saved state
        _close(getattr(resumed.stats["subspaces"], field), getattr(whole.stats["subspaces"], field),
               rel=1e-12)
    again = rs.scan(model, TEXTS, STATS_RESUMED, state=state, **kw)  # already complete
    assert again.tokens == whole.tokens and again.batches == whole.batches
    # the rate is this run's: none scanned (it was the total over this run's instant)
    assert again.resumed_tokens == whole.tokens and again.tokens_per_second == 0.0
    ran = sum(1 for _ in seen)  # the resumed run's batches, its tokens counted by hand
    assert ran == whole.batches - saved["next"][1] and resumed.resumed_tokens == saved["tokens"]
    assert resumed.tokens_per_second == pytest.approx(
        (whole.tokens - saved["tokens"]) / resumed.seconds)


def test_sums_restored_on_the_cpu_follow_the_next_batch_to_its_device(model):
    """A scan resumed on a GPU adds there: its restored (CPU) sums move to the batch's device.

    "meta" stands in for the accelerator: before, each batch's sums were copied to the CPU
    (a host sync per sum per batch, and on "meta" a copy that cannot be made).
    """
    acc = rs.scan(model, TEXTS[:3], ["growth"], batch_size=2, seq_len=16,
                  progress=False).accumulators["growth"]
    resumed = acc.empty_like()
    resumed.load_state_dict(acc.state_dict())
    key, value = next((k, v) for k, v in resumed.sums.items() if v.is_floating_point())
    assert value.device.type == "cpu"
    resumed.add(key, torch.ones_like(value, device="meta"))
    assert resumed.sums[key].device.type == "meta" and resumed.sums[key].shape == value.shape
    resumed.add(key, value)  # a CPU value (a merged part) goes to where the sum now is
    assert resumed.sums[key].device.type == "meta"
    assert all(v.device.type == "cpu" for k, v in resumed.sums.items() if k != key)


@pytest.mark.parametrize(("seconds", "every"), [(60.0, 3), (0.0, 1)])
def test_the_state_is_saved_by_time_unless_save_every_is_given(model, tmp_path, monkeypatch,
                                                               seconds, every):
    """By default a state is saved after the first batch ending ``save_seconds`` after the last
    save, and at the end; ``save_seconds=0`` saves after every batch. The clock is stepped by
    hand, 25 s a call (one at the start, one per batch): against 60 s the saves fall after
    batches 3, 6, 9 ..."""
    from residual_stream.streaming import runner

    kw = dict(batch_size=1, seq_len=16)
    n_batches = len(list(row_batches(model, Corpus(TEXTS), **kw)))
    assert n_batches >= 7
    ticks = iter(range(0, 10_000, 25))
    monkeypatch.setattr(runner, "_clock", lambda: float(next(ticks)))
    state = tmp_path / "scan.pt"
    saved: list[list[int] | None] = []

    def look(key: tuple[int, int], tokens: int) -> None:
        saved.append(torch.load(state, weights_only=True)["next"] if state.exists() else None)

    result = rs.scan(model, TEXTS, "growth", state=state, save_seconds=seconds, on_batch=look,
                     progress=False, **kw)
    assert saved == [[0, every * (run // every)] if run >= every else None
                     for run in range(1, n_batches + 1)]
    assert torch.load(state, weights_only=True)["next"] == [0, result.batches]  # saved at the end


@pytest.mark.parametrize("bad", [dict(save_every=0), dict(save_every=-2), dict(save_every=True),
                                 dict(save_seconds=-1.0), dict(save_seconds=float("nan")),
                                 dict(save_seconds=float("inf"))])
def test_bad_save_settings_are_refused_before_a_state_exists(model, tmp_path, bad):
    state = tmp_path / "scan.pt"
    with pytest.raises(InputError, match="save_every|save_seconds"):
        rs.scan(model, TEXTS, "growth", state=state, progress=False, **bad)
    assert not state.exists()


class Silent(ByteTokenizer):
    """Gives no ids for any text, as a tokenizer might for texts it cannot read."""

    def __call__(self, text, add_special_tokens=True, **kw):
        """No ids: ``[]`` per text."""
        return {"input_ids": [[] for _ in text] if isinstance(text, list) else []}


@pytest.mark.parametrize("stats", [["growth"], ["subspaces"]])  # without and with a calibration
def test_a_corpus_that_tokenizes_to_nothing_is_refused_before_a_state_exists(stats, tmp_path):
    m = rs.twin(norm="rmsnorm", placement="pre", n_layers=1, d_model=16, n_heads=2, n_ctx=32)
    m.tokenizer = Silent()
    with pytest.raises(EmptyTextError, match="tokenize to nothing"):
        rs.scan(m, TEXTS, stats, state=tmp_path / "s.pt", progress=False)
    assert not (tmp_path / "s.pt").exists()


def test_the_scans_first_check_reads_one_tokenizer_call_unless_it_calibrates(model, monkeypatch):
    """Refusing an empty corpus needs one row; only a calibration (``subspaces``' PCA) needs
    the scan's first batch, which in length order is sorted from a window of 32 batches."""
    from residual_stream.streaming import make_accumulators, runner, tokenize

    monkeypatch.setattr(tokenize, "TOKENIZE_CHARS", 40)  # one or two texts a call
    corpus = Corpus(TEXTS * 20)
    read: list[int] = []
    tokenizer = model.tokenizer
    monkeypatch.setattr(model, "tokenizer", lambda texts, **k: read.append(len(texts)) or
                        tokenizer(texts, **k))
    runner._prepare(model, corpus, make_accumulators(["growth"]), 2, 16, None, "length")
    assert len(read) == 1 and read[0] <= 2
    read.clear()
    runner._prepare(model, corpus, make_accumulators(["subspaces"]), 2, 16, None, "length")
    rows = sum(len(b.rows) for b in row_batches(model, Corpus((TEXTS * 20)[:sum(read)]),
                                               batch_size=2, seq_len=16, order="text"))
    assert len(read) > 5 and rows >= 32 * 2  # the texts read hold the window's 64 rows


def _stop_in_segment(segment: int):
    """An ``on_batch`` that interrupts the scan in ``segment``."""
    def stop(key: tuple[int, int], tokens: int) -> None:
        if key[0] == segment:
            raise Interrupt
    return stop


def _recording(model, monkeypatch) -> list[str]:
    """The corpus texts ``model``'s tokenizer is given from now on (its splitter probe made
    first; the probes a saved state's tokenizer fingerprint reads are not corpus texts)."""
    from residual_stream.streaming.tokenize import PROBE, PROBE_RARE

    tokenized: list[str] = []
    tokenize = model.tokenizer
    monkeypatch.setattr(model, "tokenizer", lambda texts, **k: tokenized.extend(
        t for t in texts if t not in (PROBE, PROBE_RARE)) or tokenize(texts, **k))
    assert Splitter.of(model.tokenizer) is not None
    tokenized.clear()
    return tokenized


def test_a_scan_over_segments_equals_the_single_trace_and_resumes_past_them(model, tmp_path,
                                                                            monkeypatch):
    """Batches end with their segment; a resumed scan tokenizes no segment it has done."""
    corpus = Corpus(TEXTS * 2, segment_chars=70)
    kw = dict(batch_size=3, seq_len=24)
    assert len(list(corpus.segments())) > 4
    result = rs.scan(model, corpus, ["growth", "survival", "read_attribution", "lens"],
                     progress=False, **kw)
    whole = _whole(model, corpus, **kw)
    _assert_growth_equal(result, whole)
    _assert_flow_equal(result, whole)
    _assert_lens_equal(result, whole)
    assert result.batches == len(list(row_batches(model, corpus, **kw)))

    state = tmp_path / "scan.pt"
    with pytest.raises(Interrupt):
        rs.scan(model, corpus, ["growth"], state=state, on_batch=_stop_in_segment(3), **kw,
                save_every=1, progress=False)
    tokenized = _recording(model, monkeypatch)
    resumed = rs.scan(model, corpus, ["growth"], state=state, progress=False, **kw)
    segments = [[s.texts[0][slice(*s.span)]] if s.span else s.texts  # a text over 70 is cut
                for s in corpus.segments(cut=lambda: True)]
    first_group = segments[0][:len(tokenized) - sum(map(len, segments[3:]))]
    assert tokenized == first_group + [t for seg in segments[3:] for t in seg]  # first batch, 3 on
    assert len(first_group) <= len(segments[0])
    assert resumed.tokens == result.tokens and resumed.batches == result.batches
    _close(resumed.stats["growth"].mean, result.stats["growth"].mean, rel=1e-12)


def test_a_scan_with_a_budget_resumes_without_tokenizing_the_segments_it_did(model, tmp_path,
                                                                             monkeypatch):
    """The saved state holds each segment's token count (``ledger``), so the budget left at a
    skipped segment is known: before, a resumed scan with ``max_tokens`` tokenized every
    segment it had done, to count them."""
    corpus = Corpus(TEXTS * 4, segment_chars=70)
    kw = dict(batch_size=3, seq_len=24, max_tokens=500)
    whole = rs.scan(model, corpus, ["growth"], progress=False, **kw)
    state = tmp_path / "scan.pt"
    with pytest.raises(Interrupt):
        rs.scan(model, corpus, ["growth"], state=state, on_batch=_stop_in_segment(4),
                save_every=1, progress=False, **kw)
    saved = torch.load(state, weights_only=True)
    segments = list(corpus.segments(cut=lambda: True))
    counts = [sum(len(model.tokenizer(t)["input_ids"]) for t in s.texts) if s.span is None
              else len(s.texts[0][slice(*s.span)].encode()) + (s.span[0] == 0) for s in segments]
    assert saved["next"][0] == 4 and saved["ledger"][:4] == counts[:4]  # counted by hand
    tokenized = _recording(model, monkeypatch)
    resumed = rs.scan(model, corpus, ["growth"], state=state, progress=False, **kw)
    last = next(i for i in range(len(counts)) if sum(counts[:i + 1]) >= 500)
    inputs = [[s.texts[0][slice(*s.span)]] if s.span else s.texts for s in segments]
    first_row = inputs[0]  # the empty-corpus check: its segment's texts, in one call
    assert last > 5 and tokenized == first_row + [t for seg in inputs[4:last + 1] for t in seg]
    assert (resumed.tokens, resumed.batches) == (whole.tokens, whole.batches) and whole.tokens == 500
    _close(resumed.stats["growth"].mean, whole.stats["growth"].mean, rel=1e-12)


def test_a_text_longer_than_a_segment_is_cut_into_parts_scanned_and_resumed_apart(
        model, tmp_path, monkeypatch):
    """A text over ``segment_chars`` is cut between words into parts, each a segment: their
    rows hold the text's ids in order (one call's), each part's counted from its first token;
    the scan equals the single trace of those rows (a massive activation named by its part's
    first character, the lens clustered by part); a resumed scan tokenizes no part it did."""
    long = " ".join(TEXTS * 4)  # 1,303 characters, three "Z"s in every part but the last
    corpus = Corpus([TEXTS[0], long, TEXTS[2]], segment_chars=300)
    kw = dict(batch_size=3, seq_len=24)
    segments = list(corpus.segments(cut=lambda: True))
    spans = [s.span for s in segments[1:-1]]
    assert [(s.first, s.span is None) for s in segments] == [(0, True), *[(1, False)] * len(spans),
                                                             (2, True)]
    assert len(spans) == 5 and "".join(long[a:b] for a, b in spans) == long
    assert all(b - a >= 300 and long[b:b + 1] in ("", " ") for a, b in spans[:-1])  # between words
    batches = list(row_batches(model, corpus, order="text", **kw))
    ids = [i for b in batches for r, t in zip(b.rows, b.text_index, strict=True) if t == 1 for i in r]
    assert ids == model.tokenizer(long)["input_ids"]  # BOS in the first part only
    assert {(b.segment, c) for b in batches for c in b.text_char} == {
        (0, 0), *((k + 1, a) for k, (a, _) in enumerate(spans)), (len(spans) + 1, 0)}
    assert [s for b in batches if b.segment == 2 for s in b.text_start] == list(
        range(0, spans[1][1] - spans[1][0], 24))  # one byte a character, no BOS

    stats = ["growth", "survival", "read_attribution", "lens"]
    result = rs.scan(model, corpus, stats, progress=False, **kw)
    whole = _whole(model, corpus, **kw)
    _assert_growth_equal(result, whole)
    assert set(result.stats["growth"].massive["char"]) == {0, *(a for a, _ in spans[:-1])}
    _assert_flow_equal(result, whole)
    _assert_lens_equal(result, whole)
    _assert_text_clustered_se(result.stats["lens"], whole, 1, corpus=corpus, **kw)

    state = tmp_path / "scan.pt"

    with pytest.raises(Interrupt):
        rs.scan(model, corpus, stats, state=state, on_batch=_stop_in_segment(3), save_every=1,
                progress=False, **kw)
    tokenized = _recording(model, monkeypatch)
    resumed = rs.scan(model, corpus, stats, state=state, progress=False, **kw)
    assert tokenized == [TEXTS[0], *(long[a:b] for a, b in spans[2:]), TEXTS[2]]  # first row, 3 on
    assert (resumed.tokens, resumed.batches) == (result.tokens, result.batches)
    _close(resumed.stats["growth"].mean, result.stats["growth"].mean, rel=1e-12)
    _close(torch.tensor(resumed.stats["lens"].kl_se_texts.values),
           torch.tensor(result.stats["lens"].kl_se_texts.values), rel=1e-9)


def test_a_scan_resumed_inside_a_segment_keeps_its_open_texts(model, tmp_path):
    """The lens's text clusters add up a text's rows until its segment ends; a state saved
    inside a segment holds those open texts, and the resumed scan's ``kl_se_texts`` equals
    the uninterrupted one's (both against the single trace, clustered by whole texts)."""
    corpus = Corpus(TEXTS * 2, segment_chars=200)
    kw = dict(batch_size=2, seq_len=16)
    keys = [b.key for b in row_batches(model, corpus, **kw)]
    stop = next(k for k in keys if k[1] == 2)  # the third batch of a segment
    assert (stop[0], 3) in keys  # the segment goes on after it
    state = tmp_path / "scan.pt"

    def stop_there(key: tuple[int, int], tokens: int) -> None:
        if key == stop:
            raise Interrupt

    with pytest.raises(Interrupt):
        rs.scan(model, corpus, ["lens"], state=state, on_batch=stop_there, progress=False,
                save_every=1, **kw)
    saved = torch.load(state, weights_only=True)["stats"]["lens"]["open_texts"]
    assert len(saved["ids"]) > 0 and saved["kl"].shape == (model.anatomy.n_layers + 1, len(saved["ids"]))
    resumed = rs.scan(model, corpus, ["lens"], state=state, progress=False, **kw)
    whole = rs.scan(model, corpus, ["lens"], progress=False, **kw)
    assert resumed.accumulators["lens"].open_texts.empty  # every segment closed at the end
    assert resumed.stats["lens"]["texts"].tolist() == whole.stats["lens"]["texts"].tolist()
    _close(torch.tensor(resumed.stats["lens"].kl_se_texts.values),
           torch.tensor(whole.stats["lens"].kl_se_texts.values), rel=1e-9)
    _assert_text_clustered_se(whole.stats["lens"], _whole(model, corpus, **kw), 1, corpus=corpus, **kw)


def test_a_state_saved_with_another_model_of_the_same_name_is_refused(tmp_path):
    """Twins of one shape share a name: their weights (and a dtype, a shape) tell them apart."""
    kw = dict(batch_size=2, seq_len=16, progress=False, state=tmp_path / "scan.pt")
    a, b = (rs.twin(norm="rmsnorm", placement="pre", n_layers=1, d_model=16, n_heads=2, n_ctx=32,
                    seed=seed) for seed in (0, 1))
    assert a.name == b.name
    rs.scan(a, TEXTS, ["growth"], **kw)
    with pytest.raises(InputError, match="other arguments.*'weights'"):
        rs.scan(b, TEXTS, ["growth"], **kw)
    wider = rs.twin(norm="rmsnorm", placement="pre", n_layers=2, d_model=32, n_heads=2, n_ctx=32)
    with pytest.raises(InputError, match="other arguments.*'shape': \\(\\[1, 16, 32\\], \\[2, 32, 32\\]\\)"):
        rs.scan(wider, TEXTS, ["growth"], **kw)
    state = kw["state"].read_bytes()
    with torch.no_grad():  # one value edited deep in a middle weight (the old sampled hash: unseen)
        a.module.get_parameter("blocks.0.attn.o_proj.weight")[-1, -1] += 0.5
    with pytest.raises(InputError, match="other arguments {'weights'"):
        rs.scan(a, TEXTS, ["growth"], **kw)
    assert kw["state"].read_bytes() == state
    with torch.no_grad():
        a.module.get_parameter("blocks.0.attn.o_proj.weight")[-1, -1] -= 0.5
    a.module.double()  # the same weights, in float64 (other bits, so another fingerprint too)
    with pytest.raises(InputError,
                       match="other arguments {'dtype': \\('torch.float32', 'torch.float64'\\), 'weights'"):
        rs.scan(a, TEXTS, ["growth"], **kw)


def test_a_numpy_array_or_a_series_of_texts_resumes_like_a_list(model, tmp_path):
    """``source == "builtin"`` compared an array element by element ("truth value of an array
    is ambiguous") once a state was asked for."""
    import numpy as np
    import pandas as pd

    want = rs.scan(model, TEXTS[:5], ["growth"], batch_size=2, seq_len=16, progress=False)
    for i, texts in enumerate((np.array(TEXTS[:5]), pd.Series(TEXTS[:5]))):
        got = rs.scan(model, texts, ["growth"], batch_size=2, seq_len=16, progress=False,
                      state=tmp_path / f"s{i}.pt")
        assert got.tokens == want.tokens and (tmp_path / f"s{i}.pt").exists()
        torch.testing.assert_close(got.stats["growth"].mean, want.stats["growth"].mean, rtol=0, atol=0)


def test_the_weights_fingerprint_sees_every_value_and_not_the_reduction_order(monkeypatch):
    """Exact checksums: a row swap (also of rows 251 apart, which a weight by position mod 251
    missed) and a one-ulp edit change the fingerprint; the same weights in another memory
    layout do not; and the sums equal a Python loop over the int16 bit patterns with chunks
    of 1,000 values (the position weight's period and its chunk multiplier both exercised)."""
    from residual_stream.streaming import state as S

    m = rs.twin(norm="rmsnorm", placement="pre", n_layers=1, d_model=16, n_heads=2, n_ctx=32, seed=3)
    before = S.weights_fingerprint(m)
    w = m.module.get_parameter("blocks.0.mlp.fc_out.weight")
    e = m.module.get_parameter("embed.weight")  # 257 rows
    with torch.no_grad():
        w[[0, 1]] = w[[1, 0]]
        swapped = S.weights_fingerprint(m)
        w[[0, 1]] = w[[1, 0]]
        assert S.weights_fingerprint(m) == before != swapped
        e[[0, 251]] = e[[251, 0]]
        assert S.weights_fingerprint(m) != before
        e[[0, 251]] = e[[251, 0]]
        w[3, 4] = torch.nextafter(w[3, 4], torch.tensor(float("inf")))
        assert S.weights_fingerprint(m) != before
    monkeypatch.setattr(S, "CHECKSUM_CHUNK", 1000)
    S._position_weights.cache_clear()
    try:
        x = torch.randn(1500, 3)
        bits = x.flatten().view(torch.int16).tolist()
        weights = S._position_weights("cpu").long().tolist()
        want = (sum(bits), sum(b * weights[i % 1000] * (i // 1000 + 1) for i, b in enumerate(bits)))
        assert S._checksum(x) == want == S._checksum(x.T.contiguous().T)
    finally:
        S._position_weights.cache_clear()


def test_a_state_for_other_arguments_or_a_corrupt_one_is_refused(model, tmp_path):
    state = tmp_path / "scan.pt"
    rs.scan(model, TEXTS, ["growth"], batch_size=2, seq_len=16, state=state, progress=False)
    before = state.read_bytes()
    with pytest.raises(InputError, match="other arguments.*batch_size"):
        rs.scan(model, TEXTS, ["growth"], batch_size=3, seq_len=16, state=state, progress=False)
    assert state.read_bytes() == before
    old = torch.load(state, weights_only=True)
    old["config"]["version"] = 1
    torch.save(old, tmp_path / "old.pt")
    with pytest.raises(InputError, match="another version.*state version 1.*delete it"):
        rs.scan(model, TEXTS, ["growth"], batch_size=2, seq_len=16, state=tmp_path / "old.pt",
                progress=False)
    bad = tmp_path / "bad.pt"
    bad.write_bytes(b"not a torch file")  # a file given by mistake (the corpus, say): kept
    with pytest.raises(InputError, match="bad.pt is not a scan state.*give --state a new file"):
        rs.scan(model, TEXTS, ["growth"], state=bad, progress=False)
    assert bad.read_bytes() == b"not a torch file"
    (tmp_path / "cut.pt").write_bytes(before[:len(before) // 2])  # a state cut short
    flipped = bytearray(before)  # one bit of a stored sum flipped: the records' CRCs see it
    with zipfile.ZipFile(state) as archive:
        info = next(i for i in archive.infolist() if "/data/" in i.filename and i.file_size > 8)
    name_len, extra_len = struct.unpack("<HH", before[info.header_offset + 26:info.header_offset + 30])
    flipped[info.header_offset + 30 + name_len + extra_len + 3] ^= 0x10  # a byte of the record's data
    (tmp_path / "flip.pt").write_bytes(bytes(flipped))
    with pytest.raises(InputError, match=r"flip.pt is damaged \(BadZipFile: CRC of .*data.*delete it"):
        rs.scan(model, TEXTS, ["growth"], batch_size=2, seq_len=16, state=tmp_path / "flip.pt",
                progress=False)
    assert (tmp_path / "flip.pt").read_bytes() == bytes(flipped)
    with pytest.raises(InputError, match="cut.pt is damaged.*delete it"):
        rs.scan(model, TEXTS, ["growth"], batch_size=2, seq_len=16, state=tmp_path / "cut.pt",
                progress=False)
    with pytest.raises(InputError, match="unknown statistics.*choose from"):
        rs.scan(model, TEXTS, ["growth", "nope"], progress=False)
    with pytest.raises(InputError, match="context"):
        rs.scan(model, TEXTS, ["growth"], seq_len=1000, progress=False)
    with pytest.raises(InputError, match="seq_len must be positive, got 8 and 0"):
        rs.scan(model, TEXTS, ["growth"], seq_len=0, progress=False)
    with pytest.raises(rs.errors.EmptyTextError):
        rs.scan(model, ["", "  "], ["growth"], progress=False)


class Upper(ByteTokenizer):
    """The bytes of a text upper-cased: another tokenizer under the same model name."""

    def __call__(self, text, add_special_tokens=True, **kw):
        """``ByteTokenizer``'s ids of ``text.upper()``."""
        up = [t.upper() for t in text] if isinstance(text, list) else text.upper()
        return super().__call__(up, add_special_tokens=add_special_tokens, **kw)


def test_a_state_saved_with_another_tokenizer_is_refused_and_one_with_its_stats_reordered_resumes(
        tmp_path):
    """Before, a state saved with one tokenizer resumed with another, mixing their rows; and
    the same statistics in another order were "other arguments"."""
    m = rs.twin(norm="rmsnorm", placement="pre", n_layers=1, d_model=16, n_heads=2, n_ctx=32)
    state = tmp_path / "scan.pt"
    kw = dict(batch_size=2, seq_len=16, progress=False, state=state)
    first = rs.scan(m, TEXTS, ["growth", "lens"], **kw)
    again = rs.scan(m, TEXTS, ["lens", "growth"], **kw)  # nothing left to do: the same sums
    assert again.batches == first.batches and again.resumed_tokens == first.tokens
    m.tokenizer = Upper()
    with pytest.raises(InputError, match="other arguments {'tokenizer'"):
        rs.scan(m, TEXTS, ["growth", "lens"], **kw)


@pytest.mark.parametrize(("kw", "message"), [
    (dict(rank=1), "rank 1 of world_size 1: world_size must be a whole number ≥ 1 and rank one"),
    (dict(rank=-1), "rank -1 of world_size 1"), (dict(world_size=0), "rank 0 of world_size 0"),
    (dict(rank=True), "rank True"), (dict(rank=3, world_size=2), "rank 3 of world_size 2"),
    (dict(rank=0, world_size=2), "world_size 2 needs a torch.distributed process group"),
    (dict(max_tokens=30.5), "max_tokens must be a whole number, not 30.5"),
    (dict(batch_size=True), "batch_size must be a whole number, not True"),
    (dict(state="{tmp}/no_such_folder/scan.pt"), "cannot write .*no_such_folder is not a writable"),
    (dict(state="{tmp}"), "cannot write .*: it is a folder"),
])
def test_scan_arguments_no_scan_can_run_are_refused_before_any_batch(model, tmp_path, kw, message):
    """Each was accepted and then: scanned a wrong share of the segments (two processes both
    rank 0 counted the even segments twice), died after scanning at its first save (a state
    path in no folder: the results lost), cut 16.7 to 16, or raised deep in the batching."""
    kw = {k: v.format(tmp=tmp_path) if isinstance(v, str) else v for k, v in kw.items()}
    batches = []
    with pytest.raises(InputError, match=message):
        rs.scan(model, TEXTS, ["growth"], progress=False, on_batch=lambda *a: batches.append(a),
                **{"batch_size": 2, "seq_len": 16, **kw})
    assert not batches and list(tmp_path.iterdir()) == []
    whole = rs.scan(model, TEXTS, ["growth"], batch_size=2, seq_len=16, max_tokens=1e2,
                    progress=False)
    assert whole.tokens == 100  # a whole float is its int


def test_sizes_are_whole_numbers_named_when_not():
    """``batch_size=2.0`` raised a TypeError deep in the batching and ``seq_len=16.7`` was cut
    to 16 (the hints say int; a script's numbers come from configs and arithmetic)."""
    from residual_stream.streaming.batching import whole

    assert [whole("n", v) for v in (2, 2.0, 1e3, np.int64(7))] == [2, 2, 1000, 7]
    assert all(type(whole("n", v)) is int for v in (2.0, np.int64(7)))
    for bad in (2.5, 16.7, True, "8", None, float("nan"), float("inf")):
        with pytest.raises(InputError, match=f"seq_len must be a whole number, not {bad!r}"):
            whole("seq_len", bad)


def test_a_bool_option_reads_only_true_or_false_words(monkeypatch):
    """``bool("false")`` is True: a spec's bool is read from words, and anything else is refused."""
    from residual_stream.streaming import accumulators, specs

    class Flagged(accumulators.LensStats):  # a statistic with a bool option (none has one yet)
        name, OPTIONS = "flagged", ("every", "exact")

        def __init__(self, every: int = 1, exact: bool = True):
            super().__init__(every=every)
            self.exact = exact

    monkeypatch.setitem(accumulators.STATS, "flagged", Flagged)
    read = {word: specs.parse_spec(f"flagged:exact={word}").exact
            for word in ["false", "False", "no", "0", "true", "YES", "1"]}
    assert read == {"false": False, "False": False, "no": False, "0": False,
                    "true": True, "YES": True, "1": True}
    assert specs.parse_spec("flagged:every=3").exact is True
    for word in ["off", "", "2"]:
        with pytest.raises(InputError, match=f"exact={word!r} does not read as bool"):
            specs.parse_spec(f"flagged:exact={word}")


def test_statistics_take_options_by_spec_and_results_are_keyed_by_it(model, tmp_path):
    from residual_stream.streaming import make_accumulators
    from residual_stream.streaming.accumulators import LensStats

    accs = make_accumulators(["lens", " lens : every = 4 ", "lens:every=1", LensStats(every=4),
                              "survival:granularity=head", "subspaces:pca_k=4:unembed_k=8",
                              "growth:top_k=10"])
    assert list(accs) == ["lens", "lens:every=4", "survival:granularity=head",
                          "subspaces:pca_k=4:unembed_k=8", "growth:top_k=10"]
    assert (accs["lens:every=4"].every, accs["subspaces:pca_k=4:unembed_k=8"].unembed_k) == (4, 8)
    replayable = {spec: acc.lean and acc.replayable for spec, acc in make_accumulators(  # graphs
        ["read_attribution", "survival:every=2", "lens:every=2", "lens", "subspaces:every=2",
         "composition", "read_attribution:granularity=head"]).items()}
    assert replayable == {"read_attribution": True, "survival:every=2": True,  # fixed choices
                          "lens:every=2": True, "lens": True, "subspaces:every=2": True,
                          "composition": True, "read_attribution:granularity=head": False}
    for spec, message in [("lens:every=0", "at least 1"),
                          ("lens:evry=2", r"lens takes every=<int> \(default 1\), tf32=<bool> "
                                          r"\(default False\)"),
                          ("lens:every=x", "'x' does not read as int"), ("lens:every", "lens takes every"),
                          ("survival:granularity=heads", "'component' or 'head'"),
                          ("survival:granularity=head:every=2", "every applies at component"),
                          ("composition:k=1", "composition takes no options"),
                          ("subspaces:pca_k=0", "at least 1"), ("lense:every=2", "unknown statistics"),
                          ("lens:every=16:every=4", r"lens takes every=<int> \(default 1\), tf32=<bool> "
                                                    r"\(default False\), each once")]:
        with pytest.raises(InputError, match=message):
            make_accumulators(spec)
    with pytest.raises(InputError, match="no statistics asked for"):
        make_accumulators([])
    state = tmp_path / "scan.pt"
    result = rs.scan(model, TEXTS, ["lens:every=2", "survival:granularity=head"], batch_size=3,
                     seq_len=24, state=state, progress=False)
    assert list(result.stats) == ["lens:every=2", "survival:granularity=head"]
    assert list(result.to_dict()["stats"]) == ["lens:every=2", "survival:granularity=head"]
    _close(result.stats["survival:granularity=head"].share,
           rs.survival(_whole(model, TEXTS, batch_size=3, seq_len=24), granularity="head").share)
    with pytest.raises(InputError, match="other arguments.*stats"):  # another sample: not mixed in
        rs.scan(model, TEXTS, ["lens:every=3", "survival:granularity=head"], batch_size=3,
                seq_len=24, state=state, progress=False)
    none = rs.scan(model, TEXTS[:2], ["lens:every=1000000", "read_attribution:every=1000000",
                                      "subspaces:every=1000000:pca_k=2", "survival:every=1000000"],
                   progress=False)
    assert list(none.stats) == ["lens:every=1000000", "read_attribution:every=1000000",
                                "subspaces:pca_k=2:every=1000000",  # options in their order
                                "survival:every=1000000"]
    assert set(none.to_dict()["tokens_measured"].values()) == {0}  # no token chosen: no mean
    assert none.stats["lens:every=1000000"].kl.isna().all()
    assert none.stats["read_attribution:every=1000000"].share.isnan().all()
    assert none.stats["survival:every=1000000"].share.isnan().all()


def _on_chosen(whole, every: int):
    """``whole`` with only the tokens a statistic with ``every`` measures counted as real.

    The analyses reduce over ``attention_mask``; the forward pass behind the trace saw the
    real mask. So their means over this view are means over the chosen tokens.
    """
    import dataclasses

    batch = dataclasses.replace(whole.batch, attention_mask=_chosen(whole.batch, every).long())
    return dataclasses.replace(whole, batch=batch)


FLOW_SAMPLES = {  # the flow buffer carries the tokens sampled at the gcd of the rates
    "reads sampled beside full survival": ["survival", "read_attribution:every=3",
                                           "subspaces:every=3"],
    "all sampled alike": ["survival:every=3", "read_attribution:every=3", "subspaces:every=3"],
    "survival sampled beside full reads": ["survival:every=3", "read_attribution"],
    "nested rates": ["survival:every=2", "read_attribution:every=4", "subspaces:every=6"],
}


def _every(spec: str) -> int:
    return int(spec.rsplit("every=", 1)[1]) if "every=" in spec else 1


@pytest.mark.parametrize("layout", list(FLOW_SAMPLES))
@pytest.mark.parametrize("case", [("twin", "layernorm", "pre"), ("twin", "rmsnorm", "post"),
                                  ("hf", "llama", None), ("hf", "gemma2", None)])
def test_flow_statistics_on_sampled_tokens_equal_the_trace_on_them(case, layout, monkeypatch):
    """Survival, read attribution and subspaces, each on every token or on one in k: each equals
    the analysis on one trace of every row with only its tokens counted. The buffer carries
    the tokens sampled at the rates' greatest common divisor (every token when it is 1), each
    statistic picking its own among them."""
    import math

    from tiny_hf import build

    from residual_stream.inputs import ByteTokenizer
    from residual_stream.streaming import flow

    kind, a, b = case
    m = (rs.twin(norm=a, placement=b, n_layers=3, d_model=32, seed=1, n_ctx=64) if kind == "twin"
         else rs.load(build(a), tokenizer=ByteTokenizer()))
    kw = dict(batch_size=3, seq_len=24)
    whole = _whole(m, TEXTS, **kw)
    stats = FLOW_SAMPLES[layout]
    on = {spec: whole if _every(spec) == 1 else _on_chosen(whole, _every(spec)) for spec in stats}
    measured = {spec: int(t.attention_mask.sum()) for spec, t in on.items()}
    everything = int(whole.attention_mask.sum())
    assert all(0 < n < everything for spec, n in measured.items() if _every(spec) > 1)
    g = math.gcd(*map(_every, stats))
    monkeypatch.setattr("residual_stream.streaming.adding.trace_batch", None)  # lean
    carried = []
    watch(monkeypatch, flow.FlowSums, "_start", lambda self, v: carried.append(
        (self.buf.shape[0], v.shape[0] * v.shape[1])), after=True)
    result = rs.scan(m, TEXTS, stats, progress=False, **kw)
    assert sum(c for c, _ in carried) == (int(_chosen(whole.batch, g).sum()) if g > 1
                                          else sum(t for _, t in carried))
    assert result.to_dict()["tokens_measured"] == measured
    s = next(spec for spec in stats if spec.startswith("survival"))
    got, ref = result.stats[s], rs.survival(on[s])
    assert got.sources == ref.sources
    for field in ("norm", "share", "retention", "born_norm"):
        _close(getattr(got, field), getattr(ref, field))
    r = next(spec for spec in stats if spec.startswith("read"))
    got, ref = result.stats[r], rs.read_attribution(on[r])
    assert (got.readers, got.sources) == (ref.readers, ref.sources)
    _close(got.share, ref.share)
    _close(got.abs_share, ref.abs_share)
    for spec in (spec for spec in stats if spec.startswith("subspaces")):
        first = next(corpus_batches(m, Corpus(TEXTS), **kw))
        ref = rs.write_subspaces(on[spec], pca_trace=trace_batch(m, first))
        for field in SUBSPACE_FIELDS:
            _close(getattr(result.stats[spec], field), getattr(ref, field))
    with pytest.raises(InputError, match="shared with the other flow statistics"):
        rs.scan(m, TEXTS, ["survival", "survival:every=3"], progress=False, **kw)


def test_samples_nest_and_a_fixed_choice_is_never_made_inside_a_capture(model, monkeypatch):
    """The tokens chosen one in ``every`` are among those chosen one in each divisor of it
    (reference hash); ``sampled_among`` finds them there, so picking them out of a sample
    taken one in ``among`` gives what one in ``every`` takes from the batch. A static batch's
    fixed choice asked for first inside a CUDA graph's capture is refused, leaving it as it was."""
    from residual_stream.streaming import sampling
    from residual_stream.streaming.sampling import StaticBatch, TokenChoice, sampled_among

    batch = _whole(model, TEXTS, batch_size=3, seq_len=24).batch
    mask = batch.attention_mask.bool()
    x = torch.arange(mask.numel(), dtype=torch.float32).view(*mask.shape, 1)  # token ids
    for every, among in [(4, 2), (6, 2), (16, 4), (9, 3), (3, 3)]:
        outer, inner = _chosen(batch, among), _chosen(batch, every)
        assert not (inner & ~outer).any() and inner.sum() > 0
        assert torch.equal(sampled_among(batch, every, among), inner[outer])
        picked = TokenChoice.of(batch, mask, every, among=among).pick(
            TokenChoice.of(batch, mask, among).take(x))
        assert torch.equal(picked, TokenChoice.of(batch, mask, every).take(x))
    with pytest.raises(ValueError, match="not a sample within one in 4"):
        sampled_among(batch, 6, 4)
    static = StaticBatch.on(batch, model.device)
    monkeypatch.setattr(sampling, "_capturing", lambda device: True)
    with pytest.raises(RuntimeError, match="inside a CUDA graph's capture"):
        TokenChoice.of(static, mask, 4, among=2)
    assert static.samples == {}
    monkeypatch.setattr(sampling, "_capturing", lambda device: False)
    choice = TokenChoice.of(static, mask, 4, among=2)
    assert static.samples == {(4, 2): choice} and TokenChoice.of(static, mask, 4, among=2) is choice


def test_one_text_or_one_token_gives_no_standard_error(model):
    """A standard error needs two draws: over one text ``kl_se_texts`` is NaN (it was 0, a
    claim of no error at all) while ``kl_se`` is the tokens' ``std / √n``; over one token both
    are NaN. The figure then draws no band (zero width) around the KL."""
    from residual_stream import plotting

    whole = _whole(model, TEXTS[:1], batch_size=3, seq_len=24)
    lens = rs.scan(model, TEXTS[:1], "lens", batch_size=3, seq_len=24, progress=False).stats["lens"]
    kl = rs.logit_lens(whole).kl[:, whole.attention_mask.bool()].double()  # [point, token]
    assert set(lens.texts) == {1} and lens.kl_se_texts.isna().all()
    _close(torch.tensor(lens.kl_se.values), kl.std(-1) / kl.shape[1] ** 0.5, rel=1e-4, atol=KL_ATOL)
    band = plotting.lens_depth_figure(lens).data[0]
    drawn = list(lens.kl[lens.kl > plotting.growth.KL_ROUNDING])  # the final point is off the axis
    assert list(band.y) == pytest.approx(drawn + drawn[::-1])
    one = rs.scan(model, TEXTS, "lens", max_tokens=1, progress=False).stats["lens"]
    assert set(one.tokens) == {1} and one.kl_se.isna().all() and one.kl_se_texts.isna().all()
    assert not one.kl.isna().any()


def test_the_sampled_lens_chooses_tokens_by_their_place_in_the_corpus_in_one_pass(model, monkeypatch):
    """``sampling.sampled`` is SplitMix64 (its published first output for seed 0) of (text, position
    in text): the same tokens whatever the batching, about one in ``every``; a sampled lens
    takes the logits from its own pass (no second forward pass) and keeps only its tokens."""
    from residual_stream.streaming.lens import LensSums
    from residual_stream.streaming.sampling import _splitmix64, sampled

    assert _splitmix64(np.zeros(1, dtype=np.uint64))[0] == 0xE220A8397B1DCDAF == _splitmix64_ref(0)
    kw = dict(batch_size=3, seq_len=24)
    whole = _whole(model, TEXTS, **kw)
    assert torch.equal(sampled(whole.batch, 3), _chosen(whole.batch, 3))
    assert torch.equal(sampled(whole.batch, 1), whole.attention_mask.bool())
    corpus = Corpus("builtin")

    def places(**kw) -> set[tuple[int, int]]:
        out = set()
        for b in corpus_batches(model, corpus, max_tokens=6000, **kw):
            for r, j in sampled(b, 4).nonzero().tolist():
                out.add((b.text_index[r], b.text_start[r] + j))
        return out

    a, b = places(batch_size=3, seq_len=24), places(batch_size=5, seq_len=40)
    assert a == b and abs(len(a) - 6000 / 4) < 4 * (6000 * 0.25 * 0.75) ** 0.5  # within 4 σ

    def no_second_pass(*args, **kwargs):
        raise AssertionError("a plain forward pass for the logits")

    monkeypatch.setattr("residual_stream.streaming.lean.model_logits", no_second_pass)
    monkeypatch.setattr("residual_stream.streaming.adding.trace_batch", None)  # lean
    kept: list[tuple[int, int]] = []  # per point given: (its kept tokens, the batch's tokens)
    watch(monkeypatch, LensSums, "point", lambda self, p, x: kept.append(
        (len(self.early[p]), x.shape[0] * x.shape[1])), after=True)
    result = rs.scan(model, TEXTS, ["lens:every=3"], progress=False, **kw)
    _assert_sampled_lens_equal(result, whole, 3)
    per_batch = kept[:: model.anatomy.n_layers + 1]
    assert sum(k for k, _ in per_batch) == result.stats["lens:every=3"].tokens[0]
    assert all(k < n / 2 for k, n in per_batch)  # about a third of each batch is kept
    with pytest.raises(AssertionError, match="plain forward pass"):  # every token: logits first
        rs.scan(model, TEXTS, ["lens"], progress=False, **kw)


def test_a_sampled_lens_has_the_head_unembed_its_tokens_alone(monkeypatch):
    """A lean pass whose one late reducer is a sampled lens has the model's head read that
    lens's tokens alone: the logits it hands over are ``[1, chosen, vocab]``, not ``[batch,
    pos, vocab]``. The sums equal the analysis's, as they do when the head is not narrowed (a
    model whose head is not found or reads another shape: every token unembedded, then the
    chosen ones taken)."""
    from tiny_hf import build

    from residual_stream.inputs import ByteTokenizer
    from residual_stream.streaming.lens import LensSums

    m = rs.load(build("llama"), tokenizer=ByteTokenizer())
    kw = dict(batch_size=4, seq_len=32)
    whole = _whole(m, TEXTS, **kw)
    given: list[tuple] = []
    watch(monkeypatch, LensSums, "logits", lambda self, f, taken=False: given.append(
        (tuple(f.shape), taken, len(self.tokens.index))))
    result = rs.scan(m, TEXTS, ["lens:every=3"], progress=False, **kw)
    _assert_sampled_lens_equal(result, whole, 3)
    vocab = m.anatomy.d_vocab
    assert given and all(taken and shape == (1, n, vocab) for shape, taken, n in given)
    assert sum(n for _, _, n in given) < sum(4 * 32 for _ in given) / 2  # about a third
    given.clear()
    monkeypatch.setattr("residual_stream.streaming.lean.unembedding_of_tokens", lambda *a: [])
    every = rs.scan(m, TEXTS, ["lens:every=3"], progress=False, **kw)
    _assert_sampled_lens_equal(every, whole, 3)
    assert given and not any(taken for _, taken, _ in given)
    assert all(len(shape) == 3 and shape[2] == vocab and shape[0] * shape[1] > n  # every token's
               for shape, _, n in given)


# --- command line and several processes ----------------------------------------------------

def test_importing_the_entry_module_keeps_rs_scan_callable(model):
    import importlib

    importlib.import_module("residual_stream.scan")  # the package attribute now names the module
    result = rs.scan(model, TEXTS[:3], ["growth"], progress=False)
    assert result.tokens == sum(len(t.encode()) + 1 for t in TEXTS[:3])


def _run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, *args], capture_output=True, text=True, timeout=300,
                          env=dict(os.environ, OMP_NUM_THREADS="1"))


def _assert_same_scan(one: Path, two: Path) -> None:
    """Two scans' JSON: the same tokens and batches, counts and ranks, floats to 1e-6."""
    a, b = json.loads(one.read_text()), json.loads(two.read_text())
    assert (a["tokens"], a["batches"]) == (b["tokens"], b["batches"])
    assert a["tokens"] == 2000 and a["batches"] > 2
    sampled = a["stats"]["lens:every=4"]["summary"]
    assert 300 < sampled[0]["tokens"] < 700  # about 2000 / 4: the same tokens in either run
    for name, frames in a["stats"].items():
        for key, records in frames.items():
            other = b["stats"][name][key]
            assert len(records) == len(other), (name, key)
            for ra, rb in zip(records, other, strict=True):
                assert ra.keys() == rb.keys()
                for k, va in ra.items():
                    if isinstance(va, float):
                        assert va == pytest.approx(rb[k], rel=1e-6, abs=1e-9), (name, key, k)
                    else:
                        assert va == rb[k], (name, key, k)


@pytest.mark.slow
def test_cli_scan_resumes_and_several_processes_give_the_single_process_result(tmp_path: Path):
    args = ["twin-pre-ln", "builtin", "--stats",
            "growth,survival,read_attribution,subspaces,lens,lens:every=4",
            "--batch-size", "4", "--seq-len", "64", "--max-tokens", "2e3", "--quiet",
            "--segment-chars", "300"]  # 2,000 bytes of it: 6 segments, shared by the processes
    one = _run("-m", "residual_stream.cli", "scan", *args, "--out", str(tmp_path / "one.json"),
               "--state", str(tmp_path / "s.pt"))
    assert one.returncode == 0, one.stderr
    assert "scanned 2000 tokens" in one.stderr
    again = _run("-m", "residual_stream.cli", "scan", *args, "--out", str(tmp_path / "again.json"),
                 "--state", str(tmp_path / "s.pt"))  # the saved state is complete: nothing to redo
    assert again.returncode == 0 and "scanned 2000 tokens" in again.stderr, again.stderr
    assert json.loads((tmp_path / "again.json").read_text())["stats"] == \
        json.loads((tmp_path / "one.json").read_text())["stats"]
    bad = _run("-m", "residual_stream.cli", "scan", *args, "--out", str(tmp_path / "bad.json"),
               "--state", str(tmp_path / "bad.pt"), "--save-seconds", "-1")
    assert bad.returncode == 1 and "save_seconds must be" in bad.stderr, bad.stderr
    assert not (tmp_path / "bad.json").exists() and not (tmp_path / "bad.pt").exists()
    for out in ("two.json", "two_again.json"):  # the second from the ranks' complete states
        two = _run("-m", "torch.distributed.run", "--nproc-per-node", "2", "--master-port", "29533",
                   "-m", "residual_stream.scan", *args, "--out", str(tmp_path / out),
                   "--state", str(tmp_path / "two.pt"))
        assert two.returncode == 0, two.stderr
        _assert_same_scan(tmp_path / "one.json", tmp_path / out)
    assert sorted(p.name for p in tmp_path.glob("two.pt.rank*")) == ["two.pt.rank0", "two.pt.rank1"]
    line = tmp_path / "line.txt"  # the corpus on one line: its parts are shared by 3, which
    text = " ".join(builtin_corpus()).encode()  # count their shares of the budget first; a Latin-1
    line.write_bytes(text[:40] + b"caf\xe9" + text[40:] + b"\n")  # byte, read as U+FFFD, told once
    args[1:2] = [str(line), "--encoding-errors", "replace"]
    for out, runner in (("line1.json", ["-m", "residual_stream.cli", "scan"]),
                        ("line2.json", ["-m", "torch.distributed.run", "--nproc-per-node", "3",
                                        "--master-port", "29534", "-m", "residual_stream.scan"])):
        done = _run(*runner, *args, "--out", str(tmp_path / out))
        assert done.returncode == 0, done.stderr
        assert done.stderr.count("not UTF-8") == 1 and "byte 43" in done.stderr, done.stderr
        replaced = json.loads((tmp_path / out).read_text())["replaced"]  # the ranks' records joined
        assert len(replaced) == 1 and "byte 43" in replaced[0], replaced
    _assert_same_scan(tmp_path / "line1.json", tmp_path / "line2.json")
    refusals = [("cuda:1", "each process takes its own device")]
    if not torch.cuda.is_available():
        refusals.append(("cuda", "not on this machine"))
    for device, message in refusals:
        bad = _run("-m", "torch.distributed.run", "--nproc-per-node", "2", "--master-port", "29535",
                   "-m", "residual_stream.scan", *args, "--device", device, "--out", str(tmp_path / "x.json"))
        assert bad.returncode != 0 and message in bad.stderr, bad.stderr  # it ran on the CPU before
    bad = _run("-m", "residual_stream.cli", "scan", "twin-pre-ln", "builtin", "--stats", "nope",
               "--out", str(tmp_path / "x.json"))
    assert bad.returncode == 1 and "unknown statistics" in bad.stderr
    assert not (tmp_path / "x.json").exists()
    bad = _run("-m", "residual_stream.cli", "scan", "no-such-model", "builtin", "--stats",
               "lens:every=0", "--out", str(tmp_path / "x.json"))  # refused before any loading
    assert bad.returncode == 1 and "lens: every" in bad.stderr and "at least 1" in bad.stderr


def test_lean_lens_of_a_bf16_model_reduces_each_point_on_arrival_and_equals_the_trace(monkeypatch):
    """In bf16 the lean lens gets the model's own bf16 logits first, then each point as the
    hooks made it (bf16), and reduces it at once (its KL is in before the next point comes;
    nothing is kept), casting W_U per vocabulary slice (3 slices here) in chunks of at most
    ``MAX_CHUNK`` tokens: the same values as the float32 trace the analysis reads."""
    from tiny_hf import build

    from residual_stream.inputs import ByteTokenizer
    from residual_stream.streaming.lens import LensSums
    from residual_stream.weights import Unembed

    m = rs.load(build("llama").to(torch.bfloat16), tokenizer=ByteTokenizer())
    assert m.dtype == torch.bfloat16
    kw = dict(batch_size=4, seq_len=32)
    whole = _whole(m, TEXTS, **kw)
    logits: list[torch.dtype] = []
    given: list[torch.dtype] = []
    reduced: list[bool] = []
    watch(monkeypatch, LensSums, "logits", lambda self, f, taken=False: logits.append(f.dtype))
    watch(monkeypatch, LensSums, "point", lambda self, p, x: given.append(x.dtype))
    watch(monkeypatch, LensSums, "point", lambda self, p, x: reduced.append(
        self.ranks[p] is not None and all(r is None for r in self.ranks[p + 1:])), after=True)
    monkeypatch.setattr("residual_stream.weights.VOCAB_SLICE", 100)
    monkeypatch.setattr("residual_stream.streaming.lens.MAX_CHUNK", 5)  # 128 tokens: 26 chunks
    rows: list[int] = []
    watch(monkeypatch, Unembed, "logits", lambda self, h: rows.append(len(h)))
    result = rs.scan(m, TEXTS, ["lens"], progress=False, **kw)
    assert max(rows) == 5 and min(rows) < 5  # capped chunks, the last of a batch partial
    assert set(logits) == set(given) == {torch.bfloat16}  # the model's own tensors (native_dtype)
    assert reduced and all(reduced)
    _assert_lens_equal(result, whole)
    given.clear()
    rows.clear()
    mixed = rs.scan(m, TEXTS, ["lens", "lens:every=2", "growth", "survival"], progress=False, **kw)
    assert set(given) == {torch.bfloat16}
    _assert_lens_equal(mixed, whole)
    _assert_sampled_lens_equal(mixed, whole, 2)  # kept points: every point's token at once
    assert m.anatomy.n_layers + 1 in rows  # MAX_CHUNK 5 // 5 points: one token a product


def _tf32_ref(x: torch.Tensor) -> torch.Tensor:
    """Round to 11 significant bits (TF32's 10 stored), ties to even: through float64's frexp."""
    m, e = torch.frexp(x.double())
    return torch.ldexp(torch.round(m * 2**11) / 2**11, e).float()  # torch.round: ties to even


def test_tf32_round_keeps_ten_mantissa_bits_ties_to_even():
    """``lens.tf32_round`` (bit arithmetic) against ``_tf32_ref`` (float64 frexp): random
    normal values over many scales, exact ties both ways and both signs, the largest values
    (which round up to infinity), and infinities and NaN kept."""
    from residual_stream.streaming.lens import tf32_round

    g = torch.Generator().manual_seed(0)
    x = torch.randn(200_000, generator=g) * torch.exp2(torch.randint(-100, 100, (200_000,), generator=g))
    ulp = 2.0 ** -10  # TF32's last kept bit at 1.0; a tie is half of it
    ties = torch.tensor([1 + ulp / 2, 1 + 3 * ulp / 2, -(1 + ulp / 2), -(1 + 3 * ulp / 2), 3 * 2.0**-20])
    assert torch.equal(tf32_round(ties), torch.tensor([1.0, 1 + 2 * ulp, -1.0, -(1 + 2 * ulp),
                                                       3 * 2.0**-20]))  # to the even neighbour
    big = torch.tensor([torch.finfo(torch.float32).max, -torch.finfo(torch.float32).max, 65504.0])
    for values in (x, ties, big):
        assert torch.equal(tf32_round(values), _tf32_ref(values))
    assert torch.equal(tf32_round(big)[:2], torch.tensor([float("inf"), float("-inf")]))
    special = torch.tensor([float("inf"), float("-inf"), float("nan"), 0.0, -0.0])
    assert torch.equal(tf32_round(special)[:2], special[:2]) and tf32_round(special)[2].isnan()
    assert torch.equal(tf32_round(special)[3:].view(torch.int32), special[3:].view(torch.int32))
    assert torch.equal(tf32_round(tf32_round(x)), tf32_round(x))  # a TF32 value reads exactly


def test_lens_tf32_equals_the_analysis_on_tf32_rounded_inputs(monkeypatch):
    """``lens:tf32=true`` on a bf16 model: every unembedding reads TF32 values (the plain lens
    reads values TF32 would round), and the scan equals the single-trace analysis whose
    unembedding inputs are rounded by the float64 reference: the same KL, agreement and ranks."""
    from tiny_hf import build

    from residual_stream.inputs import ByteTokenizer
    from residual_stream.weights import Unembed

    m = rs.load(build("llama").to(torch.bfloat16), tokenizer=ByteTokenizer())
    kw = dict(batch_size=4, seq_len=32)
    exact: list[bool] = []
    watch(monkeypatch, Unembed, "logits", lambda self, h: exact.append(torch.equal(_tf32_ref(h), h)))
    plain = rs.scan(m, TEXTS, ["lens"], progress=False, **kw)
    assert exact and not all(exact)  # the float32 normed stream has bits TF32 drops
    exact.clear()
    result = rs.scan(m, TEXTS, ["lens:tf32=true"], progress=False, **kw)
    assert list(result.stats) == ["lens:tf32=True"] and exact and all(exact)
    original = Unembed.logits
    monkeypatch.setattr(Unembed, "logits", lambda self, h: original(self, _tf32_ref(h.float())))
    whole = _whole(m, TEXTS, **kw)  # the analysis, every unembedding input rounded
    result.stats["lens"] = result.stats.pop("lens:tf32=True")
    _assert_lens_equal(result, whole)
    gap = (torch.tensor(plain.stats["lens"].kl.values) - torch.tensor(result.stats["lens"].kl.values))
    assert float(gap.abs().max()) > 0  # the rounding reaches the sums


def test_lens_tf32_refuses_a_float32_unembedding_and_bad_values(model):
    """TF32 would round a float32 W_U (the CPU would not): refused before the first batch,
    saying what to do; the option is a bool, and its spec reads back."""
    from residual_stream.streaming import make_accumulators
    from residual_stream.streaming.accumulators import LensStats
    from residual_stream.streaming.specs import parse_spec

    seen: list[int] = []
    with pytest.raises(InputError, match="W_U is torch.float32.*load the model in bfloat16"):
        rs.scan(model, TEXTS, ["lens:tf32=true"], progress=False, batch_size=2, seq_len=16,
                on_batch=lambda *a: seen.append(1))
    assert seen == []
    with pytest.raises((InputError, TypeError), match="tf32"):  # TypeError: the tests' type checks
        LensStats(tf32="yes")
    with pytest.raises(InputError, match="tf32='maybe' does not read as bool"):
        parse_spec("lens:tf32=maybe")
    accs = make_accumulators(["lens:tf32=1", "lens", "lens:every=4:tf32=no"])
    assert list(accs) == ["lens:tf32=True", "lens", "lens:every=4"]
    assert parse_spec("lens:tf32=True").tf32 is True


def test_tf32_products_set_and_restore_the_cuda_setting():
    """On a CUDA device the process-wide ``fp32_precision`` is ``tf32`` inside and restored
    after, also when the body raises; on the CPU, or when off, it is left alone."""
    from residual_stream.streaming.lens import tf32_products

    matmul = torch.backends.cuda.matmul
    before = matmul.fp32_precision
    with tf32_products(torch.device("cuda")):
        assert matmul.fp32_precision == "tf32"
    assert matmul.fp32_precision == before
    with pytest.raises(RuntimeError, match="inside"), tf32_products(torch.device("cuda")):
        raise RuntimeError("inside")
    assert matmul.fp32_precision == before
    for device, on in [(torch.device("cpu"), True), (torch.device("cuda"), False)]:
        with tf32_products(device, on):
            assert matmul.fp32_precision == before


@pytest.mark.parametrize("name", ["llama", "gpt2", "twin", "bert_mlm"])
def test_a_lean_pass_without_the_lens_unembeds_only_the_last_position(name):
    """Statistics that read no logits skip the ``[tokens, vocab]`` product where the model's
    forward takes ``logits_to_keep``; the lens gets every position's logits from a plain
    forward pass first, then the lean pass skips it too. A masked LM (no ``logits_to_keep``)
    unembeds everything."""
    from tiny_hf import build

    from residual_stream.inputs import ByteTokenizer

    m = (rs.twin(norm="rmsnorm", placement="pre", n_layers=2, d_model=32, seed=0, n_ctx=64)
         if name == "twin" else rs.load(build(name), tokenizer=ByteTokenizer()))
    rows: list[int] = []
    head = m.module.get_output_embeddings()
    handle = head.register_forward_hook(lambda mod, inp, out: rows.append(inp[0].shape[-2]))
    try:
        rs.scan(m, TEXTS[:4], ["growth", "survival"], batch_size=4, seq_len=24, progress=False)
        lean_rows = list(rows)
        rows.clear()
        rs.scan(m, TEXTS[:4], ["lens"], batch_size=4, seq_len=24, progress=False)
    finally:
        handle.remove()
    widths = {b.tokens.shape[1] for b in corpus_batches(m, Corpus(TEXTS[:4]), batch_size=4,
                                                        seq_len=24)}
    assert widths == {24, 15}  # two batches, the second of shorter rows
    assert lean_rows and set(lean_rows) == ({1} if name != "bert_mlm" else widths)
    assert rows and set(rows) == ({1} | widths if name != "bert_mlm" else widths)  # logits, then the pass


@pytest.mark.parametrize("name", ["llama", "gemma2"])
def test_a_lean_pass_computes_only_the_norm_scales_it_reads(name, monkeypatch):
    """Growth reads the final norm's scale and, in Gemma 2, the write norms' (``Add.via``);
    a pre-norm block's reading norms are skipped unless read attribution maps through them."""
    from tiny_hf import build

    from residual_stream.inputs import ByteTokenizer
    from residual_stream.norms import NormSpec

    m = rs.load(build(name), tokenizer=ByteTokenizer())
    computed: set[str] = set()
    watch(monkeypatch, NormSpec, "scale", lambda self, x: computed.add(self.name))
    kw = dict(batch_size=4, seq_len=24, progress=False)
    rs.scan(m, TEXTS[:4], ["growth", "survival"], **kw)
    writes = {n for n in m.anatomy.norms if n.endswith("_out")}  # Gemma 2's post-write norms
    assert computed == {"ln_final"} | writes
    assert bool(writes) == (name == "gemma2")
    computed.clear()
    rs.scan(m, TEXTS[:4], ["read_attribution"], **kw)
    assert computed == set(m.anatomy.norms)


def test_an_accumulator_that_holds_a_scan_is_refused_and_left_as_it_was(model):
    """Passed again, a filled accumulator would add a second corpus to the first (and keep its
    PCA basis) while the result counts one: refused with what to do, its sums untouched; its
    ``empty_like()`` scans as the spec does."""
    from residual_stream.streaming.accumulators import LensStats

    lens = LensStats(every=2)
    first = rs.scan(model, TEXTS[:3], [lens, "growth"], batch_size=2, seq_len=16, progress=False)
    assert first.accumulators["lens:every=2"] is lens and lens.tokens > 0
    held = {k: v.clone() for k, v in lens.sums.items()}
    with pytest.raises(InputError, match=r"'lens:every=2' \(\d+ tokens\) already hold.*empty_like"):
        rs.scan(model, TEXTS[3:], [lens], batch_size=2, seq_len=16, progress=False)
    assert held.keys() == lens.sums.keys() and all(torch.equal(v, lens.sums[k]) for k, v in held.items())
    again = rs.scan(model, TEXTS[3:], [lens.empty_like()], batch_size=2, seq_len=16, progress=False)
    fresh = rs.scan(model, TEXTS[3:], ["lens:every=2"], batch_size=2, seq_len=16, progress=False)
    for key, x in fresh.accumulators["lens:every=2"].sums.items():
        assert torch.allclose(again.accumulators["lens:every=2"].sums[key], x, rtol=1e-6), key


def test_a_model_shared_by_two_threads_gives_each_its_own_results():
    """The app's reruns can overlap: one thread traces while another scans the same model.
    Each pass holds the model's lock (``contexts.model_lock``), so neither sees the other's
    hooks (before, the scan lost its last block's hook to the trace's clean-up: a KeyError)."""
    import threading

    m = rs.twin(norm="rmsnorm", placement="pre", n_layers=4, d_model=32, n_heads=2, n_ctx=64)
    texts = [f"text number {i} about the residual stream" for i in range(200)]
    kw = dict(batch_size=2, seq_len=16, progress=False)
    reference, traced = rs.scan(m, texts, ["growth"], **kw), rs.trace(m, "a short text", patterns=True)
    errors, stop, traces = [], threading.Event(), []

    def tracer() -> None:
        while not stop.is_set():
            try:
                traces.append(rs.trace(m, "a short text", patterns=True).stream(4))
            except Exception as e:  # noqa: BLE001 - reported below
                errors.append(e)
                return

    thread = threading.Thread(target=tracer)
    thread.start()
    try:
        got = rs.scan(m, texts, ["growth"], **kw)
    finally:
        stop.set()
        thread.join()
    assert not errors and traces, errors
    assert all(torch.equal(t, traced.stream(4)) for t in traces)
    for key, value in reference.accumulators["growth"].sums.items():
        assert torch.allclose(got.accumulators["growth"].sums[key], value, rtol=1e-12), key
