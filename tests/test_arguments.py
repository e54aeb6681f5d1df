"""Arguments no analysis can use are refused by name, with the library's own errors.

Each case was accepted before and then gave a wrong result in silence (``granularity="heads"``
ran as component level, ``mode="median"`` as mean ablation, ``unembed_k=0`` measured the whole
space as a subspace "unembed_top0") or a bare ``IndexError``/``KeyError``/``TypeError`` from
deep inside. The tests' type checker refuses a wrong ``Literal`` at the call, before the
function runs; such cases call the function itself (``__wrapped__``), as a user's code does.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

import residual_stream as rs
from residual_stream.conservation import check_conservation
from residual_stream.errors import InputError, OutOfRangeError, ResidualStreamError, UnknownNameError
from residual_stream.inputs import encode

TEXTS = ["The stream is read and written.", "Norms rescale it."]


@pytest.fixture(scope="module")
def trace():
    return rs.trace(rs.twin(norm="rmsnorm", placement="pre", n_layers=2, d_model=32, n_heads=4,
                            seed=1), TEXTS)


def _twin_config(**fields):
    """``TwinConfig``'s own checks on ``fields`` (its ``__init__`` is type-checked in the tests)."""
    from residual_stream.twins.model import TwinConfig

    cfg = TwinConfig()
    for k, v in fields.items():
        setattr(cfg, k, v)
    unchecked(TwinConfig.__post_init__)(cfg)


def unchecked(fn):
    """``fn`` without the tests' type checker (a user's call); a method from its class."""
    return getattr(fn, "__wrapped__", fn)


