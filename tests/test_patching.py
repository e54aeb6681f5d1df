"""Stream patching (``rs.patch_stream``) against hooks of the test's own on the Hugging Face module."""

import warnings

import pytest
import torch
from conftest import TEXTS, hooks_of, metric_failing_after_clean
from tiny_hf import build

import residual_stream as rs
from residual_stream.errors import InputError, NotAvailableError, OutOfRangeError, UnknownNameError
from residual_stream.inputs import ByteTokenizer

ATOL = 2e-5  # float32: a patched run stacked with others vs alone (batched matmuls round differently)
CORRUPT = [t[:4] + "X" + t[5:] for t in TEXTS]  # one byte differs: token 5 (after BOS)
BLOCKS = {"llama": "model.layers", "gpt2": "transformer.h", "gemma2": "model.layers",
          "gpt_neox_parallel": "gpt_neox.layers", "bert_mlm": "bert.encoder.layer",
          "opt": "model.decoder.layers", "opt_post": "model.decoder.layers"}  # OPT: MLPs on flat tokens


def _diff(trace):
    """The metric: logit(101) − logit(32) at each row's last real token and at token 6 (just
    after the corrupted one: a bidirectional model's last token barely sees it), mean over rows."""
    last = trace.attention_mask.sum(1) - 1
    rows = torch.arange(len(last))
    return lambda logits: (logits[rows, last, 101] - logits[rows, last, 32]
                           + logits[:, 6, 101] - logits[:, 6, 32]).mean()


def _setup(name):
    module = build(name)
    with torch.no_grad():  # writes large enough that patching one token moves the metric
        for n, w in module.named_parameters():
            if n.endswith(("o_proj.weight", "down_proj.weight", "c_proj.weight", "dense.weight",
                           "dense_4h_to_h.weight", "output.dense.weight", "experts.down_proj",
                           "self_attn.out_proj.weight", "fc2.weight")):
                w.mul_(10)
    model = rs.load(module, tokenizer=ByteTokenizer())
    return module, model, rs.trace(model, TEXTS), rs.trace(model, CORRUPT)


def _by_hand(module, blocks, tokens, mask, reference_tokens, point, where, metric):
    """The HF module run on the reference with our own hooks recording the stream at ``point``
    (block input, or the last block's output), then on the clean tokens with it written in
    at ``where`` [batch, pos]; the metric of those logits."""
    n, seen = len(blocks), []
    block = blocks[min(point, n - 1)]

    def record_pre(m, args, kwargs):
        seen.append((args[0] if args else kwargs["hidden_states"]).clone())

    def record_post(m, args, out):
        seen.append((out[0] if isinstance(out, tuple) else out).clone())

    def patch_pre(m, args, kwargs):
        x = args[0] if args else kwargs["hidden_states"]
        x = torch.where(where[..., None], seen[0], x)
        return ((x, *args[1:]), kwargs) if args else (args, {**kwargs, "hidden_states": x})

    def patch_post(m, args, out):
        x = out[0] if isinstance(out, tuple) else out
        x = torch.where(where[..., None], seen[0], x)
        return (x, *out[1:]) if isinstance(out, tuple) else x

    with torch.no_grad():
        for inputs, pre, post in ((reference_tokens, record_pre, record_post),
                                  (tokens, patch_pre, patch_post)):
            h = block.register_forward_pre_hook(pre, with_kwargs=True) if point < n \
                else block.register_forward_hook(post)
            try:
                logits = module(input_ids=inputs, attention_mask=mask).logits
            finally:
                h.remove()
    return float(metric(logits.double()))


@pytest.mark.parametrize("name", list(BLOCKS))
def test_patching_the_stream_matches_hooks_of_our_own(name):
    """Every stream point × four positions (the corrupted token, one before it, one after, the
    last real token), batched 5 per pass, against the HF module patched by the test's hooks."""
    module, model, clean, other = _setup(name)
    metric = _diff(clean)
    positions = [4, 5, 7, -1]
    got = rs.patch_stream(clean, other, metric, positions=positions, batch_size=5)
    blocks = list(module.get_submodule(BLOCKS[name]))
    n = len(blocks)
    assert got.points == tuple(range(n + 1)) and got.positions == tuple(positions)
    lengths = clean.attention_mask.sum(1)
    moved = 0
    for i in range(n + 1):
        for j, p in enumerate(positions):
            where = torch.zeros_like(clean.attention_mask, dtype=torch.bool)
            where[torch.arange(2), lengths + p if p < 0 else torch.full_like(lengths, p)] = True
            want = _by_hand(module, blocks, clean.tokens, clean.attention_mask, other.tokens, i, where,
                            metric)
            assert float(got.metric[i, j]) == pytest.approx(want, abs=ATOL), (i, p)
            moved += abs(want - got.metric_clean) > 10 * ATOL
    assert moved >= n  # the check has teeth: patches move the metric
    assert got.metric_clean == pytest.approx(float(metric(clean.logits)), abs=1e-6)
    assert got.metric_reference == pytest.approx(float(metric(other.logits)), abs=1e-6)
    if model.anatomy.causal:  # before the corrupted token the two runs are equal: nothing to run
        assert not got.run[:, 0].any() and got.run[:, 1].all()
        assert (got.metric[:, 0] == got.metric_clean).all()


