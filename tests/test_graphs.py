"""Replayed lean passes (``streaming.graphs``), checked on the CPU against the eager scan.

A CUDA graph only exists on a GPU; ``Replayed(emulate=True)`` runs everything else the
replay does (static device buffers, reducers built on them with ``replayable=True``, the
fixed-size massive-activation search and its overflow fallback, the checks, ``rebind``)
eagerly, so these tests compare that path with the eager scan: every sum exactly equal,
the massive-activation rows identical. The graph itself is checked on the device by
``benchmarks/gpu_probe.py`` (replayed scan against the eager one, recorded in RESULTS.md).
"""

from __future__ import annotations

import pytest
import torch

import residual_stream as rs
from residual_stream.errors import InputError, NonFiniteError
from residual_stream.streaming import Corpus, corpus_batches, make_accumulators
from residual_stream.streaming.adding import add_batch as _add_batch
from residual_stream.streaming.adding import batch_adder
from residual_stream.streaming.graphs import Replayed, padded_width, widths

REL_PADDED = 1e-6  # float32: a wider matmul may round differently (~1e-7 relative)
KL_ATOL = 1e-6  # nats per token: a float32 log-softmax over the vocabulary rounds ~1e-7
TEXTS = ["Zebras Zigzag.", "The norm is frozen per token.", "Zz", "a", "print('hello')",
         "Attention reads; the MLP writes back.", "ZZZZZZZZZZZZZZZZZZ ZZZZZZZZZZ"]


def _planted_twin() -> rs.Model:
    m = rs.twin(norm="rmsnorm", placement="pre", n_layers=3, d_model=32, n_heads=4, seed=5,
                n_ctx=64)
    with torch.no_grad():  # a planted massive activation on every "Z"
        m.module.embed.weight[ord("Z"), 7] = 4000.0
    return m


@pytest.fixture(scope="module")
def model() -> rs.Model:
    return _planted_twin()


def _both(model, texts, width=None, stats=("growth",), **kw) -> tuple[dict, dict, Replayed]:
    from residual_stream.streaming.lean import points

    eager, replayed = make_accumulators(list(stats)), make_accumulators(list(stats))
    replay = Replayed(model, replayed, width=width, emulate=True)
    batches = list(corpus_batches(model, Corpus(texts), **kw))
    calibration = points(model, batches[0])  # as a scan fixes subspaces' PCA
    for acc in [*eager.values(), *replayed.values()]:
        acc.prepare(model, calibration)
    for batch in batches:
        _add_batch(model, batch, eager)
        replay.add(batch)
    replay.flush()  # the last replayed batch waits for a next one
    return eager, replayed, replay


def _assert_same(eager: dict, replayed: dict, rel: float = 0.0) -> None:
    """Every sum equal (within ``rel`` of its largest entry: padding changes a matmul's
    shape, and with it the rounding); massive-activation rows identical up to ``rel``."""
    a, b = eager["growth"], replayed["growth"]
    assert a.sums.keys() == b.sums.keys()
    for key in a.sums:
        x, y = a.sums[key], b.sums[key]
        assert x.shape == y.shape and x.dtype == y.dtype, key
        if rel == 0 or not x.is_floating_point():
            assert torch.equal(x, y), key
        else:
            assert float((x - y).abs().max()) <= rel * float(x.abs().max()), key
    rows = [[{k: v for k, v in r.items() if k not in ("value", "ratio_to_median")}
             for r in acc.meta["massive"]] for acc in (a, b)]
    assert rows[0] == rows[1] and len(rows[0]) == len(a.meta["massive"])
    for r, s in zip(a.meta["massive"], b.meta["massive"], strict=True):
        assert r["value"] == pytest.approx(s["value"], rel=rel, abs=0)
    assert a.meta["norms"] == b.meta["norms"] and a.meta["model_name"] == b.meta["model_name"]


def test_replayed_growth_equals_the_eager_scan(model):
    eager, replayed, replay = _both(model, TEXTS, batch_size=3, seq_len=16)
    assert int(eager["growth"].sums["massive_found"]) > 0
    assert replay.replays == 4 and replay.fallbacks == 0
    # not padded to a scan width: one capture per shape, and per shape one with padding and one
    # without (the first 3×16 batch is all real tokens, the second is not)
    assert sorted(replay.entries) == [(2, 3, False), (3, 14, False), (3, 16, False), (3, 16, True)]
    _assert_same(eager, replayed)