@pytest.mark.parametrize(("call", "error", "message"), [
    (lambda t: unchecked(rs.survival)(t, granularity="heads"), InputError,
     r"granularity must be one of \['head', 'component'\], not 'heads'"),
    (lambda t: unchecked(rs.read_attribution)(t, granularity="layer"), InputError, "granularity"),
    (lambda t: unchecked(type(rs.read_attribution(t)).matrix)(rs.read_attribution(t), "bogus"),
     InputError,
     r"level must be one of \['reader', 'component', 'layer'\]"),
    (lambda t: rs.read_attribution(t).matrix("component", "query"), InputError,
     r"channel must be one of \['q', 'k', 'v', 'in', 'gate'\], not 'query'"),
    (lambda t: unchecked(rs.ablation_check)(t, mode="median"), InputError,
     r"mode must be one of \['mean', 'zero', 'patch'\], not 'median'"),
    (lambda t: rs.ablation_check(t, writes=["junk"]), UnknownNameError,
     "no component 'junk' to ablate; components are"),
    (lambda t: rs.ablation_check(t, writes=["L0H9"]), UnknownNameError, r"and heads L0H0…L\d+H\d"),
    *[(lambda t, w=w: rs.ablation_check(t, writes=[w]), UnknownNameError, "no component")
      for w in ("L1H02", "L01H1", "L1H", "L1H\u0661", " L1H1")],  # not as heads are labelled
    (lambda t: rs.ablation_check(t, writes=[]), InputError, r"writes is empty.*None"),
    (lambda t: rs.ablation_check(t, writes=["L0.mlp"], mode="zero", reference=t), InputError,
     r"reference gives the means of mode='mean' or the values of mode='patch'; mode='zero' uses none"),
    (lambda t: rs.ablation_check(t, writes=["L0.mlp"], mode="patch"), InputError,
     r"mode='patch' takes each write from a reference run: reference=rs.trace\(model, corrupted_texts\)"),
    (lambda t: rs.ablation_check(t, writes=["L0.mlp"], mode="patch", reference=rs.trace(t.model, "short")),
     InputError, r"the reference is \[1, \d+\] tokens \[batch, pos\], the trace \[2, \d+\]; give both"),
    (lambda t: rs.ablation_check(t, writes=["L0.mlp"], mode="patch",
                                 reference=rs.trace(t.model, TEXTS[::-1])),
     InputError, r"real tokens only: row 0 is 32 real tokens in the trace and 18 in the reference"),
    (lambda t: rs.ablation_check(t, writes=["L0.mlp"], reference=rs.trace(rs.twin(n_layers=2), "a")),
     InputError, r"reference is a trace of another loaded model object .*trace both with the same model"),
    (lambda t: rs.ablation_check(t, writes=["L0.mlp"], reference=t.tokens), InputError,
     r"rs.trace\(model, other_texts\), not Tensor"),
    (lambda t: rs.direct_logit_attribution(t).top(0), InputError, "top: n is a number of rows"),
    (lambda t: unchecked(rs.direct_logit_attribution)(t, target=[" Mary", " John"]), InputError,
     "target ids are token ids, not text like ' Mary'"),
    (lambda t: rs.ablation_check(t, writes=["L0.mlp"], positions=-40), InputError,
     r"position -40 is outside a row of 18 real tokens: use -18..17, or a bool mask"),
    (lambda t: rs.ablation_check(t, writes=["L0.mlp"], positions=torch.ones(2, 3, dtype=torch.bool)),
     InputError, r"positions as a mask is bool \[batch, pos\] = \[2, 32\], not \[2, 3\]"),
    (lambda t: unchecked(rs.ablation_check)(t, writes=["L0.mlp"], positions="last"), InputError,
     r"positions are token indices in each row \(-1: its last real token\)"),
    (lambda t: rs.ablation_check(t, writes=["L0.mlp"], positions=[]), InputError,
     "positions are token indices"),
    (lambda t: rs.composition(t).top("L1H0", n=0), InputError, "top: n is a number of writers, at least 1"),
    (lambda t: unchecked(type(rs.composition(t)).top)(rs.composition(t), "L1H0", n="3"), InputError,
     "top: n is a number of writers"),
    *[(lambda t, f=f: unchecked(f)(t.model), InputError,
       rf"{f.__name__} takes a trace, rs.{f.__name__}\(rs.trace\(model, texts\)\); got a Model \(this is a "
       r"loaded model: trace it first\)")
      for f in (rs.norm_growth, rs.survival, rs.read_attribution, rs.write_subspaces, rs.logit_lens,
                rs.direct_logit_attribution, rs.ablation_check, rs.mixing_ratio)],
    (lambda t: unchecked(rs.trace)("smollm2-135m", "x"), InputError,
     r"trace takes a loaded model \(rs.load\), not a str: load it first"),
    (lambda t: rs.scan(t, ["a b"], ["growth"], progress=False), InputError,
     r"scan takes a loaded model \(rs.load\), not a trace: give its model, trace.model"),
    (lambda t: unchecked(rs.ablation_check)(t, writes=["L0.mlp"], reads="no"), InputError,
     "reads is True or False, not 'no'"),
    (lambda t: unchecked(rs.ablation_check)(t, writes=["L0.mlp"], metric=5), InputError,
     "metric is a function of the logits"),
    (lambda t: rs.head_scores(t, length=3, rows=10**9), InputError,
     r"1000000000 rows of 7 positions are over 1,048,576 tokens in one pass: use fewer rows"),
    (lambda t: t.check(tolerance=float("nan")), InputError, r"tolerance is a relative error in \(0, 1\)"),
    (lambda t: unchecked(check_conservation)(t, tolerance="1e-3"), InputError,
     "tolerance is a relative error"),
    (lambda t: unchecked(encode)(t.model, "abc", max_length=2.5), InputError,
     "max_length must be a whole number between 1 and the model's context"),
    (lambda t: rs.trace(t.model, t.tokens, max_length=3), rs.errors.ContextLengthError,
     r"the token ids are \d+ positions, over max_length=3: cut them"),
    (lambda t: rs.ablation_check(t, writes=["L0.mlp"], metric=lambda logits: logits[:, -1, :2]), InputError,
     r"metric takes the logits \[batch, pos, vocab\] and returns one number, or one per text.*it returned "
     r"\(2, 2\)"),
    (lambda t: rs.ablation_check(t, writes=["L0.mlp"], metric=lambda logits: "high"), InputError,
     "it returned str"),
    (lambda t: rs.patch_stream(t, t, lambda logits: logits[:, -1, 0] * float("nan")), InputError,
     r"metric returned \[nan, nan\] on the clean logits: every effect is measured from that value, so "
     "it must be finite"),
    (lambda t: rs.ablation_check(t, writes=["L0.mlp"], metric=lambda logits: 1 + 2j), InputError,
     "it returned complex"),
    (lambda t: rs.ablation_check(t, writes=["L0.mlp"], metric=lambda logits: logits[0, -1, 0] * 1j),
     InputError, "it returned Tensor"),
    (lambda t: unchecked(rs.write_subspaces)(t, readers="no"), InputError,
     "readers is True or False, not 'no'"),
    (lambda t: unchecked(rs.composition)(t, through_norms=1), InputError,
     "through_norms is True or False, not 1"),
    (lambda t: unchecked(rs.trace)(t.model, torch.tensor([[True, False]])), InputError,
     r"token ids must be a non-empty integer tensor \[batch, pos\], got \(1, 2\) of torch.bool"),
    (lambda t: unchecked(rs.trace)(t.model, torch.tensor([[1 + 0j]])), InputError, "of torch.complex64"),
    (lambda t: unchecked(rs.ablation_check)(t, writes=5), InputError, "not 5"),
    (lambda t: unchecked(rs.ablation_check)(t, writes="L0.mlp"), InputError,
     r"writes is a list of component names, e.g. \['L0.mlp'\]"),
    (lambda t: rs.write_subspaces(t, unembed_k=0), InputError,
     r"unembed_k is a number of directions, at least 1, not 0"),
    (lambda t: rs.write_subspaces(t, unembed_k=-1), InputError, "unembed_k"),
    (lambda t: rs.write_subspaces(t, pca_k=0), InputError, "pca_k is a number of directions"),
    (lambda t: rs.write_subspaces(t, basis=torch.randn(3, 31)), InputError,
     r"basis is rows of directions \[k, d_model=32\], not a tensor of shape \(3, 31\)"),
    (lambda t: rs.write_subspaces(t, writes=["L9.mlp"]), UnknownNameError, "no writes named"),
    (lambda t: rs.write_subspaces(t, writes=[]), InputError, r"writes is empty.*None"),
    *[(lambda t, k=k, v=v: _twin_config(**{k: v}), InputError, message) for k, v, message in (
        ("n_layers", "2", "a twin's n_layers is a whole number, not '2'"),
        ("d_mlp", 8.5, "a twin's d_mlp is a whole number, not 8.5"),
        ("bias", "no", "a twin's bias is True or False, not 'no'"))],
    (lambda t: rs.twin(eps=float("nan")), InputError, r"a twin's eps is a small positive number"),
    (lambda t: unchecked(rs.twin)(seed=2**70), InputError, r"seed is a whole number in 0..2\*\*63-1"),
    (lambda t: unchecked(rs.trace)(t.model, "a", patterns="no"), InputError, "patterns is True or False"),
    (lambda t: unchecked(rs.scan)(t.model, ["a b"], ["growth"], state=5, progress=False), InputError,
     "state is a file path"),
    (lambda t: unchecked(rs.scan)(t.model, ["a b"], ["growth"], on_batch=5, progress=False), InputError,
     r"on_batch is a function on_batch\(key, tokens\), not a int"),
    (lambda t: rs.load("twin-pre-ln", tokenizer=5), InputError, "tokenizer is a tokenizer object"),
    (lambda t: rs.load(""), InputError, "the model name is empty"),
    (lambda t: unchecked(type(t).norm_scale)(t, []), UnknownNameError, r"no norm \[\]; norms are"),
    (lambda t: unchecked(type(t).decompose)(t, np.array([1, 2])), OutOfRangeError,
     "a point to decompose is a layer index"),
    (lambda t: t.head_writes(0, out=torch.empty(4, 2, t.tokens.shape[1], 32, dtype=torch.int64)), InputError,
     r"out is a contiguous floating tensor \[head, batch, pos, d_model\]"),
    (lambda t: unchecked(type(t.model.unembed()).logits)(t.model.unembed(), t.tokens), InputError,
     "logits read final-normed states, a floating tensor"),
    (lambda t: unchecked(type(t.model.unembed()).logits)(t.model.unembed(), torch.ones(2, 3, 5)), InputError,
     r"a floating tensor \[..., d_model=32\]; not of shape \(2, 3, 5\)"),
    (lambda t: unchecked(type(t.model.unembed()).logits)(t.model.unembed(), [[0.0] * 32]), InputError,
     r"not a list \(.*a list: torch.tensor\(h\)\)"),
    (lambda t: unchecked(rs.read_attribution)(t, per_token="no"), InputError, "per_token is True or False"),
    (lambda t: rs.write_subspaces(t, basis=torch.full((2, 32), float("nan"))), InputError,
     "basis holds NaN, inf or only zeros"),
    (lambda t: rs.write_subspaces(t, pca_trace=t.model), InputError, "pca_trace is a trace.*not a Model"),
    (lambda t: rs.write_subspaces(t, pca_trace=rs.trace(rs.twin(norm="rmsnorm", placement="pre", n_layers=2,
                                                                d_model=32, n_heads=4, seed=1), "a b")),
     InputError, "pca_trace is a trace of another loaded model object"),
    (lambda t: rs.logit_lens(t, k=0), InputError, r"k is a number of top tokens in 1..257"),
    (lambda t: rs.logit_lens(t, k=1000), InputError, "k is a number of top tokens"),
    (lambda t: rs.direct_logit_attribution(t, target=torch.full_like(t.tokens, 10**6)), InputError,
     r"target ids must be token ids in 0..256, got 1000000"),
    (lambda t: rs.direct_logit_attribution(t, target=t.tokens.float()), InputError,
     r"target ids are one token id, one per row \[\d+\], or one per position \[batch, pos\]"),
    (lambda t: rs.direct_logit_attribution(t, baseline=t.tokens[:, :2]), InputError,
     r"baseline ids are one token id.*tokenizer\(' Mary', add_special_tokens=False\)\['input_ids'\]"),
    (lambda t: unchecked(rs.direct_logit_attribution)(t, target="a"), InputError,
     r"target must be 'top', 'next' or token ids"),
    (lambda t: unchecked(rs.direct_logit_attribution)(t, target=[1.5, 2.5]), InputError,
     r"target ids are one token id"),
    (lambda t: rs.direct_logit_attribution(t, target=300), InputError, r"token ids in 0..256, got 300"),
    (lambda t: rs.norm_growth(t, massive_reference="row"), InputError,
     r"massive_reference must be one of \['token', 'point'\]"),
    (lambda t: t.head_writes(2), OutOfRangeError, r"a block is a layer index in 0..1 \(n_layers=2\), not 2"),
    (lambda t: t.head_writes(-1), OutOfRangeError, "not -1"),
    (lambda t: t.mlp_write(2), OutOfRangeError, "a block is a layer index"),
    (lambda t: t.attn_write(True), OutOfRangeError, "not True"),
    (lambda t: t.stream(3), OutOfRangeError, r"a stream point is a layer index in 0..2"),
    (lambda t: unchecked(type(t).decompose)(t, "L3"), OutOfRangeError,
     r"a point to decompose is a layer index in 0..2 \(n_layers=2\) or \"final\", not 'L3'"),
    (lambda t: t.norm_scale("ln_nope"), UnknownNameError, "no norm 'ln_nope'; norms are"),
    (lambda t: t.decompose_read("L0.bogus"), UnknownNameError, "no component 'L0.bogus'; components are"),
    (lambda t: t.decompose(1).get("L7.mlp"), UnknownNameError, "no contribution 'L7.mlp'"),
    (lambda t: t.read_input("L0.bogus"), UnknownNameError, "no component 'L0.bogus'"),
    (lambda t: t.model.weights(2), OutOfRangeError, r"a block is a layer index in 0..1 \(n_layers=2\)"),
])
def test_an_unusable_argument_is_refused_by_name(trace, call, error, message):
    with pytest.raises(error, match=message) as caught:
        call(trace)
    assert isinstance(caught.value, ResidualStreamError)  # one ``except`` catches all of them