def test_patching_the_only_differing_token_at_the_embedding_gives_the_reference_run():
    """Point 0 holds the embeddings: patching the one token that differs there *is* the
    corrupted run, so the metric is the reference's (and its share 1); at the last point the
    last token's state is all the final logits read there."""
    _, model, clean, other = _setup("llama")
    last = clean.attention_mask.sum(1) - 1

    def metric(logits):  # read at the last token only
        return (logits[[0, 1], last, 101] - logits[[0, 1], last, 32]).mean()

    got = rs.patch_stream(clean, other, metric, points=[0, -1], positions=[5, -1])
    assert float(got.metric[0, 0]) == pytest.approx(got.metric_reference, abs=ATOL)
    assert float(got.metric[1, 1]) == pytest.approx(got.metric_reference, abs=ATOL)
    assert float(got.share()[0, 0]) == pytest.approx(1.0, abs=1e-4)
    assert float(got.metric[1, 0]) == pytest.approx(got.metric_clean, abs=ATOL)  # token 5's last state
    assert abs(got.metric_reference - got.metric_clean) > 100 * ATOL


def test_batched_patches_equal_patches_one_at_a_time_and_the_frame_is_the_grid():
    _, model, clean, other = _setup("gpt2")
    metric = _diff(clean)
    one = rs.patch_stream(clean, other, metric, batch_size=1)
    many = rs.patch_stream(clean, other, metric, batch_size=64)
    assert one.metric.shape == (model.anatomy.n_layers + 1, clean.tokens.shape[1])
    assert torch.allclose(one.metric, many.metric, atol=ATOL) and torch.equal(one.run, many.run)
    frame = many.to_frame()
    assert len(frame) == many.metric.numel()
    row = frame[(frame.point == 2) & (frame.position == 5)].iloc[0]
    assert row.metric == pytest.approx(float(many.metric[2, 5]))
    assert row.metric_change == pytest.approx(float(many.metric[2, 5]) - many.metric_clean, abs=1e-6)
    assert row.token == clean.str_tokens[0][5] == "c"
    # positions past row 0's end are pads there: patched in row 1 only, labelled ""
    assert many.tokens[-1] == "" and bool(many.run[1, -1])
    assert "StreamPatching(points=(4 items)" in repr(many) and len(repr(many)) < 300


def test_patching_leaves_the_model_as_it_was_even_when_the_metric_fails():
    module, model, clean, other = _setup("llama")
    before = hooks_of(module)
    bad = metric_failing_after_clean()

    with pytest.raises(RuntimeError, match="metric failed"):
        rs.patch_stream(clean, other, bad)
    assert hooks_of(module) == before
    with torch.no_grad():  # and it computes as before: no patch left behind
        logits = module(input_ids=clean.tokens, attention_mask=clean.attention_mask).logits
    assert torch.allclose(logits, clean.logits, atol=1e-5)


def test_patch_stream_refuses_bad_arguments_saying_what_to_pass():
    _, model, clean, other = _setup("llama")
    metric = _diff(clean)
    shorter = rs.trace(model, [t[:-1] for t in TEXTS])
    with pytest.raises(InputError, match="reference=rs.trace"):
        rs.patch_stream(clean, None, metric)
    with pytest.raises(InputError, match="same token length"):
        rs.patch_stream(clean, shorter, metric)
    with pytest.raises(InputError, match="metric is a function of the logits"):
        rs.patch_stream.__wrapped__(clean, other, 3.0)  # a user's call, past the tests' type checker
    with pytest.raises(InputError, match="returns one number"):
        rs.patch_stream(clean, other, lambda logits: logits[:, -1, :2], points=[1])
    with pytest.raises(OutOfRangeError, match=r"a stream point is in 0..3"):
        rs.patch_stream(clean, other, metric, points=[4])
    with pytest.raises(OutOfRangeError, match=r"a stream point is in 0..3"):
        rs.patch_stream(clean, other, metric, points=[-5])
    with pytest.raises(InputError, match="points is empty"):
        rs.patch_stream(clean, other, metric, points=[])
    with pytest.raises(InputError, match="position 30 is outside a row of 25 real tokens"):
        rs.patch_stream(clean, other, metric, positions=[30])
    with pytest.raises(InputError, match="token indices"):
        rs.patch_stream.__wrapped__(clean, other, metric, positions="last")
    with pytest.raises(InputError, match="batch_size is the number of patched runs"):
        rs.patch_stream(clean, other, metric, batch_size=0)
    with pytest.raises(InputError, match="batch_size is the number of patched runs"):
        rs.patch_stream.__wrapped__(clean, other, metric, batch_size=2.5)
    headless = rs.load(build("bert"), tokenizer=ByteTokenizer())
    with pytest.raises(NotAvailableError, match="metric reads logits"):
        rs.patch_stream(rs.trace(headless, TEXTS), rs.trace(headless, CORRUPT), metric)