def test_padding_to_the_scan_width_leaves_every_statistic_as_it_was(model):
    """A scan width of 40 pads to 16, 24 or 40 positions: batches 3×38, 3×15 and 1×2 (length
    order) take 3×40, 3×16 and 1×16; per-position sums are cut back."""
    eager, replayed, replay = _both(model, TEXTS, width=40, batch_size=3, seq_len=40)
    assert set(replay.entries) == {(3, 40, False), (3, 16, False), (1, 16, False)}
    assert replay.replays == 3
    _assert_same(eager, replayed, rel=REL_PADDED)


def test_replayed_widths_halve_the_scan_width_in_multiples_of_8():
    """``seq_len`` and its halvings rounded up to multiples of 8, at least 16 (by hand)."""
    assert widths(40) == [16, 24, 40] and widths(20) == [16, 20] and widths(16) == [16]
    assert widths(100) == [16, 32, 56, 100]  # ⌈50/8⌉·8, ⌈25/8⌉·8, ⌈12.5/8⌉·8
    assert widths(512) == [16, 32, 64, 128, 256, 512]
    assert widths(4096) == [128, 256, 512, 1024, 2048, 4096]  # five halvings
    assert [padded_width(n, 100) for n in (1, 16, 17, 33, 57, 100, 101)] == [
        16, 16, 32, 56, 100, 100, 101]
    assert padded_width(7, None) == 7


def test_a_batch_with_more_candidates_than_the_search_holds_is_done_again(model, monkeypatch):
    """One text per batch, so 4 candidates per point: only the 28-"Z" text holds more (every
    other text at most 2), and that batch alone falls back to the eager pass, exactly."""
    monkeypatch.setattr("residual_stream.streaming.growth.MIN_CANDIDATES", 1)
    eager, replayed, replay = _both(model, TEXTS, width=32, batch_size=1, seq_len=32)
    assert replay.fallbacks == 1 and replay.replays == 7  # 8 rows (one text takes two)
    _assert_same(eager, replayed, rel=REL_PADDED)


def test_shapes_past_the_limit_take_the_eager_pass(model, monkeypatch):
    """Unpadded rows of one text: 6 shapes, 4 kept; the rest are added eagerly, the same."""
    monkeypatch.setattr("residual_stream.streaming.graphs.MAX_SHAPES", 4)
    eager, replayed, replay = _both(model, TEXTS, batch_size=1, seq_len=32)
    assert len(replay.entries) == 4 and replay.replays == 6  # widths 32, 30, 15, 6 (twice 30, 15)
    _assert_same(eager, replayed)


@pytest.mark.parametrize("name", ["llama", "gpt2", "bert", "gemma2", "gpt_neox_parallel"])
def test_replayed_growth_on_framework_models(name):
    from tiny_hf import build

    from residual_stream.inputs import ByteTokenizer

    m = rs.load(build(name), tokenizer=ByteTokenizer())
    n = len(list(corpus_batches(m, Corpus(TEXTS), batch_size=4, seq_len=24)))
    eager, replayed, replay = _both(m, TEXTS, width=24, batch_size=4, seq_len=24)
    assert replay.replays == n == 3
    assert set(replay.entries) == {(4, 24, False), (4, 16, False), (2, 16, False)}
    _assert_same(eager, replayed, rel=REL_PADDED)