def test_errors_keep_their_builtin_kinds_and_print_their_message(trace):
    """``except KeyError`` / ``except IndexError`` code keeps working; ``str`` is the message
    (a plain ``KeyError`` prints it quoted)."""
    with pytest.raises(KeyError) as caught:
        trace.norm_scale("ln_nope")
    assert str(caught.value).startswith("no norm 'ln_nope'")
    with pytest.raises(IndexError):
        trace.stream(-1)


def test_composition_takes_a_trace_for_its_model(trace):
    """``rs.composition(trace)`` was ``AttributeError: 'Trace' object has no attribute
    'weights'``; composition reads weights only, so the trace's model is the same input."""
    of_trace, of_model = rs.composition(trace), rs.composition(trace.model)
    torch.testing.assert_close(of_trace.head_to_head, of_model.head_to_head, rtol=0, atol=0)
    assert of_trace.heads == of_model.heads and of_trace.head_to_head.abs().sum() > 0


def test_a_notebook_shows_each_object_in_one_line(trace):
    """A cell ending in ``trace.check()`` showed 38,952 characters of rows, ``model.anatomy``
    403,261 on SmolLM2 (every norm's γ) and a trace 41,762: each is now one line of its
    sizes, read here from the object's own fields."""
    a, report, parts = trace.anatomy, trace.check(), trace.decompose(1)
    shown = {repr(a), repr(trace), repr(report), repr(parts)}
    assert all("\n" not in s and len(s) < 300 for s in shown), shown
    assert f"{a.n_layers} layers, d_model {a.d_model}, {a.n_heads} heads of {a.d_head}" in repr(a)
    assert f"{len(a.norms)} norms, {len(a.program)} ops" in repr(a)
    assert f"2 texts × {trace.tokens.shape[1]} positions, {int(trace.attention_mask.sum())} real" \
        in repr(trace)
    assert repr(report) == str(report) and f"{len(report.rows)} checks" in repr(report)
    assert f"{len(parts.labels)} contributions: embed" in repr(parts)
    assert f"values {list(parts.values.shape)}" in repr(parts)