def test_patching_figure_shows_the_share_per_point_and_token():
    """The heatmap's cells are the result's share (or change), rows the points, columns the
    first text's tokens as shown (a space as ␣)."""
    from residual_stream.plotting import patching_figure

    _, model, clean, other = _setup("gpt2")
    got = rs.patch_stream(clean, other, _diff(clean), points=[0, 2], positions=[3, 4, 5])
    fig = patching_figure(got)
    z = torch.tensor(fig.data[0].z, dtype=torch.float32)
    assert torch.allclose(z, got.share().float(), equal_nan=True) and list(fig.data[0].y) == [0, 2]
    assert list(fig.data[0].x) == ["3 e", "4 ␣", "5 c"]  # "<bos>The capital": token 4 is the space
    change = torch.tensor(patching_figure(got, "change").data[0].z, dtype=torch.float32)
    assert torch.allclose(change, (got.metric - got.metric_clean).float())
    with pytest.raises(InputError, match=r"measure must be one of \['share', 'change'\], not 'kl'"):
        patching_figure(got, "kl")


@pytest.mark.parametrize("mode", ["patch", "mean", "zero"])
@pytest.mark.parametrize("reads", [False, True])
def test_ablated_runs_stacked_in_one_pass_equal_runs_one_at_a_time(mode, reads):
    """``ablation_check`` stacks ``batch_size`` ablated runs per pass, each copy's hook confined
    to its rows: two heads of one layer, that layer's whole attention and its MLP land in one
    pass next to each other; every output (with reads, every later read's change, walked from
    the copy's rows of the capture) equals the run alone (``batch_size=1``, which the tests
    against the HF module's own hooks in ``test_analyses.py`` pin down)."""
    _, model, clean, other = _setup("llama")
    writes = ["L1H0", "L1H2", "L1.attn", "L1.mlp", "L0H3", "L2.mlp", "L0.attn"]
    ref = other if mode != "zero" else None
    kw = dict(writes=writes, mode=mode, reference=ref, metric=_diff(clean), reads=reads)
    for positions in (None, [5, -1]):
        one = rs.ablation_check(clean, batch_size=1, positions=positions, **kw)
        stacked = rs.ablation_check(clean, batch_size=3, positions=positions, **kw)
        for col in ("logit_kl", "last_kl", "top_logit_change", "loss_change", "metric"):
            want = one.outputs()[col].to_numpy()
            assert stacked.outputs()[col].to_numpy() == pytest.approx(want, abs=ATOL), (col, positions)
        assert (one.outputs().metric_change.abs() > 10 * ATOL).sum() >= 5  # the writes matter
        assert torch.allclose(stacked.effect, one.effect, atol=1e-6, equal_nan=True)
        assert (one.effect > 1e-3).sum() >= (5 if reads else 0) and one.effect.isnan().all() == (not reads)


def test_stacked_captures_keep_to_their_budget(monkeypatch):
    """With reads, a pass holds no more copies than keep their captures within the budget: two
    copies' worth of ``memory.trace_bytes`` gives passes of at most two copies."""
    import residual_stream.analyses.ablation as ablation
    from residual_stream.memory import trace_bytes

    module, model, clean, other = _setup("llama")
    b = clean.tokens.shape[0]
    monkeypatch.setattr(ablation, "CAPTURE_BUDGET",
                        2 * trace_bytes(model.anatomy, tuple(clean.tokens.shape), heads=False))
    seen = []
    handle = module.model.embed_tokens.register_forward_hook(lambda m, a, out: seen.append(out.shape[0]))
    try:
        check = rs.ablation_check(clean, writes=["L0H0", "L0H1", "L1.mlp", "L2.attn", "L2.mlp"])
    finally:
        handle.remove()
    assert seen == [b, 2 * b, 2 * b, b]  # the clean pass, then 2 + 2 + 1 ablated runs
    assert check.effect.shape == (5, 6)


def test_outputs_only_of_a_model_without_an_lm_head_is_refused():
    headless = rs.load(build("bert"), tokenizer=ByteTokenizer())
    with pytest.raises(NotAvailableError, match="reads=False measures only the output, the logits"):
        rs.ablation_check(rs.trace(headless, TEXTS), writes=["L0.attn"], reads=False)
    with pytest.raises(InputError, match="batch_size is the number of ablated runs"):
        rs.ablation_check.__wrapped__(rs.trace(headless, TEXTS), batch_size=-1)