def test_a_batch_without_padding_is_replayed_giving_the_model_no_mask(monkeypatch):
    """Its own graph, captured with no mask (Hugging Face cannot check one while a graph is
    captured, and would lose SDPA's causal kernel); the sums are the eager scan's, which gives
    the mask. The lens's second forward pass (the final logits) takes none either."""
    from tiny_hf import build

    from residual_stream import capture
    from residual_stream.inputs import ByteTokenizer

    m = rs.load(build("llama"), tokenizer=ByteTokenizer())
    given, plain = [], capture._forward_kwargs

    def spy(model, tokens, mask, **kw):
        given.append(mask is not None)
        return plain(model, tokens, mask, **kw)

    monkeypatch.setattr(capture, "_forward_kwargs", spy)
    eager, replayed, replay = _both(m, TEXTS[:2], batch_size=2, seq_len=8, stats=("growth", "lens"))
    dense = [key for key in replay.entries if key[-1]]
    assert dense and all(bool(replay.entries[k].batch.attention_mask.all()) for k in dense)
    assert any(not key[-1] for key in replay.entries)  # the last batch is padded
    batches = list(corpus_batches(m, Corpus(TEXTS[:2]), batch_size=2, seq_len=8))
    unpadded = sum(bool(b.attention_mask.all()) for b in batches)
    # emulated: a capture's warm-up and each replay run the pass; growth's and the lens's logits
    assert given.count(False) == 2 * (len(dense) + unpadded) and True in given
    _assert_same(eager, replayed, rel=REL_PADDED)
    _assert_sums_close({"lens": eager["lens"]}, {"lens": replayed["lens"]}, REL_PADDED)


FLOW = ("survival", "read_attribution")


def _assert_sums_close(eager: dict, replayed: dict, rel: float) -> None:
    """Every sum within ``rel`` of its largest entry; the lens's KL sums (which may sum to
    nearly 0 at the last point) also within ``KL_ATOL`` per token."""
    for name, a in eager.items():
        b = replayed[name]
        assert a.sums.keys() == b.sums.keys() and a.meta.keys() == b.meta.keys(), name
        for key, value in a.meta.items():  # labels, or subspaces' PCA basis (the same batch's)
            same = (torch.equal(value, b.meta[key]) if isinstance(value, torch.Tensor)
                    else value == b.meta[key])
            assert same, (name, key)
        sums = {**a.sums, **(a.open_texts.folded() if name.startswith("lens") else {})}
        other = {**b.sums, **(b.open_texts.folded() if name.startswith("lens") else {})}
        for key, x in sums.items():  # the lens's text clusters too (still open: no segment end)
            y = other[key]
            assert x.shape == y.shape and torch.equal(x.isnan(), y.isnan()), (name, key)
            bound = rel * float(x.nan_to_num().abs().max())
            if name.startswith("lens"):  # a KL off by δ = KL_ATOL a token, through each sum
                bound += KL_ATOL * float({"kl": sums["n"], "kl_sq": sums["n"],
                                          "text_kl_n": sums["text_n_sq"],
                                          "text_kl_sq": 2 * sums["text_kl_n"].max()}.get(key, 0))
            assert float((x.double() - y.double()).nan_to_num().abs().max()) <= bound, (name, key)


# pre-norm (a 16-bit-capable buffer), post-norm (stream norms rescale the buffer), sandwich
# (writes through norms), and framework families with reading-norm biases and GQA
@pytest.mark.parametrize("name", ["twin-post", "twin-sandwich", "llama", "gemma2", "bert", "gpt2"])
def test_replayed_survival_and_read_attribution_equal_the_eager_scan(name):
    """The flow statistics (one shared reducer) on the replayed path, padded to the scan width."""
    from tiny_hf import build

    from residual_stream.inputs import ByteTokenizer

    if name.startswith("twin"):
        m = rs.twin(norm="layernorm", placement=name[5:], n_layers=3, d_model=32, seed=2, n_ctx=64)
    else:
        m = rs.load(build(name), tokenizer=ByteTokenizer())
    eager, replayed, replay = _both(m, TEXTS, width=24, stats=("growth", *FLOW), batch_size=4,
                                    seq_len=24)
    assert replay.replays == 3 and replay.fallbacks == 0
    assert len({id(s) for e in replay.entries.values() for n, s in e.sums.items() if n in FLOW}) \
        <= len(replay.entries)  # survival and read attribution share one reducer per shape
    _assert_sums_close(eager, replayed, REL_PADDED)


SAMPLED = {  # statistics, and the fixed choices their static batch holds (every, or (every, among))
    "alike": (("growth", "survival:every=3", "read_attribution:every=3", "lens:every=3"), {3}),
    "reads only": (("survival", "read_attribution:every=3", "lens:every=2"), {3, 2}),
    "nested": (("growth", "survival:every=2", "read_attribution:every=4", "lens:every=4",
                "subspaces:every=6"),  # the buffer carries one in 2, the others pick theirs
               {2, (4, 2), 4, (6, 2)}),
}