def test_the_logit_lens_kl_is_never_negative():
    """KL is ≥ 0; the final point's, a model against itself, rounded to -8.6e-7 on the
    pre-RMSNorm twin (the corpus lens clamped it; the single-trace one did not)."""
    t = rs.trace(rs.load("twin-pre-rms"), ["The residual stream is read and written by every "
                                            "layer of the model.", "Norms rescale it."])
    kl = rs.logit_lens(t).kl
    assert float(kl.min()) >= 0.0 and float(kl[-1].max()) < 1e-5


def test_the_command_help_lists_every_command_and_the_exit_codes(capsys):
    """``--help`` showed the docstring's first line only (and in reST quotes): the commands'
    usage lines and the exit codes, 130 on Ctrl-C included, were not there."""
    from residual_stream.cli import COMMANDS, main

    with pytest.raises(SystemExit):
        main(["--help"])
    shown = capsys.readouterr().out
    assert all(f"residual-stream {name}" in shown for name in COMMANDS), shown
    assert "130 when interrupted" in shown and "``" not in shown


def test_numpy_integers_and_sizes_past_the_model_are_taken_as_they_were():
    """The checks above must not refuse what worked: a numpy index (from ``argmax`` or a
    loop over an array), and the default ``unembed_k=32`` on a model narrower than 32,
    which keeps the whole space (it was refused for a moment)."""
    narrow = rs.trace(rs.twin(n_layers=2, d_model=16, n_heads=2, seed=1), TEXTS)
    i = np.int64(1)
    assert torch.equal(unchecked(type(narrow).stream)(narrow, i), narrow.stream(1))
    assert torch.equal(unchecked(type(narrow).head_writes)(narrow, i), narrow.head_writes(1))
    torch.testing.assert_close(unchecked(type(narrow).decompose)(narrow, i).values,
                               narrow.decompose(1).values, rtol=0, atol=0)
    assert torch.equal(unchecked(type(narrow.model).weights)(narrow.model, i).W_Q,
                       narrow.model.weights(1).W_Q)
    assert unchecked(rs.logit_lens)(narrow, k=np.int64(3)).top_ids.shape[-1] == 3
    subspaces = rs.write_subspaces(narrow, readers=False)  # unembed_k 32 > d_model 16
    assert "unembed_top16" in subspaces.subspaces