def test_default_stack_fits_the_logit_budget_and_equals_one_run_per_pass(monkeypatch):
    """``batch_size=None`` stacks as many runs as keep their logits and activations
    (``memory.pass_bytes``) within the budget: with it set to three copies' worth, every pass holds at most
    three copies of the batch (counted at the model's input), and the grid equals one run per
    pass. Metrics are float64: a constant offset of 300 leaves the shares as they were."""
    import residual_stream.analyses.patching as patching
    from residual_stream.memory import pass_bytes

    module, model, clean, other = _setup("llama")
    b = clean.tokens.shape[0]
    monkeypatch.setattr(patching, "STACK_BUDGET",
                        3 * pass_bytes(model.anatomy, tuple(clean.tokens.shape), 4) + 1)
    seen = []
    handle = module.model.embed_tokens.register_forward_hook(lambda m, a, out: seen.append(out.shape[0]))
    try:
        got = rs.patch_stream(clean, other, _diff(clean), positions=[5, 6, -1])
    finally:
        handle.remove()
    runs = int(got.run.sum())
    assert seen.count(1) == 1  # skipping's probe of how blocks return: one token, once per model
    seen.remove(1)
    assert max(seen) == 3 * b and sum(seen) == runs * b and len(seen) == -(-runs // 3)
    one = rs.patch_stream(clean, other, _diff(clean), positions=[5, 6, -1], batch_size=1)
    assert torch.allclose(got.metric, one.metric, atol=ATOL) and got.metric.dtype == torch.float64
    offset = rs.patch_stream(clean, other, lambda logits: 300 + _diff(clean)(logits.double()),
                             positions=[5, 6, -1], batch_size=1)
    assert torch.allclose(offset.share(), one.share(), atol=1e-9, equal_nan=True)
    monkeypatch.setattr(patching, "STACK_BUDGET", 1)  # less than one copy: one run per pass
    assert patching.stack_size(clean, None, "runs") == 1
    monkeypatch.setattr(patching, "STACK_BUDGET", 2**40)
    assert patching.stack_size(clean, None, "runs") == patching.MAX_STACK


@pytest.mark.parametrize("name", ["llama", "gpt2", "gemma2", "bert_mlm"])
def test_logits_at_unembeds_only_the_positions_the_metric_reads(name):
    """The metric reads each row's last real token and token 6: with ``logits_at=[-1, 6]``
    every patched pass's unembedding computes those columns only (a spy on its output: 3
    of them, the two rows differing in length), and stream and path patching give what the
    full logits give (``ATOL``: the unembedding's product over fewer rows). Gemma 2 caps its
    logits after the unembedding; BERT's MLM head transforms every position before it."""
    module, model, clean, other = _setup(name)
    metric, last = _diff(clean), clean.attention_mask.sum(1) - 1
    widths = []  # of the unembedding's output in each pass (not skipping's one-token probe)
    handle = module.get_output_embeddings().register_forward_hook(
        lambda m, args, out: widths.append(out.shape[1]) if out.shape[0] > 1 else None)
    try:
        stream = rs.patch_stream(clean, other, metric, points=[1, 3], logits_at=[-1, 6])
        paths = rs.path_patch(clean, other, metric, receivers=["logits", "L2.attn"], logits_at=[-1, 6])
    finally:
        handle.remove()
    assert len(set(last.tolist()) | {6}) == 3 and widths and set(widths) == {3}
    full_stream = rs.patch_stream(clean, other, metric, points=[1, 3])
    full_paths = rs.path_patch(clean, other, metric, receivers=["logits", "L2.attn"])
    torch.testing.assert_close(stream.metric, full_stream.metric, atol=ATOL, rtol=0)
    torch.testing.assert_close(paths.metric, full_paths.metric, atol=ATOL, rtol=0)
    assert torch.equal(stream.run, full_stream.run) and torch.equal(paths.run, full_paths.run)
    assert float((full_stream.metric - full_stream.metric_clean).abs().max()) > 100 * ATOL


def test_logits_at_takes_a_mask_and_refuses_a_metric_reading_elsewhere_before_any_run():
    """A ``[batch, pos]`` mask names the positions as the indices do; a per-text metric keeps
    its per-text results. A metric reading a position outside ``logits_at`` is refused before
    any forward pass (the clean run's metric, NaN there, is checked first), saying which
    positions were named, and the model is left as it was; so is a position outside a row."""
    module, model, clean, other = _setup("llama")
    last = clean.attention_mask.sum(1) - 1
    rows = torch.arange(len(last))

    def per_text(logits):
        return logits[rows, last, 101] - logits[rows, last, 32]

    mask = torch.zeros_like(clean.attention_mask, dtype=torch.bool)
    mask[rows, last] = True
    narrow = rs.patch_stream(clean, other, per_text, points=[2], logits_at=mask)
    full = rs.patch_stream(clean, other, per_text, points=[2])
    torch.testing.assert_close(narrow.per_text, full.per_text, atol=ATOL, rtol=0)
    before, calls = hooks_of(module), []
    module.register_forward_pre_hook(lambda m, a: calls.append(1))
    with pytest.raises(InputError, match=r"the metric reads logits outside logits_at=-1 \(positions "):
        rs.patch_stream(clean, other, _diff(clean), logits_at=-1)
    with pytest.raises(InputError, match="reads logits outside logits_at"):
        rs.path_patch(clean, other, _diff(clean), logits_at=[-1])
    with pytest.raises(InputError, match="logits_at: position 40 is outside a row"):
        rs.path_patch(clean, other, per_text, logits_at=40)
    c6 = clean.logits[:, 6, 101].clone()
    assert bool((c6.abs() > 0.03).all())

    def hidden(logits):  # reads token 6 through a comparison that NaN leaves False, as the clean run does
        return per_text(logits) + ((logits[:, 6, 101] - c6).abs() > 0.05).float()

    with pytest.raises(InputError, match="with the other positions changed it gives"):
        rs.patch_stream(clean, other, hidden, logits_at=-1)
    assert not calls and hooks_of(module)[1:] == before[1:]

    def partly_nan(logits):  # a clean value that is NaN is its own value, not a mismatch
        return torch.stack([per_text(logits)[0], torch.tensor(float("nan"))])

    nan = rs.patch_stream(clean, other, partly_nan, points=[2], logits_at=-1)
    torch.testing.assert_close(nan.per_text[..., 0], full.per_text[..., 0], atol=ATOL, rtol=0)


def test_the_default_stack_counts_a_long_texts_attention_not_only_its_logits(smollm2):
    """A copy of a 4096-token text adds SmolLM2's eager attention scores and probabilities,
    2 · 9 heads · 4096² float32 values (1.2 GB; so in bf16 too, whose eager softmax runs in
    float32), to a pass whatever the logits: one copy per pass
    even with ``logits_at=-1``, where the logits alone (a row of 49,152 a text) would stack
    the most (16). A short text's copies stack the most either way."""
    from types import SimpleNamespace

    import residual_stream.analyses.patching as patching
    from residual_stream.memory import pass_bytes

    anatomy = smollm2.anatomy
    one = torch.tensor([0])

    def fake(pos):
        return SimpleNamespace(anatomy=anatomy, tokens=torch.zeros(1, pos, dtype=torch.long),
                               model=SimpleNamespace(dtype=torch.float32))

    scores = 2 * anatomy.n_heads * 4096**2 * 4  # eager attention's, float32, one copy
    assert anatomy.n_heads == 9 and scores > 2**30 and pass_bytes(anatomy, (1, 4096), 4, 1) > 2**30
    assert pass_bytes(anatomy, (1, 4096), 2, 1) > scores  # bf16: the softmax is float32
    assert patching.stack_size(fake(4096), None, "runs", one) == 1
    assert 16 * anatomy.d_vocab * 4 < 2**30  # the logits alone would allow every copy
    assert patching.stack_size(fake(14), None, "runs", one) == patching.MAX_STACK
    assert patching.stack_size(fake(14), None, "runs") == patching.MAX_STACK


def test_points_as_bools_or_strings_are_refused():
    from residual_stream.errors import as_index

    _, model, clean, other = _setup("llama")
    assert as_index(torch.tensor(True)) is None and as_index(torch.tensor(2)) == 2
    for bad in (torch.tensor(True), "12", [True]):
        with pytest.raises((InputError, OutOfRangeError), match="stream point"):
            rs.patch_stream.__wrapped__(clean, other, _diff(clean), points=bad)
    with pytest.raises(InputError, match="batch_size"):
        rs.patch_stream.__wrapped__(clean, other, _diff(clean), batch_size=torch.tensor(True))


def _nudged_metric(module, blocks, tokens, mask, reference_tokens, point, where, metric, eps):
    """The metric with the clean stream at ``point`` moved by ``eps · (reference − clean)`` at
    ``where``: both states recorded, then the nudge written, by the test's own hooks."""
    n, seen = len(blocks), {}
    block = blocks[min(point, n - 1)]

    def get(x):
        return x[0] if isinstance(x, tuple) else x

    def record(key):
        if point < n:
            return block.register_forward_pre_hook(
                lambda m, args, kwargs: seen.__setitem__(key, (args[0] if args else kwargs["hidden_states"])),
                with_kwargs=True)
        return block.register_forward_hook(lambda m, args, out: seen.__setitem__(key, get(out)))

    with torch.no_grad():
        for key, inputs in (("ref", reference_tokens), ("clean", tokens)):
            h = record(key)
            module(input_ids=inputs, attention_mask=mask)
            h.remove()
        step = torch.where(where[..., None], eps * (seen["ref"] - seen["clean"]), 0)
        if point < n:
            h = block.register_forward_pre_hook(
                lambda m, args, kwargs: ((args[0] + step, *args[1:]), kwargs) if args
                else (args, {**kwargs, "hidden_states": kwargs["hidden_states"] + step}), with_kwargs=True)
        else:
            h = block.register_forward_hook(
                lambda m, args, out: (out[0] + step, *out[1:]) if isinstance(out, tuple) else out + step)
        try:
            return float(metric(module(input_ids=tokens, attention_mask=mask).logits))
        finally:
            h.remove()


# (ε, relative tolerance) of the central difference. GPT-2 and BERT compute in float64 throughout
# (error O(ε²); the tolerance is the trace's float32 copy of the two states, whose difference Δ
# the library uses); Llama's and Gemma 2's RMSNorm casts to float32 inside, whose rounding (~1e-7
# of each activation) an ε below ~1e-2 divides into noise (ε = 1e-4 is 1 % off), so a larger ε
STEPS = {"gpt2": (1e-5, 1e-4), "bert_mlm": (1e-5, 1e-4), "llama": (3e-2, 2e-3), "gemma2": (3e-2, 2e-3),
         "opt": (1e-5, 1e-4), "opt_post": (1e-5, 1e-4)}


@pytest.mark.parametrize("name", list(STEPS))
def test_attribution_patching_is_the_derivative_along_each_patch(name):
    """Each cell is ``clean + ∂metric/∂x · Δx``: with the model in float64 it equals the central
    difference ``(m(x + εΔ) − m(x − εΔ)) / 2ε`` of the HF module nudged by the test's own hooks.
    The parameters' gradients and modes are left as they were. Against real patching it is an
    estimate, not pinned here; the grid has the same axes and measured clean and reference values."""
    module, _, _, _ = _setup(name)
    module = module.double()
    model = rs.load(module, tokenizer=ByteTokenizer())
    clean, other = rs.trace(model, TEXTS), rs.trace(model, CORRUPT)
    metric = _diff(clean)
    positions = [5, 6, -1]
    got = rs.attribution_patching(clean, other, metric, positions=positions)
    assert got.method == "attribution" and not got.run.any() and got.metric.shape == (4, 3)
    blocks = list(module.get_submodule(BLOCKS[name]))
    lengths = clean.attention_mask.sum(1)
    (eps, rel), checked = STEPS[name], 0
    for i in range(len(blocks) + 1):
        for j, p in enumerate(positions):
            where = torch.zeros_like(clean.attention_mask, dtype=torch.bool)
            where[torch.arange(2), lengths + p if p < 0 else torch.full_like(lengths, p)] = True
            args = (module, blocks, clean.tokens, clean.attention_mask, other.tokens, i, where, metric)
            slope = (_nudged_metric(*args, eps) - _nudged_metric(*args, -eps)) / (2 * eps)
            estimate = float(got.metric[i, j]) - got.metric_clean
            assert estimate == pytest.approx(slope, rel=rel, abs=1e-9), (i, p)
            checked += abs(slope) > 1e-4
    assert checked >= 4
    assert all(p.grad is None for p in module.parameters()) and not module.training
    exact = rs.patch_stream(clean, other, metric, positions=positions)
    assert exact.points == got.points and exact.tokens == got.tokens
    assert exact.metric_clean == got.metric_clean and exact.metric_reference == got.metric_reference


def test_attribution_patching_needs_a_differentiable_metric():
    _, model, clean, other = _setup("llama")
    with pytest.raises(InputError, match=r"no \.item\(\), float\(\)"):
        rs.attribution_patching(clean, other, lambda logits: logits[0, -1, 0].item())
    with pytest.raises(InputError, match="reference=rs.trace"):
        rs.attribution_patching(clean, None, _diff(clean))
    with pytest.raises(InputError, match=r"no \.item\(\), float\(\)"):
        rs.attribution_patching_writes(clean, other, lambda logits: logits[0, -1, 0].item())
    with pytest.raises(InputError, match=r"no \.item\(\), float\(\) or \.numpy\(\)"):
        rs.attribution_patching(clean, other, lambda logits: float(logits[0, -1, 5].numpy()), points=[1])
    with pytest.raises(InputError, match="no in-place change of the logits"):
        rs.attribution_patching(clean, other,
                                lambda logits: logits.sub_(logits.logsumexp(-1, keepdim=True))[0, -1, 5])
    with torch.inference_mode():
        frozen = build("llama")
    made_inside = rs.load(frozen, tokenizer=ByteTokenizer())
    with pytest.raises(InputError, match="made inside torch.inference_mode"):
        rs.attribution_patching(rs.trace(made_inside, TEXTS), rs.trace(made_inside, CORRUPT), _diff(clean))
    with pytest.raises(UnknownNameError, match="no component 'L9H0'"):
        rs.attribution_patching_writes(clean, other, _diff(clean), writes=["L9H0"])
    with pytest.raises(InputError, match="writes is empty"):
        rs.attribution_patching_writes(clean, other, _diff(clean), writes=[])


WRITE_PATHS = {"gpt2": ("transformer.h.{}.attn.c_proj", "transformer.h.{}.mlp"),
               "llama": ("model.layers.{}.self_attn.o_proj", "model.layers.{}.mlp"),
               "opt": ("model.decoder.layers.{}.self_attn.out_proj", "model.decoder.layers.{}.fc2"),
               # Gemma 4's blocks of experts: the MLP's write is its norm's input; heads 16 and 32 wide
               "gemma4_moe": ("model.layers.{}.self_attn.o_proj",
                              "model.layers.{}.post_feedforward_layernorm")}
WRITE_IS_INPUT = {"gemma4_moe"}
WRITE_STEPS = {"gemma4_moe": (1e-3, 2e-3)}  # (its RMSNorms compute in float32, even in a float64 model)


def _nudged_write(module, name, write, tokens, mask, reference_tokens, where, metric, eps, n_heads):
    """The metric with one write moved by ``eps · (reference − clean)`` at ``where``: a head
    through its slice of the output projection's input (its width from that projection's), an
    MLP through its output (its write norm's input, Gemma 4's); both runs' values recorded, then
    the nudge written, by the test's own hooks."""
    if write.endswith(".mlp"):
        target, head = module.get_submodule(WRITE_PATHS[name][1].format(int(write[1]))), None
    else:
        layer, h = (int(x) for x in write[1:].split("H"))
        target = module.get_submodule(WRITE_PATHS[name][0].format(layer))
        d_head = (target.weight.shape[0] if name == "gpt2" else target.in_features) // n_heads  # (Conv1D)
        head = slice(h * d_head, (h + 1) * d_head)
    head = head or (slice(None) if name in WRITE_IS_INPUT else None)  # a write taken at an input
    seen = {}
    with torch.no_grad():
        for key, inputs in (("ref", reference_tokens), ("clean", tokens)):
            h = target.register_forward_pre_hook(lambda m, a, key=key: seen.__setitem__(key, a[0])) if head \
                else target.register_forward_hook(lambda m, a, out, key=key: seen.__setitem__(key, out))
            module(input_ids=inputs, attention_mask=mask)
            h.remove()
        step = torch.zeros_like(seen["clean"])
        sl = head or slice(None)
        at = where[..., None] if step.ndim == 3 else where.reshape(-1, 1)  # OPT's MLP: [batch·pos, d]
        step[..., sl] = torch.where(at, eps * (seen["ref"] - seen["clean"])[..., sl], 0)
        h = target.register_forward_pre_hook(lambda m, a: (a[0] + step, *a[1:])) if head \
            else target.register_forward_hook(lambda m, a, out: out + step)
        try:
            return float(metric(module(input_ids=tokens, attention_mask=mask).logits))
        finally:
            h.remove()


@pytest.mark.parametrize("name", list(WRITE_PATHS))
def test_attribution_patching_of_writes_is_the_derivative_along_each_write(name):
    """Each head's and MLP's estimate, per token and over every real token, equals the float64
    central difference of the HF module with that write nudged along its patch (the test's
    own hooks on ``o_proj``'s input slice or the MLP's output); a whole attention's estimate
    is the sum of its heads' (linear in ``z``); the default writes are every head."""
    module, _, _, _ = _setup(name)
    module = module.double()
    if getattr(module.config, "_experts_implementation", None) not in (None, "eager"):
        module.set_experts_implementation("eager")  # (grouped matmuls of experts take no float64)
    model = rs.load(module, tokenizer=ByteTokenizer())
    clean, other = rs.trace(model, TEXTS), rs.trace(model, CORRUPT)
    metric = _diff(clean)
    writes = ["L0H1", "L1H3", "L2H0", "L0.mlp", "L1.mlp", "L1.attn"]
    got = rs.attribution_patching_writes(clean, other, metric, writes=writes, positions=[5, -1])
    eps, rel = {**STEPS, **WRITE_STEPS}[name]
    lengths, real = clean.attention_mask.sum(1), clean.attention_mask.bool()
    last = torch.zeros_like(real)
    last[torch.arange(2), lengths - 1] = True
    at5 = torch.zeros_like(real)
    at5[:, 5] = True
    moved = 0
    for i, w in enumerate(writes[:-1]):
        for where, value in ((at5, got.metric[i, 0]), (last, got.metric[i, 1]), (real, got.total[i])):
            args = (module, name, w, clean.tokens, clean.attention_mask, other.tokens, where, metric)
            slope = (_nudged_write(*args, eps, model.anatomy.n_heads)
                     - _nudged_write(*args, -eps, model.anatomy.n_heads)) / (2 * eps)
            assert float(value) - got.metric_clean == pytest.approx(slope, rel=rel, abs=1e-9), w
            moved += abs(slope) > 1e-4
    assert moved >= 6
    heads = [f"L1H{h}" for h in range(model.anatomy.n_heads)]
    each = rs.attribution_patching_writes(clean, other, metric, writes=heads)
    assert float(got.total[-1] - got.metric_clean) == pytest.approx(
        float((each.total - each.metric_clean).sum()), rel=1e-9)
    default = rs.attribution_patching_writes(clean, other, metric)
    assert default.writes == model.anatomy.heads and default.metric.shape == (len(model.anatomy.heads), 53)
    frame = got.to_frame()
    assert set(frame.write) == set(writes) and frame.metric_change.abs().is_monotonic_decreasing


@pytest.mark.parametrize("estimate", [False, True])
def test_a_metric_per_text_gives_each_text_its_own_grid(estimate):
    """A metric returning one value per text: each text's grid equals the grid of that text
    traced alone (the other row gone: an independent run), and the summary fields are their
    means (equal to the grid of the mean metric). A metric that changes form is refused."""
    _, model, clean, other = _setup("llama")
    last = clean.attention_mask.sum(1) - 1
    rows = torch.arange(2)

    def per_text(logits):
        return logits[rows, last, 101] - logits[rows, last, 32]

    call = rs.attribution_patching if estimate else rs.patch_stream
    got = call(clean, other, per_text, positions=[5, -1])
    assert got.per_text.shape == (4, 2, 2) and torch.allclose(got.metric, got.per_text.mean(-1))
    mean = call(clean, other, lambda logits: per_text(logits).mean(), positions=[5, -1])
    assert torch.allclose(mean.metric, got.metric, atol=ATOL) and mean.per_text is None
    for r in range(2):
        alone = call(rs.trace(model, TEXTS[r]), rs.trace(model, CORRUPT[r]),
                     lambda logits: logits[0, -1, 101] - logits[0, -1, 32], positions=[5, -1])
        assert torch.allclose(got.per_text[..., r], alone.metric, atol=1e-4), r
        assert got.per_text_clean[r] == pytest.approx(alone.metric_clean, abs=1e-4)
        share = got.text_share()[..., r]
        assert torch.allclose(share, alone.share(), atol=1e-3, equal_nan=True), r
    frame = got.to_frame(per_text=True)
    assert len(frame) == 4 * 2 * 2 and set(frame.text) == {0, 1}
    row = frame[(frame.point == 2) & (frame.position == -1) & (frame.text == 1)].iloc[0]
    assert row.metric == pytest.approx(float(got.per_text[2, 1, 1]))
    with pytest.raises(InputError, match="per-text results need a metric"):
        mean.text_share()
    if not estimate:
        calls = []

        def changes_form(logits):
            calls.append(1)
            return per_text(logits) if len(calls) == 1 else per_text(logits).mean()

        with pytest.raises(InputError, match="every call the same"):
            rs.patch_stream(clean, other, changes_form, positions=[5])


def test_attribution_patching_of_writes_with_a_metric_per_text_gives_each_texts_estimate():
    """Each text's estimate of every head and MLP equals the call on that text traced alone; the
    summary fields are their means (equal to the call with the mean metric)."""
    _, model, clean, other = _setup("gpt2")
    last = clean.attention_mask.sum(1) - 1
    rows = torch.arange(2)

    def per_text(logits):
        return logits[rows, last, 101] - logits[rows, last, 32]

    writes = ["L0H1", "L1.attn", "L2.mlp"]
    got = rs.attribution_patching_writes(clean, other, per_text, writes=writes, positions=[5, -1])
    assert got.per_text.shape == (3, 2, 2) and got.per_text_total.shape == (3, 2)
    mean = rs.attribution_patching_writes(clean, other, lambda logits: per_text(logits).mean(), writes=writes,
                                          positions=[5, -1])
    assert torch.allclose(mean.total, got.total, atol=1e-6)
    assert torch.allclose(mean.metric, got.metric, atol=1e-6)
    assert mean.per_text is None
    for r in range(2):
        alone = rs.attribution_patching_writes(rs.trace(model, TEXTS[r]), rs.trace(model, CORRUPT[r]),
                                               lambda logits: logits[0, -1, 101] - logits[0, -1, 32],
                                               writes=writes, positions=[5, -1])
        assert torch.allclose(got.per_text_total[:, r], alone.total, atol=1e-4), r
        assert torch.allclose(got.per_text[..., r], alone.metric, atol=1e-4), r
        assert torch.allclose(got.text_share()[:, r], alone.share(), atol=1e-3, equal_nan=True), r
    assert (got.per_text_total - got.per_text_clean).abs().max() > 100 * ATOL  # the estimates move
    frame = got.to_frame(per_text=True)
    assert len(frame) == 6 and list(frame.write[::2]) == list(got.to_frame().write)
    row = frame[(frame.write == "L2.mlp") & (frame.text == 1)].iloc[0]
    assert row.metric == pytest.approx(float(got.per_text_total[2, 1]))
    with pytest.raises(InputError, match="per-text results need a metric"):
        mean.text_share()


@pytest.mark.parametrize("reads", [False, True])
def test_ablation_check_with_a_metric_per_text_gives_each_texts_change(reads):
    """Each text's patched metric equals the same check on that text traced alone; the
    summary columns are the means over texts (equal to a check with the mean metric)."""
    _, model, clean, other = _setup("gpt2")
    last = clean.attention_mask.sum(1) - 1
    rows = torch.arange(2)

    def per_text(logits):
        return logits[rows, last, 101] - logits[rows, last, 32]

    writes = ["L1H2", "L0.mlp", "L2.attn"]
    got = rs.ablation_check(clean, writes=writes, mode="patch", reference=other, metric=per_text, reads=reads)
    mean = rs.ablation_check(clean, writes=writes, mode="patch", reference=other,
                             metric=lambda logits: per_text(logits).mean(), reads=reads)
    assert torch.allclose(got.metric, mean.metric.double(), atol=ATOL) and mean.metric_per_text is None
    assert got.metric_clean == pytest.approx(mean.metric_clean, abs=1e-6)
    frame = got.outputs(per_text=True)
    assert len(frame) == 6
    assert list(frame.columns) == ["write", "text", "metric", "metric_change", "metric_share"]
    for r in range(2):
        alone = rs.ablation_check(rs.trace(model, TEXTS[r]), writes=writes, mode="patch",
                                  reference=rs.trace(model, CORRUPT[r]), reads=False,
                                  metric=lambda logits: logits[0, -1, 101] - logits[0, -1, 32]).outputs()
        mine = frame[frame.text == r].reset_index(drop=True)
        assert mine.metric.to_numpy() == pytest.approx(alone.metric.to_numpy(), abs=1e-4), r
        assert mine.metric_change.to_numpy() == pytest.approx(alone.metric_change.to_numpy(), abs=1e-4), r
    with pytest.raises(InputError, match="per-text results need a metric"):
        mean.outputs(per_text=True)


def test_a_metric_blind_to_the_difference_is_warned_of_in_every_patching():
    """A metric reading only a position before the corrupted token (a causal model's runs agree
    there), or returning a constant: the reference's value is the clean one, every share is NaN,
    and each analysis says why (``NoGapWarning``); a metric reading the difference is not warned of."""
    from residual_stream.analyses.ablation_args import NoGapWarning

    _, model, clean, other = _setup("llama")
    blind = lambda logits: logits[:, 1, 101].mean()  # noqa: E731 - before token 5, where the texts differ
    runs = {"patch_stream": lambda m: rs.patch_stream(clean, other, m, points=[1]),
            "path_patch": lambda m: rs.path_patch(clean, other, m, senders=["L0H0"]),
            "attribution_patching": lambda m: rs.attribution_patching(clean, other, m, points=[1]),
            "attribution_patching_writes": lambda m: rs.attribution_patching_writes(clean, other, m),
            "ablation_check": lambda m: rs.ablation_check(clean, writes=["L0.attn"], mode="patch",
                                                         reference=other, metric=m)}
    for name, run in runs.items():
        with pytest.warns(NoGapWarning, match=r"reference run the clean run's value .* every "
                                             r"metric_share is NaN: check that it reads the logits"):
            result = run(blind)
        assert result.metric_reference == result.metric_clean, name
        with warnings.catch_warnings():
            warnings.simplefilter("error", NoGapWarning)
            run(_diff(clean))  # the difference read: nothing to warn of
    with pytest.warns(NoGapWarning, match=r"\(1\.5\).*a metric returning a constant reads none"):
        share = rs.patch_stream(clean, other, lambda logits: 1.5, points=[1]).share()
    assert torch.isnan(share).all()