@pytest.mark.parametrize("stats", list(SAMPLED))
@pytest.mark.parametrize("name", ["twin-post", "llama", "gemma2"])
def test_replayed_statistics_on_sampled_tokens_equal_the_eager_scan(name, stats):
    """Sampled survival, read attribution and lens replay from fixed-capacity choices refilled
    per batch (``sampling.StaticBatch``): every sum as the eager scan's, on the same tokens."""
    from tiny_hf import build

    from residual_stream.inputs import ByteTokenizer
    from residual_stream.streaming.sampling import TokenChoice

    m = (rs.twin(norm="layernorm", placement="post", n_layers=3, d_model=32, seed=2, n_ctx=64)
         if name.startswith("twin") else rs.load(build(name), tokenizer=ByteTokenizer()))
    specs, choices = SAMPLED[stats]
    eager, replayed, replay = _both(m, TEXTS * 2, width=24, stats=specs, batch_size=4, seq_len=24)
    assert all(a.replayable for a in replayed.values())
    assert replay.replays == 5 and replay.fallbacks == 0  # five batches of one shape, 4×24
    for entry in replay.entries.values():  # one fixed choice per rate (and nesting), as listed
        assert set(entry.batch.samples) == choices
        assert all(isinstance(c, TokenChoice) and c.sampled for c in entry.batch.samples.values())
    assert {n: int(a.sums["n"]) for n, a in eager.items() if n != "growth"} \
        == {n: int(a.sums["n"]) for n, a in replayed.items() if n != "growth"}
    _assert_sums_close(eager, replayed, REL_PADDED)


@pytest.mark.parametrize("name", ["twin-post", "twin-sandwich", "llama", "gemma2"])
def test_replayed_statistics_on_every_token_equal_the_eager_scan(name, monkeypatch):
    """Every statistic on every token replays: ``subspaces`` (its readers' bases made once per
    scan, at the warm-up: ``eigh`` then, never after), the lens (the plain forward pass for
    its logits in the same graph) and ``composition``; every sum is the eager scan's."""
    from tiny_hf import build

    from residual_stream.inputs import ByteTokenizer

    m = (rs.twin(norm="layernorm", placement=name[5:], n_layers=3, d_model=32, seed=2, n_ctx=64)
         if name.startswith("twin") else rs.load(build(name), tokenizer=ByteTokenizer()))
    events: list[str] = []  # eigendecompositions and replayed batches, in order
    eigh, add = torch.linalg.eigh, Replayed.add
    monkeypatch.setattr(torch.linalg, "eigh", lambda *a, **k: events.append("eigh") or eigh(*a, **k))
    monkeypatch.setattr(Replayed, "add", lambda self, b: events.append("batch") or add(self, b))
    stats = ("growth", "survival", "read_attribution", "subspaces", "lens", "composition")
    eager, replayed, replay = _both(m, TEXTS * 2, width=24, stats=stats, batch_size=4,
                                    seq_len=24)
    assert all(a.replayable for a in replayed.values())
    assert replay.replays == events.count("batch") > 2 and replay.fallbacks == 0
    second = events.index("batch", events.index("batch") + 1)
    assert "eigh" in events[:second] and "eigh" not in events[second:]  # both scans: once
    _assert_sums_close(eager, replayed, REL_PADDED)


def test_a_sample_larger_than_its_fixed_choice_takes_the_eager_pass(monkeypatch):
    """A fixed choice holds ``capacity`` tokens; a batch that samples more is done eagerly."""
    monkeypatch.setattr("residual_stream.streaming.sampling.capacity", lambda n, every: 2)
    m = rs.twin(norm="layernorm", placement="post", n_layers=3, d_model=32, seed=2, n_ctx=64)
    stats = ("survival:every=3", "read_attribution:every=3", "lens:every=3")
    eager, replayed, replay = _both(m, TEXTS * 2, width=24, stats=stats, batch_size=4, seq_len=24)
    assert replay.fallbacks == 5 and replay.replays == 0
    _assert_sums_close(eager, replayed, 0.0)