def test_a_path_the_system_cannot_look_up_is_an_input_error(tmp_path):
    """A name over 255 bytes made ``Path.exists`` raise a bare ``OSError`` (ENAMETOOLONG): a
    traceback on every app page for a model or corpus path. Reference: the same path's own
    ``stat``, which raises ENAMETOOLONG, and a missing short path, which is still "absent"."""
    import errno

    from residual_stream.streaming import Corpus

    long = tmp_path / ("a" * 300)
    with pytest.raises(OSError) as raw:
        long.stat()
    assert raw.value.errno == errno.ENAMETOOLONG
    model = rs.twin(norm="rmsnorm", placement="pre", n_layers=1, d_model=16, n_heads=2, n_ctx=32)
    for call, what in ((lambda: rs.load(str(long)), "the model path"),
                       (lambda: list(Corpus(long).texts()), "the corpus"),
                       (lambda: rs.scan(model, ["a b c"], ["growth"], state=long, progress=False),
                        "the file")):
        with pytest.raises(InputError, match=f"{what} .* cannot be looked up .File name too long"):
            call()
    with pytest.raises(rs.errors.ModelNotFoundError, match="no such file or folder"):
        rs.load(str(tmp_path / "missing.gguf"))


def test_texts_that_are_not_strings_are_named_not_called_empty():
    """A list of id lists, bytes and a numpy array of ids were "text 0 is empty" or "no texts
    given". Reference: the same ids as a torch tensor, which traces."""
    from residual_stream import inputs

    model = rs.twin(norm="rmsnorm", placement="pre", n_layers=1, d_model=16, n_heads=2, n_ctx=32)
    encode = inputs.encode.__wrapped__ if hasattr(inputs.encode, "__wrapped__") else inputs.encode
    for texts, message in (([[72, 101, 108]], "text 0 is a list, not a string: give texts as "
                                              "strings, or token ids as a torch integer tensor"),
                           ([b"hello"], r"text 0 is a bytes, not a string \(decode it"),
                           (np.array([[72, 101]]), "not a ndarray: torch.as_tensor.ids. makes one"),
                           ({"text": "hi"}, "not a dict"),
                           (np.array(["a text", "another"], dtype=object),  # df["text"].values
                            r"not a ndarray: texts.tolist\(\) makes a list of it")):
        with pytest.raises(InputError, match=message) as raised:
            encode(model, texts)
        assert not isinstance(raised.value, rs.errors.EmptyTextError)
    assert encode(model, torch.as_tensor(np.array([[72, 101]]))).tokens.tolist() == [[72, 101]]