def test_a_fixed_choice_holds_the_sample_of_all_but_one_batch_in_millions():
    """``sampling.capacity`` against the exact binomial tail P(chosen > capacity), from
    log-space terms: at most 1e-6 over batch sizes and sampling rates, and each capacity no
    larger than the batch."""
    import math

    from residual_stream.streaming.sampling import capacity

    def tail(n: int, p: float, c: int) -> float:
        total, x = 0.0, c + 1
        while x <= n:
            term = math.exp(math.lgamma(n + 1) - math.lgamma(x + 1) - math.lgamma(n - x + 1)
                            + x * math.log(p) + (n - x) * math.log1p(-p))
            total, x = total + term, x + 1
            if term < 1e-30:
                break
        return total

    for n in (64, 1024, 16384, 65536):
        for every in (2, 3, 16, 64, 256, 1024):
            c = capacity(n, every)
            assert n / every < c <= n and tail(n, 1 / every, c) < 1e-6, (n, every, c)


def test_the_flow_reducers_host_side_state_depends_on_the_shape_only():
    """A CUDA graph replays kernels, not Python: what ``FlowSums`` keeps on the host (labels,
    how many marks and reads, their names) must be the same for any batch of one shape, so
    the capture's lists describe every replay."""
    from residual_stream.streaming import lean
    from residual_stream.streaming.flow import FlowSums

    m = rs.twin(norm="layernorm", placement="post", n_layers=3, d_model=32, seed=2, n_ctx=64)
    seen = []
    for batch in corpus_batches(m, Corpus(TEXTS * 2), batch_size=4, seq_len=16):
        if tuple(batch.tokens.shape) != (4, 16):
            continue
        f = FlowSums(m, batch.attention_mask)
        for name in FLOW:
            f.ask(name)
        lean.lean_pass(m, batch, [f])
        seen.append((f.labels, len(f.marks), [(r, n) for r, n, _, _ in f.reads], f.tail,
                     f.buf.shape, len(f.born)))
    assert len(seen) >= 2 and all(s == seen[0] for s in seen[1:])


def test_scan_uses_the_replay_when_it_can(model, monkeypatch):
    ref = rs.scan(model, TEXTS, ["growth"], batch_size=3, seq_len=16, progress=False)
    used, add = [], Replayed.add

    def counting(self, batch):
        used.append(batch)
        return add(self, batch)

    monkeypatch.setattr(Replayed, "usable", staticmethod(lambda m, accs: True))  # CPU: emulated
    monkeypatch.setattr(Replayed, "add", counting)
    got = rs.scan(model, TEXTS, ["growth"], batch_size=3, seq_len=16, progress=False)
    assert len(used) == 4  # every batch, padded to the scan's 16 positions
    _assert_same(ref.accumulators, got.accumulators, rel=REL_PADDED)


def test_a_replayed_batch_is_added_while_the_next_one_replays(model):
    """Growth's ``into`` for batch i runs after batch i+1's replay is queued, on copies of its
    sums: what the next replay writes into the graph's tensors does not reach them."""
    from residual_stream.streaming.growth import GrowthSums

    accs = make_accumulators(["growth"])
    replay = Replayed(model, accs, width=16, emulate=True)
    batches = list(corpus_batches(model, Corpus(TEXTS), batch_size=3, seq_len=16))
    replay.add(batches[0])
    assert replay.pending is not None and "n" not in accs["growth"].sums  # waits for batch 2
    entry = next(iter(replay.entries.values()))
    live = entry.sums["growth"]
    kept = replay.pending.sums["growth"]
    assert isinstance(kept, GrowthSums) and kept is not live

    def tensors(obj):
        for v in vars(obj).values():
            yield from (v,) if isinstance(v, torch.Tensor) else _nested(v)

    def _nested(v):
        if isinstance(v, (list, tuple)):
            for x in v:
                yield from (x,) if isinstance(x, torch.Tensor) else _nested(x)
        elif isinstance(v, dict):
            yield from _nested(list(v.values()))

    shared = {t.untyped_storage().data_ptr() for t in tensors(live)} \
        & {t.untyped_storage().data_ptr() for t in tensors(kept)}
    assert not shared  # a replay overwriting the graph's tensors leaves the kept sums alone
    with torch.inference_mode():  # as the next replay would: in place, same storage
        for t in tensors(live):
            t.zero_() if t.dtype == torch.bool else t.fill_(float("nan") if t.is_floating_point() else 7)
    for b in batches[1:]:
        replay.add(b)
    replay.flush()
    eager = make_accumulators(["growth"])
    for b in batches:
        _add_batch(model, b, eager)
    _assert_same(eager, accs, rel=REL_PADDED)
    assert replay.replays == len(batches) and replay.pending is None