def test_a_basis_given_as_an_array_or_lists_is_the_same_subspace(trace):
    """``basis=`` took only a tensor (an array raised AttributeError deep inside)."""
    rows = torch.randn(3, 32, generator=torch.Generator().manual_seed(0))
    want = rs.write_subspaces(trace, basis=rows, readers=False).named
    for other in (rows.numpy(), np.asarray(rows.double()), rows.tolist()):
        got = unchecked(rs.write_subspaces)(trace, basis=other, readers=False).named
        torch.testing.assert_close(got, want, rtol=0, atol=1e-6)


def test_the_anatomy_lists_every_head_as_results_name_them(trace):
    """``Anatomy.heads``: what ``ablation_check(writes=...)`` takes, in layer order (by hand:
    2 layers of 4 heads), and what composition and head scores name."""
    heads = trace.anatomy.heads
    assert heads == ("L0H0", "L0H1", "L0H2", "L0H3", "L1H0", "L1H1", "L1H2", "L1H3")
    assert heads == rs.composition(trace).heads
    assert set(rs.ablation_check(trace, writes=heads[-2:], reads=False).writes) == {"L1H2", "L1H3"}


def test_a_tokenizer_that_does_not_return_ids_is_named_and_texts_it_drops_are_empty():
    """A tokenizer returning a list, a dict without ``input_ids``, None or fractional ids was a bare
    ``TypeError``/``KeyError`` at the trace (or ids cut to whole numbers in silence); a text whose
    characters the tokenizer drops (MiniLM's, a zero-width space or control characters) was traced
    as ``[CLS] [SEP]`` alone. Reference: the same model and text with the twin's own tokenizer."""
    from residual_stream.errors import EmptyTextError

    twin = rs.twin(norm="rmsnorm", placement="pre", n_layers=1, d_model=16, n_heads=2, n_ctx=32)
    good = rs.trace(twin, "hi")
    for tokenize, shown in ((lambda text, **kw: [1, 2], "list"),
                            (lambda text, **kw: {"ids": [1, 2]}, "dict"),
                            (lambda text, **kw: None, "NoneType"),
                            (lambda text, **kw: {"input_ids": [1.5, 2.0]}, r"input_ids \[1.5, 2.0\]"),
                            (lambda text, **kw: {"input_ids": [True]}, r"input_ids \[True\]")):
        model = rs.load(twin.module, tokenizer=tokenize)
        with pytest.raises(InputError, match=f"the tokenizer returned {shown}, not {{'input_ids'"):
            rs.trace(model, "hi")
    ids = list(np.array([256, 104, 105]))  # numpy integers, as some tokenizers give
    as_numpy = rs.load(twin.module, tokenizer=lambda text, **kw: {"input_ids": ids})
    assert torch.equal(rs.trace(as_numpy, "hi").stream(1), good.stream(1))
    minilm = rs.load("minilm-l6")
    for dropped in ("\u200b", "\x01\x02"):
        with pytest.raises(EmptyTextError, match="text 0 tokenizes to nothing but special tokens"):
            rs.trace(minilm, dropped)
    assert rs.trace(minilm, "[MASK]").tokens.shape == (1, 3)  # a special token the text names is kept
    chunked = rs.trace(minilm, ["word " * 700, "short"], overflow="chunk")
    assert chunked.tokens.shape[0] == 3  # cut by the library, so transformers' warning is not shown:
    assert not minilm.tokenizer.deprecation_warnings.get(
        "sequence-length-is-longer-than-the-specified-maximum")  # "… will result in indexing errors"


def test_the_stream_pca_is_named_by_the_components_it_holds(trace):
    """``pca_k`` past what the stream spans gave a subspace named ``pca1000@2`` on a 32-wide model;
    it is named by the components kept. Reference: numpy's rank of the centred final stream."""
    from residual_stream.analyses.subspaces import pca_subspace
    from residual_stream.analyses.tokens import real

    x = real(trace.stream(2), trace.attention_mask).double().numpy()
    rank = np.linalg.matrix_rank(x - x.mean(0), tol=1e-6 * np.linalg.norm(x - x.mean(0), 2))
    pca = pca_subspace(trace, k=1000)
    assert pca.basis.shape[1] == rank <= 32 and pca.name == f"pca{rank}@2"  # at most d_model
    assert [n for n in rs.write_subspaces(trace, pca_k=1000, readers=False).subspaces
            if n.startswith("pca")] == [pca.name]
    assert pca_subspace(trace, k=3).name == "pca3@2"