def test_a_scan_adds_every_replayed_batch_before_it_saves(model, monkeypatch, tmp_path):
    from residual_stream.streaming import runner

    seen = []
    save = runner.save_state

    def spy(path, config, done, tokens, added, accs, ledger):
        seen.append((tokens, int(accs["growth"].sums["n"])))
        return save(path, config, done, tokens, added, accs, ledger)

    monkeypatch.setattr(Replayed, "usable", staticmethod(lambda m, accs: True))  # CPU: emulated
    monkeypatch.setattr(runner, "save_state", spy)
    rs.scan(model, TEXTS, ["growth"], batch_size=3, seq_len=16, progress=False,
            state=tmp_path / "state.pt", save_every=1)
    assert len(seen) >= 4 and all(tokens == n for tokens, n in seen)  # every token counted


def test_graphs_argument_is_checked(model):
    accs = make_accumulators(["growth", "survival"])
    with pytest.raises(InputError, match="CUDA device"):
        batch_adder(model, accs, True)  # a CPU model
    with pytest.raises(InputError, match="'auto', True or False"):
        batch_adder(model, accs, "yes")
    add = batch_adder(model, make_accumulators(["growth"]), "auto")  # CPU: the eager pass
    assert not isinstance(add, Replayed) and add.replays == 0


def test_a_replayed_pass_still_refuses_nan(model):
    from residual_stream.inputs import pack

    m = rs.twin(norm="rmsnorm", placement="pre", n_layers=2, d_model=16, seed=2, n_ctx=32)
    with torch.no_grad():
        m.module.blocks[1].mlp.fc_out.weight[0, 0] = float("nan")
    accs = make_accumulators(["growth"])
    replay = Replayed(m, accs, emulate=True)
    replay.add(pack(m, [[1, 2, 3]]))  # replayed; checked before the next batch's replay
    with pytest.raises(NonFiniteError, match="block 2"):
        replay.flush()
    assert int(accs["growth"].sums.get("n", torch.tensor(0))) == 0  # never added


def test_a_shape_that_cannot_be_captured_is_warned_about_and_added_eagerly(model, monkeypatch):
    def refuse(fn, device):
        raise RuntimeError("operation not permitted when stream is capturing")

    monkeypatch.setattr("residual_stream.streaming.graphs.record", refuse)
    eager, replayed = make_accumulators(["growth"]), make_accumulators(["growth"])
    replay = Replayed(model, replayed, width=16, emulate=False)  # as on a GPU: capture, refused
    with pytest.warns(RuntimeWarning, match="could not capture.*not permitted") as warned:
        for batch in corpus_batches(model, Corpus(TEXTS), batch_size=3, seq_len=16):
            _add_batch(model, batch, eager)
            replay.add(batch)
    assert len(warned) == 3 and replay.replays == 0  # once per shape: 3×16 padded or not, 2×16
    _assert_same(eager, replayed)


@pytest.mark.parametrize("flag,graphs", [([], "auto"), (["--no-graphs"], False)])
def test_cli_scan_passes_graphs_to_the_scan(tmp_path, monkeypatch, flag, graphs):
    import argparse

    from residual_stream.streaming import cli

    seen = {}

    def fake_scan(model, corpus, stats, **kw):
        seen.update(kw)
        raise InputError("stop here")

    monkeypatch.setattr("residual_stream.streaming.runner.scan", fake_scan)
    monkeypatch.setattr("residual_stream.loading.load", lambda *a, **k: None)
    args = cli.add_arguments(argparse.ArgumentParser()).parse_args(
        ["twin-pre-rms", "builtin", "--out", str(tmp_path / "x.json"), *flag])
    with pytest.raises(InputError, match="stop here"):
        cli.run(args)
    assert seen["graphs"] == graphs


def test_first_candidates_in_token_order_without_a_sync():
    from residual_stream.streaming.massive import first_k, point_sums

    x = torch.zeros(1, 5, 8)
    x[0, [1, 2, 4], 3] = 500.0  # three tokens each with one massive coordinate
    mask = torch.ones(1, 5, dtype=torch.bool)
    _, _, flags, count = point_sums(x, mask)
    assert int(count) == 3 and flags.tolist() == [[False, True, True, False, True]]
    idx, valid = first_k(flags.flatten(), count, 2)
    assert idx.tolist() == [1, 2] and valid.tolist() == [True, True]
    idx, valid = first_k(flags.flatten(), count, 4)
    assert idx[:3].tolist() == [1, 2, 4] and valid.tolist() == [True, True, True, False]
    assert idx[3] not in (1, 2, 4)
    mask[0, 2] = False  # padding is never a candidate
    _, _, flags, count = point_sums(x, mask)
    idx, valid = first_k(flags.flatten(), count, 3)
    assert int(count) == 2 and idx[:2].tolist() == [1, 4] and valid.tolist() == [True, True, False]
    # against a Python loop: the first k true entries, in order
    many = torch.rand(1000, generator=torch.Generator().manual_seed(0)) < 0.3
    expected = [i for i, f in enumerate(many.tolist()) if f]
    idx, valid = first_k(many, many.sum(), 50)
    assert idx.tolist() == expected[:50] and bool(valid.all())


def test_fused_compiles_on_cuda_only_and_falls_back_once_if_compiling_fails(monkeypatch):
    from types import SimpleNamespace

    from residual_stream import fusion

    calls = []

    def broken_compile(fn, **kw):
        calls.append("compile")

        def run(*args):
            raise RuntimeError("no compiler here")
        return run

    monkeypatch.setattr(torch, "compile", broken_compile)
    f = fusion.fused(lambda t: ("eager", t.device.type))
    assert f(torch.zeros(1)) == ("eager", "cpu") and calls == []  # the CPU never compiles
    gpu_like = SimpleNamespace(device=torch.device("cuda", 0))
    with pytest.warns(RuntimeWarning, match="torch.compile failed.*no compiler here"):
        assert f(gpu_like) == ("eager", "cuda")
    assert f(gpu_like) == ("eager", "cuda") and calls == ["compile"]  # not tried again
    monkeypatch.setattr(fusion, "ENABLED", False)
    g = fusion.fused(lambda t: "eager")
    assert g(gpu_like) == "eager" and calls == ["compile"]
    h = fusion.fused(lambda t: "for the compiler", eager=lambda t: "chunked")
    assert h(torch.zeros(1)) == "chunked" and h(gpu_like) == "chunked"  # eager wherever not compiled
    monkeypatch.setattr(fusion, "ENABLED", True)
    with pytest.warns(RuntimeWarning, match="torch.compile failed"):
        assert h(gpu_like) == "chunked" and calls == ["compile"] * 2  # and after a failure


def test_only_a_model_whole_on_one_device_is_replayed():
    from residual_stream.streaming.graphs import on_one_device

    m = rs.twin(norm="rmsnorm", placement="pre", n_layers=2, d_model=16, seed=2, n_ctx=32)
    assert on_one_device(m.module, torch.device("cpu"))
    assert not on_one_device(m.module, torch.device("cuda", 0))
    block = m.module.blocks[1].mlp.fc_out
    block.weight = torch.nn.Parameter(torch.empty_like(block.weight, device="meta"))  # offloaded
    assert not on_one_device(m.module, torch.device("cpu"))
    assert not Replayed.usable(m, make_accumulators(["growth"]))


_READ_BACKS = ("item", "tolist", "__bool__", "__int__", "__float__", "__index__", "nonzero",
               "numpy", "cpu")
# functions that wait for the device on CUDA (a comparison's answer, cuSOLVER's error check)
# or copy host values to it (a tensor made from Python numbers)
_WAITING_CALLS = ((torch, "equal"), (torch.linalg, "eigh"), (torch, "tensor"))


def _count_reads(monkeypatch) -> list[str]:
    """Record every tensor value the package's own code reads into Python from now on."""
    import traceback

    reads: list[str] = []

    def counting(method):
        def run(self, *args, **kwargs):
            caller = traceback.extract_stack(limit=2)[0]  # the line that asked for the value
            if "residual_stream" in caller.filename:
                reads.append(f"{method} at {caller.filename}:{caller.lineno}")
            return getattr(torch.Tensor, f"_orig_{method}")(self, *args, **kwargs)
        return run

    for method in _READ_BACKS:
        monkeypatch.setattr(torch.Tensor, f"_orig_{method}", getattr(torch.Tensor, method),
                            raising=False)
        monkeypatch.setattr(torch.Tensor, method, counting(method))

    def calling(name, fn):
        def run(*args, **kwargs):
            caller = traceback.extract_stack(limit=2)[0]
            if "residual_stream" in caller.filename:
                reads.append(f"{name} at {caller.filename}:{caller.lineno}")
            return fn(*args, **kwargs)
        return run

    for owner, name in _WAITING_CALLS:
        monkeypatch.setattr(owner, name, calling(name, getattr(owner, name)))
    return reads


@pytest.mark.parametrize("name", ["twin", "llama"])
def test_a_replayable_pass_never_reads_a_value_back_to_the_host(name, monkeypatch):
    """What a CUDA graph cannot capture, found on the CPU: a tensor's value read into Python.

    Counted where the package's own code asks for one during the replayable pass (the tiny
    Llama's mask check in ``transformers.masking_utils`` reads one eagerly; under capture
    transformers skips it, as the device run showed). The eager reducer's search, which
    counts its candidates, is the positive control. Every statistic, sampled and on every
    token, is checked as a capture runs it: on a ``StaticBatch`` whose fixed choices a
    warm-up pass made, as it made the readers' bases (its ``eigh``, the grouped-query
    comparison and the slots' index tensors: the second positive control).
    """
    from tiny_hf import build

    from residual_stream.inputs import ByteTokenizer
    from residual_stream.streaming.lean import lean_forward, points
    from residual_stream.streaming.sampling import StaticBatch

    m = rs.load(build("llama"), tokenizer=ByteTokenizer()) if name == "llama" else _planted_twin()
    batch = next(iter(corpus_batches(m, Corpus(TEXTS), batch_size=4, seq_len=24)))
    static = StaticBatch.on(batch, m.device)
    sampled = make_accumulators(["growth", "survival:every=3", "read_attribution:every=3",
                                 "lens:every=3", "subspaces:every=3"])
    full = make_accumulators(["growth", "survival", "read_attribution", "lens", "subspaces",
                              "composition"])
    for accs in (sampled, full):
        for a in accs.values():
            a.prepare(m, points(m, batch))

    def run_sampled() -> None:
        for accs in (sampled, full):
            shared: dict = {}
            sums = [a.sums_for(m, static, shared, replayable=True) for a in accs.values()]
            lean_forward(m, static, list(dict.fromkeys(sums)))

    reads = _count_reads(monkeypatch)
    run_sampled()  # the warm-up: makes the fixed choices (reads the batch's sample) and bases
    assert set(static.samples) == {3}
    made = {r.split(" at ")[0] for r in reads}
    assert {"eigh", "tensor", "nonzero"} <= made and ("equal" in made) == (name == "llama"), made
    for replayable, expect_reads in ((True, False), (False, True)):
        reads.clear()
        sums = make_accumulators(["growth"])["growth"].sums_for(m, batch, {}, replayable)
        lean_forward(m, batch, [sums])
        assert bool(reads) == expect_reads, reads
    reads.clear()
    run_sampled()
    assert not reads, reads


def test_a_flow_reducer_adds_the_same_sums_every_time_into_runs():
    """A replay calls ``into`` on the same ``FlowSums`` for every batch (its layout of read
    attribution is made once, its rounding checks kept): each call adds what the first did."""
    from residual_stream.streaming import lean
    from residual_stream.streaming.flow import FlowSums

    m = rs.twin(norm="layernorm", placement="post", n_layers=3, d_model=32, seed=2, n_ctx=64)
    batch = next(iter(corpus_batches(m, Corpus(TEXTS), batch_size=4, seq_len=16)))
    f = FlowSums(m, batch.attention_mask)
    for name in FLOW:
        f.ask(name)
    lean.lean_pass(m, batch, [f])
    first, again = make_accumulators(list(FLOW)), make_accumulators(list(FLOW))
    for accs in (first, again):
        for acc in accs.values():
            f.into(acc)
    assert f.layout is not None
    for name in FLOW:
        assert first[name].meta == again[name].meta
        for key, x in first[name].sums.items():
            assert torch.equal(x.nan_to_num(), again[name].sums[key].nan_to_num()), (name, key)
