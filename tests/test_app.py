"""The app, page by page, with Streamlit's AppTest (no browser): each page runs without an
exception, a widget changes what is shown, and each bad input shows its message."""

import base64
import json
import os
import re
from pathlib import Path

import numpy as np
import pytest
from streamlit.testing.v1 import AppTest

APP = str(Path(__file__).resolve().parent.parent / "app" / "main.py")
pytestmark = pytest.mark.slow


def app(page: str | None = None, **env) -> AppTest:
    at = AppTest.from_file(APP, default_timeout=300)
    at.run()
    if page:
        at.switch_page(f"views/{page}.py").run()
    assert not at.exception, at.exception
    return at


def unescaped(markdown: str) -> str:
    """A message as the page shows it: the app escapes Markdown so typed text is never formatted."""
    return re.sub(r"\\(.)", r"\1", markdown)


def chart(at: AppTest, i: int = 0) -> dict:
    return json.loads(at.get("plotly_chart")[i].proto.spec)


def test_overview_shows_program_growth_and_updates():
    at = app()
    assert at.title[0].value == "Overview"
    titles = [chart(at, i)["layout"]["title"]["text"] for i in range(3)]
    assert titles[0].startswith("Stream program (pre, rmsnorm")
    assert titles[1].startswith("Stream norm by depth") and "Relative update" in titles[2]
    config = json.loads(at.get("plotly_chart")[1].proto.config)  # its toolbar's PNG (the browser test)
    assert config["toImageButtonOptions"] == {"format": "png", "filename": "growth", "scale": 3}
    at.sidebar.selectbox(key="model").select("minilm-l6").run()
    assert not at.exception
    assert chart(at)["layout"]["title"]["text"].startswith("Stream program (post, layernorm")
    assert any("Data (CSV)" == b.label for b in at.get("download_button"))


def test_writes_page_reacts_to_layer_write_and_measure():
    at = app("writes")
    first = chart(at)["data"][0]["x"][0]
    at.slider(key="layer").set_value(5).run()
    assert chart(at)["data"][0]["x"][0] != first and chart(at)["data"][0]["x"][0].startswith("L5")
    at.selectbox(key="write").select("L5H2").run()
    assert chart(at)["data"][0]["x"][0] == "L5H2 @ 0"
    labels = at.selectbox(key="token").options  # tokens as shown: a space is ␣, never 'Ġ' or a repr
    assert labels[1].startswith("1: ␣") and not any("Ġ" in x or "'" in x for x in labels), labels
    before = chart(at, 1)["layout"]["title"]["text"]
    at.selectbox(key="measure").select(at.selectbox(key="measure").options[-1]).run()
    assert chart(at, 1)["layout"]["title"]["text"] != before


def test_writes_page_measures_uploaded_directions_of_ones_own():
    """An uploaded basis is one more subspace, 'basis', in the split of a write at a token and in
    the measures over layers × components. Reference: ``orthogonal_split`` and
    ``rs.write_subspaces(trace, basis=rows)`` on the page's text; a file of another width or no
    basis at all is said on the page, which goes on without it."""
    import io

    import torch

    import residual_stream as rs
    from residual_stream.analyses.subspaces import (
        named_subspaces,
        orthogonal_split,
        pca_subspace,
        writes_as_added,
    )

    at = app("writes")
    at.sidebar.selectbox(key="model").select("twin-pre-ln").run()
    model = rs.load("twin-pre-ln")
    rows = torch.randn(2, model.anatomy.d_model, generator=torch.Generator().manual_seed(3))
    data = io.BytesIO()
    np.save(data, rows.numpy())
    at.file_uploader(key="writes_basis").set_value(("probe.npy", data.getvalue(), "application/octet-stream"))
    at.selectbox(key="write").select("L0H1").run()
    assert not at.exception and not at.error, [e.value for e in at.error]
    assert "probe.npy: 2 direction(s)" in unescaped(at.caption[0].value)
    tr = rs.trace(model, at.sidebar.text_area(key="text").value)
    subs = named_subspaces(model, pca_subspace(tr, k=16), basis=rows)
    names, want = orthogonal_split(writes_as_added(tr, {"L0H1"})["L0H1"][0, 0], subs)
    bars = chart(at)["data"]
    assert [d["name"] for d in bars] == list(names) and "basis" in names
    got = [_numbers(d["y"])[0] for d in bars]
    np.testing.assert_allclose(got, want.numpy(), rtol=1e-5, atol=1e-7)
    at.selectbox(key="measure").select("fraction in basis").run()
    _assert_basis_grid(chart(at, 1), rs.write_subspaces(tr, basis=rows))
    wide = io.BytesIO()
    np.save(wide, np.ones((2, model.anatomy.d_model + 1), dtype=np.float32))
    at.file_uploader(key="writes_basis").set_value(("wide.npy", wide.getvalue(), "text/plain")).run()
    assert not at.exception and f"not a tensor of shape (2, {model.anatomy.d_model + 1})" \
        in unescaped(at.error[0].value), [e.value for e in at.error]
    assert "basis" not in [d["name"] for d in chart(at)["data"]]  # the page goes on without it
    at.file_uploader(key="writes_basis").set_value(("junk.pt", b"not a torch file", "text/plain")).run()
    assert not at.exception and "junk.pt cannot be read" in unescaped(at.error[0].value)
    from safetensors.torch import save  # several tensors: a subspace each, named by its key

    two = save({"neg": rows[:1].contiguous(), "pos": rows[1:].contiguous()})
    at.file_uploader(key="writes_basis").set_value(("two.safetensors", two, "text/plain")).run()
    assert not at.exception and not at.error, [e.value for e in at.error]
    assert "as the subspace 'basis:neg', 1 direction(s) as the subspace 'basis:pos'" \
        in unescaped(at.caption[0].value), at.caption[0].value
    assert [d["name"] for d in chart(at)["data"]][-3:] == ["basis:neg", "basis:pos", "rest"]


def _assert_basis_grid(figure: dict, ws) -> None:
    """The heatmap's cell of each write (``[component (attn, mlp), layer]``) is its fraction in 'basis'."""
    z = _grid(figure["data"][0]["z"])
    for w, value in zip(ws.writes, ws.named[:, ws.subspaces.index("basis")], strict=True):
        cell = z["attn mlp".split().index(w.split(".")[1]), int(w[1])]
        assert cell == pytest.approx(float(value), rel=1e-5), w


def test_writes_page_head_read_measure_is_over_heads_only():
    """"max fraction read by a later head" takes the max over heads' Q, K, V readers only
    (before: MLP inputs too, so every cell was ≈ 1), and is NaN, not -inf, where no head reads
    after the write (the last block). Reference: ``rs.write_subspaces`` of the page's text."""
    import residual_stream as rs

    at = app("writes")
    at.sidebar.selectbox(key="model").select("twin-pre-ln").run()
    at.selectbox(key="measure").select("max fraction read by a later head (Q, K or V)").run()
    assert not at.exception, at.exception
    z = _grid(chart(at, 1)["data"][0]["z"])  # [component (attn, mlp), layer]
    model = rs.load("twin-pre-ln")
    ws = rs.write_subspaces(rs.trace(model, at.sidebar.text_area(key="text").value, patterns=True))
    heads = [i for i, r in enumerate(ws.readers) if r.endswith((".q", ".k", ".v"))]
    for (layer, kind), row in zip(((int(w[1]), w.split(".")[1]) for w in ws.writes),
                                  ws.read_fraction[:, heads], strict=True):
        want = float("nan") if row.isnan().all() else float(row.nan_to_num(nan=-1).max())
        got = z["attn mlp".split().index(kind), layer]
        assert (np.isnan(got) and np.isnan(want)) or got == pytest.approx(want, rel=1e-5)
    n = model.anatomy.n_layers
    assert np.isnan(z[:, n - 1]).all() and np.nanmax(z) < 0.99  # MLP inputs read ≈ everything


def test_flow_page_threshold_and_node():
    at = app("flow")
    def edges(a):
        return sum(1 for d in chart(a)["data"] if d.get("mode") == "lines")
    many = edges(at)
    at.slider(key="threshold").set_value(0.4).run()
    assert edges(at) < many
    at.selectbox(key="node").select("L3.attn").run()
    assert "L3.attn reads from" in " ".join(m.value for m in at.markdown)
    assert chart(at, 1)["data"][0]["type"] == "heatmap"      # survival
    assert "Logit lens" in chart(at, 2)["layout"]["title"]["text"]
    heads = chart(at, 4)["data"][0]  # SmolLM2's induction head L18H6 (0.91: test_real_analyses)
    assert heads["y"][int(np.argmax(np.max(_grid(heads["z"]), axis=1)))] == "L18"
    assert "L18H6, the top induction head" in " ".join(m.value for m in at.markdown)
    at.radio(key="head_kind").set_value("previous_token").run()
    assert "previous-token score" in chart(at, 4)["layout"]["title"]["text"]


def test_flow_page_attributes_a_logit_to_heads_and_mlps():
    """The DLA bars at a token: the title's total is the model's own logit (reference: a plain
    HF forward of the same text), or logit difference with a baseline; the 20 largest terms;
    a target that is not one token is refused in the section, and the page goes on."""
    import torch

    import residual_stream as rs

    at = app("flow")
    model = rs.load("smollm2-135m", progress=False)
    ids = model.tokenizer(at.sidebar.text_area(key="text").value, return_tensors="pt")["input_ids"]
    with torch.no_grad():
        logits = model.module(input_ids=ids).logits[0].double()

    def title():
        return chart(at, 3)["layout"]["title"]["text"]

    n = ids.shape[1]
    assert title().startswith("logit(") and f"at token {n - 1}:" in title()
    assert float(title().rsplit(": ", 1)[1]) == pytest.approx(float(logits[-1].max()), abs=2e-3)
    bars = chart(at, 3)["data"][0]
    size = np.abs(_grid(bars["x"]) if not isinstance(bars["x"], dict) else _numbers(bars["x"]))
    assert len(bars["y"]) == 20 and (np.diff(size) <= 0).all()
    the, paris = (model.tokenizer(t, add_special_tokens=False)["input_ids"][0] for t in (" the", " Paris"))
    at.selectbox(key="dla_pos").select(3).run()
    at.text_input(key="dla_target").input(" the").run()
    at.text_input(key="dla_baseline").input(" Paris").run()
    assert "logit(␣the) − logit(␣Paris) at token 3:" in title()
    want = float(logits[3, the] - logits[3, paris])
    assert float(title().rsplit(": ", 1)[1]) == pytest.approx(want, abs=2e-3)
    assert chart(at, 3)["layout"]["yaxis"]["dtick"] == 1  # every bar labelled
    assert any(c.value.startswith("The 20 bars sum to") for c in at.caption)
    at.text_input(key="dla_target").input("residual stream").run()
    assert not at.exception and "The target is 2 tokens" in at.error[0].value
    at.text_input(key="dla_target").input("**x**").run()  # shown as typed, not as Markdown
    assert "\\*\\*" in at.error[0].value
    assert "induction score" in chart(at, 3)["layout"]["title"]["text"]  # the Heads section still runs
    at.sidebar.selectbox(key="model").select("twin-pre-ln").run()  # a byte tokenizer: one byte a token
    positions = at.selectbox(key="dla_pos")
    assert positions.value == len(positions.options) - 1  # a new model: its last token again
    at.text_input(key="dla_target").input("a").run()
    assert not at.exception and "The baseline is 6 tokens" in at.error[0].value  # ' Paris': 6 bytes
    at.text_input(key="dla_baseline").input("").run()
    assert not at.exception and "logit(a)" in title(), title()


def test_compare_page_overlays_two_models():
    at = app("compare")
    at.selectbox(key="other").select("minilm-l6").run()
    names = [d["name"] for d in chart(at)["data"]]
    assert names == ["smollm2-135m", "minilm-l6"]
    at.selectbox(key="cmp_measure").select("retention of the embedding").run()
    assert "retention" in chart(at)["layout"]["yaxis"]["title"]["text"]
    pre, post = (_numbers(d["y"]) for d in chart(at)["data"])
    pre, post = pre[np.isfinite(pre)], post[np.isfinite(post)]
    assert len(pre) > 1 and np.abs(pre - 1).max() < 1e-4  # pre-norm: the embedding passes unchanged
    assert np.abs(post - 1).max() > 0.1                     # post-norm rescales it every block
    assert "smollm2-135m" not in at.selectbox(key="other").options  # never the model itself
    at.sidebar.selectbox(key="model").select("minilm-l6").run()  # the one compared with
    assert not at.exception, at.exception
    assert "minilm-l6" not in at.selectbox(key="other").options
    names = [d["name"] for d in chart(at)["data"]]
    assert names[0] == "minilm-l6" and len(names) == 2 and names[1] != "minilm-l6"


def test_compare_page_over_the_corpus_draws_two_scans():
    """Over the built-in corpus the series are two ``rs.scan``s (reference: the same scans
    called directly); the pre-norm twin keeps its embedding, the post-norm one rescales it."""
    import residual_stream as rs

    at = app()
    at.sidebar.selectbox(key="model").select("twin-pre-ln").run()
    at.switch_page("views/compare.py").run()
    at.selectbox(key="other").select("twin-post-ln").run()
    at.radio(key="cmp_source").set_value("corpus").run()
    assert not at.exception, at.exception
    for trace, model in zip(chart(at)["data"], ["twin-pre-ln", "twin-post-ln"], strict=True):
        growth = rs.scan(rs.load(model), "builtin", "growth", batch_size=8, seq_len=128,
                         max_tokens=4096, progress=False).stats["growth"]
        assert trace["name"] == model
        assert np.allclose(_numbers(trace["y"]), growth.mean.numpy(), rtol=1e-5)
    at.selectbox(key="cmp_measure").select("retention of the embedding").run()
    assert not at.exception, at.exception
    pre, post = (_numbers(d["y"]) for d in chart(at)["data"])
    assert np.abs(pre[np.isfinite(pre)] - 1).max() < 1e-4 and np.abs(post[np.isfinite(post)] - 1).max() > 0.1


def test_compare_page_over_an_uploaded_corpus_draws_two_scans_of_it(tmp_path, monkeypatch):
    """Over an uploaded Parquet file, by its column: two ``rs.scan``s of that file (reference:
    the same scans called directly, on a copy of its bytes); a column it lacks is said on the page."""
    import tempfile

    import pyarrow as pa
    import pyarrow.parquet as pq

    import residual_stream as rs

    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    reference = tmp_path / "notes.parquet"
    lines = [f"Line {i}: a post-norm stream is rescaled every block." for i in range(30)]
    pq.write_table(pa.table({"body": lines}), reference)
    at = app()
    at.sidebar.selectbox(key="model").select("twin-pre-ln").run()
    at.switch_page("views/compare.py").run()
    at.selectbox(key="other").select("twin-post-ln").run()
    at.radio(key="cmp_source").set_value("upload").run()
    assert not at.exception and "Upload a corpus file" in at.info[0].value and not at.get("plotly_chart")
    at.file_uploader(key="cmp_corpus").set_value([("notes.parquet", reference.read_bytes(), "text/plain")])
    at.run()
    error = unescaped(at.error[0].value)
    assert not at.exception and error.startswith("notes.parquet has no 'text' column (it has ['body'])"), \
        error
    at.text_input(key="cmp_field").set_value("body").run()
    assert not at.exception and not at.error, [e.value for e in at.error]
    for trace, model in zip(chart(at)["data"], ["twin-pre-ln", "twin-post-ln"], strict=True):
        growth = rs.scan(rs.load(model), rs.streaming.Corpus(reference, text_field="body"), "growth",
                         batch_size=8, seq_len=128, max_tokens=4096, progress=False).stats["growth"]
        assert trace["name"] == model
        assert np.allclose(_numbers(trace["y"]), growth.mean.numpy(), rtol=1e-5)


def test_compare_page_draws_uploaded_saved_scans_without_loading_their_models(tmp_path, monkeypatch):
    """Saved scans of two twins, uploaded: one curve each, their own numbers; a measure a scan
    did not take is said on the page."""
    import residual_stream as rs
    from residual_stream import loading

    results = [rs.scan(rs.load(m), "builtin", stats, max_tokens=300, progress=False)
               for m, stats in (("twin-pre-ln", ["growth", "survival"]), ("twin-post-ln", ["growth"]))]
    files = [(f"{r.model_name}.pt", r.save(tmp_path / f"{r.model_name}.pt").read_bytes(),
              "application/octet-stream") for r in results]
    at = app()
    at.switch_page("views/compare.py").run()
    monkeypatch.setattr(loading, "load", lambda *a, **k: pytest.fail("a model loaded"))
    at.radio(key="cmp_source").set_value("saved").run()
    assert not at.exception and "Upload one or more saved scans" in at.info[0].value
    at.file_uploader(key="cmp_saved").set_value(files).run()
    assert not at.exception, at.exception
    data = chart(at)["data"]
    assert [d["name"] for d in data] == ["twin-pre-ln (twin-pre-ln.pt, 300 tokens)",
                                         "twin-post-ln (twin-post-ln.pt, 300 tokens)"]
    for trace, result in zip(data, results, strict=True):
        np.testing.assert_array_equal(_numbers(trace["y"]), result.stats["growth"].mean.numpy())
    at.selectbox(key="cmp_measure").select("retention of the embedding").run()
    assert not at.exception and "twin-post-ln.pt holds no survival statistic (growth)" in at.error[0].value


def _numbers(y) -> np.ndarray:
    """Plotly figure JSON keeps arrays either as lists or as base64 ``{"dtype", "bdata"}``."""
    if isinstance(y, dict) and "bdata" in y:
        return np.frombuffer(base64.b64decode(y["bdata"]), dtype=np.dtype(y["dtype"])).astype(float)
    return np.array([np.nan if v is None else v for v in y], dtype=float)


def _grid(z) -> np.ndarray:
    """A heatmap's ``z`` from figure JSON: nested lists, or base64 with its ``shape``."""
    if isinstance(z, dict):
        return _numbers(z).reshape([int(s) for s in str(z["shape"]).split(",")])
    return np.array(z, dtype=float)


def test_norm_lab_switches_experiments():
    at = app("normlab")
    first = chart(at)["layout"]["title"]["text"]
    at.radio(key="experiment").set_value(
        "LayerNorm vs RMSNorm: invariances and speed").run()
    assert not at.exception and chart(at)["layout"]["title"]["text"] != first
    assert "RMSNorm" in chart(at)["layout"]["title"]["text"]


def test_models_page_lists_models_and_shows_anatomy():
    import residual_stream as rs

    at = app("models")
    assert "smollm2-135m" in at.selectbox(key="models_model").options
    at.selectbox(key="models_model").select("minilm-l6").run()
    assert "x = L0.ln_resid_attn(x)" in at.code[0].value
    norms = next(d.value for d in at.dataframe if "gain_mean" in d.value.columns)  # the Norms table
    want = rs.load("minilm-l6").module.embeddings.LayerNorm  # its first norm, read off the module
    assert norms["norm"].iloc[0] == "ln_embed" and norms["eps"].iloc[0] == want.eps
    assert norms["bias_norm"].iloc[0] == pytest.approx(float(want.bias.double().norm()), rel=1e-12)
    assert "worst relative error" in at.success[0].value


@pytest.mark.parametrize("text,message", [
    ("   ", "empty"), ("x" * 5000, "at most 4000"), ("word " * 3000, "at most 4000"),
])
def test_bad_text_shows_a_message(text, message):
    at = app()
    at.sidebar.text_area(key="text").set_value(text).run()
    assert not at.exception
    assert message in at.error[0].value


def test_pages_that_do_not_read_the_text_are_not_stopped_by_an_empty_one():
    """The Corpus page does not read the sidebar's text, yet an empty one stopped it with "The
    text is empty". Reference: the Overview page, which measures the text, still stops."""
    at = app()
    at.sidebar.text_area(key="text").set_value("  ").run()
    assert "empty" in at.error[0].value
    at.switch_page("views/corpus.py").run()
    assert not at.exception and not at.error
    assert at.title[0].value == "Corpus" and at.radio(key="corpus_source").value.startswith("built-in")
    at.switch_page("views/compare.py").run()  # over the text: stopped; over the corpus: runs
    assert not at.exception and "empty" in at.error[0].value
    at.radio(key="cmp_source").set_value("corpus").run()
    assert not at.exception and not at.error and at.get("plotly_chart")


def test_text_over_the_context_limit(monkeypatch):
    at = app()
    at.sidebar.selectbox(key="model").select("minilm-l6").run()   # context of 512 tokens
    at.sidebar.text_area(key="text").set_value("word " * 700).run()
    assert not at.exception
    assert at.error[0].value.startswith("The text is 702 tokens, over minilm-l6's limit of 512: "
                                        "shorten it")


def test_compare_names_the_model_whose_context_a_text_overflows():
    """With MiniLM in the sidebar (512 tokens) Compare said "text 0 is 1501 tokens, longer than
    the limit of 128 tokens" (its partner twin's) without naming a model, and offered
    ``overflow='chunk'``, which the app does not have. Reference: the twin's byte tokenizer,
    one token per byte plus BOS."""
    at = app("compare")
    at.sidebar.selectbox(key="model").select("minilm-l6").run()
    text = "word " * 60
    at.sidebar.text_area(key="text").set_value(text).run()
    assert not at.exception
    n = len(text.encode()) + 1
    assert at.error[0].value.startswith(f"The text is {n} tokens, over twin-post-ln's limit of 128")


def test_local_paths_need_the_allow_list(tmp_path, monkeypatch):
    allowed = tmp_path / "allowed"
    allowed.mkdir()
    monkeypatch.setenv("RESIDUAL_STREAM_ALLOWED_DIRS", str(allowed))
    at = app()
    at.sidebar.text_area(key="text").set_value("my own text").run()
    at.sidebar.selectbox(key="model").select("local path…").run()
    # nothing typed yet: what to type, not "'' is outside the allowed folders"
    assert not at.error and f"Type the path of a model folder or a .gguf file in an allowed " \
        f"folder: {allowed}" in unescaped(at.info[0].value)
    at.sidebar.text_input(key="path").set_value(str(tmp_path / "elsewhere")).run()
    # one error, not also "The text is empty"; the typed text kept
    assert [unescaped(e.value) for e in at.error] == [
        f"{str(tmp_path / 'elsewhere')!r} is outside the allowed folders; start the app with "
        "`residual-stream app --allow DIR` to allow one"]
    assert at.sidebar.text_area(key="text").value == "my own text"
    at.sidebar.text_input(key="path").set_value("~no_such_user_here/model").run()
    assert not at.exception and "is not a usable path" in at.error[0].value
    (allowed / "broken").mkdir()
    (allowed / "broken" / "config.json").write_text("{not json")
    at.sidebar.text_input(key="path").set_value(str(allowed / "broken")).run()
    assert not at.exception and "could not load" in at.error[0].value


def test_a_one_layer_model_from_a_local_path_shows_its_writes(tmp_path, monkeypatch):
    """One layer leaves the Writes page no layer to choose (a slider from 0 to 0 raised)."""
    from residual_stream.cli import main

    allowed = tmp_path / "allowed"
    monkeypatch.setenv("RESIDUAL_STREAM_ALLOWED_DIRS", str(allowed))
    assert main(["train", "--norm", "rmsnorm", "--placement", "pre", "--layers", "1", "--d-model", "32",
                 "--heads", "2", "--d-mlp", "64", "--n-ctx", "128", "--steps", "2", "--batch", "2",
                 "--warmup", "1", "--out", str(allowed / "one"), "--quiet"]) == 0
    at = app()
    at.sidebar.selectbox(key="model").select("local path…").run()
    at.sidebar.text_input(key="path").set_value(str(allowed / "one")).run()
    at.switch_page("views/writes.py").run()
    assert not at.exception, at.exception
    assert at.selectbox(key="write").options[0] == "L0.attn" and at.get("plotly_chart")


def test_unavailable_analysis_is_explained():
    at = app("flow")
    at.sidebar.selectbox(key="model").select("minilm-l6").run()
    assert not at.exception
    assert "without a trained masked-LM head" in at.info[0].value


def test_flow_page_shows_composition_with_and_without_the_norms_between():
    """MiniLM (post-LN): the composition heatmap by layer, then by head (one row per reading
    head); unticking 'writes as they reach the reader' shows the weights alone, which differ
    for a post-norm model; a CSV download sits beside it."""
    at = app("flow")
    at.sidebar.selectbox(key="model").select("minilm-l6").run()
    assert not at.exception, at.exception
    figure = chart(at, -1)
    assert figure["layout"]["title"]["text"].startswith("K composition, largest per layer pair (writes as")
    assert len(figure["data"][0]["y"]) == 6
    at.radio(key="comp_level").set_value("head").run()
    folded = chart(at, -1)["data"][0]
    assert len(folded["y"]) == 6 * 12
    at.checkbox(key="comp_norms").uncheck().run()
    weights = chart(at, -1)
    assert "weights alone" in weights["layout"]["title"]["text"]
    a, b = _grid(folded["z"]), _grid(weights["data"][0]["z"])
    assert np.nanmax(np.abs(a - b)) > 0.01
    assert at.get("download_button")[-2].proto.label == "Data (CSV)"


def _scan_button(at: AppTest):
    return next(b for b in at.button if b.label == "Scan")


def test_corpus_page_scans_and_draws_the_scan_statistics():
    """The page draws what ``rs.scan`` measured over the built-in corpus (reference: the same
    scan called directly), leaves out a lens the model cannot have, and offers the JSON."""
    import residual_stream as rs

    at = app("corpus")
    at.sidebar.selectbox(key="model").select("minilm-l6").run()
    assert "press Scan" in at.info[0].value and not at.get("plotly_chart")
    at.multiselect(key="corpus_stats").set_value(["growth", "survival", "read_attribution",
                                                  "lens:every=4"])
    at.select_slider(key="corpus_tokens").set_value(1024)
    _scan_button(at).click().run()
    assert not at.exception, at.exception
    assert "The scan leaves the lens out" in at.info[0].value
    assert "1,024 tokens of the built-in corpus" in at.caption[1].value
    titles = [chart(at, i)["layout"]["title"]["text"] for i in range(4)]
    assert titles[0].startswith("Stream norm by depth") and titles[1] == "Relative update size"
    assert titles[3] == "Survival of each write (retention)"
    reference = rs.scan(rs.load("minilm-l6"), "builtin", ["growth", "survival"], batch_size=8,
                        seq_len=128, max_tokens=1024, progress=False).stats
    mean = next(t for t in chart(at, 0)["data"] if t["name"].endswith(" mean"))["y"]
    assert np.allclose(_numbers(mean), reference["growth"].mean.numpy(), rtol=1e-5)
    retention = _grid(chart(at, 3)["data"][0]["z"])
    assert np.allclose(retention, reference["survival"].retention.numpy(), rtol=1e-4, equal_nan=True)
    assert {"Scan (JSON)", "Scan (whole, .pt)"} <= {b.label for b in at.get("download_button")}
    at.radio(key="corpus_surv").set_value("share").run()  # a rerun shows the kept scan
    assert not at.exception, at.exception  # was CacheReplayClosureError (the bar, replayed)
    assert chart(at, 3)["layout"]["title"]["text"] == "Survival of each write (share)"
    assert "1,024 tokens of the built-in corpus" in at.caption[1].value


def test_corpus_page_scans_write_subspaces_with_uploaded_directions():
    """Write subspaces over the corpus, an uploaded basis among them, drawn as the Writes page
    draws a text's. Reference: ``rs.scan`` with ``SubspaceStats(every=4, basis=rows)`` called
    directly; a basis of another width is said on the page, before anything is scanned."""
    import io

    import torch

    import residual_stream as rs

    at = app("corpus")
    at.sidebar.selectbox(key="model").select("twin-pre-ln").run()
    model = rs.load("twin-pre-ln")
    rows = torch.randn(3, model.anatomy.d_model, generator=torch.Generator().manual_seed(4))
    data = io.BytesIO()
    torch.save(rows, data)
    at.multiselect(key="corpus_stats").set_value(["subspaces:every=4"])
    at.file_uploader(key="corpus_basis").set_value(("probe.pt", data.getvalue(), "text/plain"))
    at.select_slider(key="corpus_tokens").set_value(1024)
    _scan_button(at).click().run()
    assert not at.exception and not at.error, [e.value for e in at.error]
    at.selectbox(key="corpus_measure").select("fraction in basis").run()
    assert not at.exception, at.exception
    want = rs.scan(model, "builtin", [rs.streaming.SubspaceStats(every=4, basis=rows)], batch_size=8,
                   seq_len=128, max_tokens=1024, progress=False).find("subspaces")
    _assert_basis_grid(chart(at), want)
    wide = io.BytesIO()
    torch.save(torch.ones(2, model.anatomy.d_model + 1), wide)
    at.file_uploader(key="corpus_basis").set_value(("wide.pt", wide.getvalue(), "text/plain"))
    _scan_button(at).click().run()
    assert not at.exception and "not a tensor of shape" in unescaped(at.error[0].value)


def test_corpus_page_opens_a_saved_scan_without_loading_its_model(tmp_path, monkeypatch):
    """A scan saved whole (``.pt``) and uploaded is drawn as the scan itself would be (reference:
    the scan's own results), without loading a model; a resumable state or another file is
    refused on the page (the uploader takes only .pt files); removing the file brings the scan
    form back."""
    import residual_stream as rs
    from residual_stream import loading

    result = rs.scan(rs.load("twin-post-ln"), "builtin", ["growth", "survival", "lens:every=4"],
                     max_tokens=500, progress=False)
    at = app("corpus")
    loads = []
    monkeypatch.setattr(loading, "load", lambda *a, **k: loads.append(a) or pytest.fail("a model loaded"))
    saved = result.save(tmp_path / "cluster.pt").read_bytes()
    at.file_uploader(key="corpus_saved").set_value(("cluster.pt", saved, "application/octet-stream")).run()
    assert not at.exception, at.exception
    assert "twin-post-ln over 500 tokens in" in at.caption[1].value and "cluster.pt" in at.caption[1].value
    titles = [chart(at, i)["layout"]["title"]["text"] for i in range(4)]
    assert titles[0].startswith("Stream norm by depth") and titles[2] == "Survival of each write (retention)"
    mean = next(t for t in chart(at, 0)["data"] if t["name"].endswith(" mean"))["y"]
    np.testing.assert_array_equal(_numbers(mean), result.stats["growth"].mean.numpy())
    np.testing.assert_array_equal(_grid(chart(at, 2)["data"][0]["z"]),
                                  result.stats["survival"].retention.numpy())
    assert not loads
    state = tmp_path / "state.pt"  # a resumable state, and a file of something else
    rs.scan(rs.load("twin-post-ln"), ["alpha beta"], ["growth"], state=state, progress=False)
    for name, data, message in (("state.pt", state.read_bytes(), "state.pt is a scan's resumable state"),
                                ("weights.pt", b"not a torch file", "weights.pt is not a saved scan")):
        at.file_uploader(key="corpus_saved").set_value((name, data, "application/octet-stream")).run()
        assert not at.exception and message in at.error[0].value and not at.get("plotly_chart")
    at.file_uploader(key="corpus_saved").set_value(None).run()
    assert not at.exception and "press Scan" in at.info[0].value


def _source(at: AppTest, start: str) -> None:
    """Pick the Corpus page's source whose label starts with ``start`` (its inputs appear on the rerun)."""
    radio = at.radio(key="corpus_source")
    radio.set_value(next(o for o in radio.options if o.startswith(start))).run()


def test_corpus_page_refuses_paths_outside_the_allow_list_and_no_statistics(tmp_path, monkeypatch):
    allowed = tmp_path / "allowed"
    allowed.mkdir()
    monkeypatch.setenv("RESIDUAL_STREAM_ALLOWED_DIRS", str(allowed))
    at = app("corpus")
    at.sidebar.selectbox(key="model").select("minilm-l6").run()
    _source(at, "a file or folder")
    at.text_input(key="corpus_path").set_value(str(tmp_path / "elsewhere.txt"))
    _scan_button(at).click().run()
    assert not at.exception and "outside the allowed folders" in at.error[0].value
    at.text_input(key="corpus_path").set_value(str(allowed / "missing.txt"))
    _scan_button(at).click().run()
    assert not at.exception and "missing.txt" in at.error[0].value and not at.get("plotly_chart")
    (allowed / "bad.txt.gz").write_bytes(b"not gzip")
    at.text_input(key="corpus_path").set_value(str(allowed / "bad.txt.gz"))
    _scan_button(at).click().run()
    assert not at.exception and "bad.txt.gz is not a complete gzip file" in at.error[0].value
    at.run()  # any rerun: the failed scan is not run again
    assert not at.exception and not at.error, [e.value for e in at.error]
    assert "press Scan" in at.info[0].value
    _source(at, "built-in")
    at.multiselect(key="corpus_stats").set_value([])
    _scan_button(at).click().run()
    assert not at.exception and "at least one statistic" in at.error[0].value


def test_corpus_page_says_why_a_local_model_does_not_load(tmp_path, monkeypatch):
    """The Corpus page loaded the model outside the error guard: an unloadable model was an
    uncaught exception there (a message on every other page)."""
    monkeypatch.setenv("RESIDUAL_STREAM_ALLOWED_DIRS", str(tmp_path))
    (tmp_path / "broken").mkdir()
    (tmp_path / "broken" / "config.json").write_text("{not json")
    at = app("corpus")
    at.sidebar.selectbox(key="model").select("local path…").run()
    at.sidebar.text_input(key="path").set_value(str(tmp_path / "broken")).run()
    _scan_button(at).click().run()
    assert not at.exception, at.exception
    assert "could not load" in at.error[0].value and not at.get("plotly_chart")


def test_corpus_page_scans_a_file_again_once_it_changes(tmp_path, monkeypatch):
    """A scan's cache key holds the corpus's fingerprint, not only its path: the same file
    rewritten is scanned again (before, the first result was shown), an unchanged one is not.
    Reference: the tokens ``rs.scan`` reads from each version of the file."""
    import residual_stream as rs

    monkeypatch.setenv("RESIDUAL_STREAM_ALLOWED_DIRS", str(tmp_path))
    corpus = tmp_path / "notes.txt"
    model = rs.load("minilm-l6")

    def tokens() -> int:
        return rs.scan(model, str(corpus), "growth", batch_size=8, seq_len=128,
                       progress=False).tokens

    at = app("corpus")
    at.sidebar.selectbox(key="model").select("minilm-l6").run()
    _source(at, "a file or folder")
    at.text_input(key="corpus_path").set_value(str(corpus))
    for text in ("A short first note.\nAnd a second.\n", "Now the file holds a much longer "
                 "line than before, so the scan reads more tokens.\n" * 3):
        corpus.write_text(text)
        _scan_button(at).click().run()
        assert not at.exception, at.exception
        assert f"over {tokens():,} tokens of {corpus}" in unescaped(at.caption[1].value)
    shown = at.caption[1].value
    _scan_button(at).click().run()  # unchanged: the cached scan (same seconds and rate)
    assert at.caption[1].value == shown


def test_corpus_page_reads_bytes_that_are_not_utf8_when_asked(tmp_path, monkeypatch):
    """A Latin-1 file is refused, the error pointing to the page's box (not to an API argument);
    with the box ticked it is scanned as ``rs.Corpus(encoding_errors="replace")`` scans it.
    Reference: the tokens of that scan."""
    import residual_stream as rs

    monkeypatch.setenv("RESIDUAL_STREAM_ALLOWED_DIRS", str(tmp_path))
    corpus = tmp_path / "latin1.txt"
    corpus.write_bytes(b"caf\xe9 au lait, cr\xe8me br\xfbl\xe9e\nA second line in plain ASCII.\n")
    at = app("corpus")
    at.sidebar.selectbox(key="model").select("minilm-l6").run()
    _source(at, "a file or folder")
    at.text_input(key="corpus_path").set_value(str(corpus))
    _scan_button(at).click().run()
    assert not at.exception, at.exception
    error = unescaped(at.error[0].value)
    assert "latin1.txt is not UTF-8 text: byte 3 (line 1) is 0xe9" in error
    assert "the box 'Read bytes that are not UTF-8 as U+FFFD' on this page" in error, error
    at.checkbox(key="corpus_replace").check()
    _scan_button(at).click().run()
    assert not at.exception and not at.error, [e.value for e in at.error]
    want = rs.scan(rs.load("minilm-l6"), rs.streaming.Corpus(corpus, encoding_errors="replace"), "growth",
                   batch_size=8, seq_len=128, progress=False).tokens
    assert f"over {want:,} tokens of {corpus} (bytes that are not UTF-8 read as U+FFFD)" \
        in unescaped(at.caption[1].value)
    told = unescaped(at.warning[0].value)  # which file held them, and where its first one is
    assert told.startswith("Bytes that are not UTF-8 were read as U+FFFD in 1 file of the corpus") and \
        f"- {corpus} is not UTF-8 text: byte 3 (line 1) is 0xe9" in told, told
    (tmp_path / "clean.txt").write_text("A clean line.\n", encoding="utf-8")
    at.text_input(key="corpus_path").set_value(str(tmp_path / "clean.txt"))
    _scan_button(at).click().run()
    assert not at.exception and not at.warning, [w.value for w in at.warning]


def test_corpus_page_scans_an_uploaded_file_by_its_text_field(tmp_path, monkeypatch):
    """An uploaded .jsonl.gz whose texts are in another field is scanned as ``rs.scan`` scans the
    same bytes from a file with ``text_field=`` (reference: that scan's token count and mean
    norms); no file or a field the records lack is said on the page, and nothing is scanned.
    Two files uploaded together are scanned as a folder of them (reference: ``rs.scan`` of one)."""
    import gzip
    import tempfile

    import residual_stream as rs

    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path / "tmp"))  # where uploads are stored
    (tmp_path / "tmp").mkdir()
    records = [{"id": i, "content": f"Note {i}: the stream carries every write to every later reader."}
               for i in range(12)]
    data = gzip.compress("\n".join(json.dumps(r) for r in records).encode())
    at = app("corpus")
    at.sidebar.selectbox(key="model").select("minilm-l6").run()
    _source(at, "files you upload")
    _scan_button(at).click().run()
    assert not at.exception and "Upload a corpus file" in at.error[0].value
    at.file_uploader(key="corpus_file").set_value([("notes.jsonl.gz", data, "application/gzip")])
    _scan_button(at).click().run()
    error = unescaped(at.error[0].value)
    assert not at.exception and error.startswith("notes.jsonl.gz:1 has no 'text' field (it has ['content', "
                                                 "'id']); name the field that holds the text (the box "
                                                 "'Text field' on this page)"), error
    assert not at.get("plotly_chart") and not at.get("progress")  # the bar went with the failed scan
    at.text_input(key="corpus_field").set_value("content")
    _scan_button(at).click().run()
    assert not at.exception and not at.error, [e.value for e in at.error]
    reference_file = tmp_path / "notes.jsonl.gz"
    reference_file.write_bytes(data)
    want = rs.scan(rs.load("minilm-l6"), rs.streaming.Corpus(reference_file, text_field="content"), "growth",
                   batch_size=8, seq_len=128, progress=False)
    assert f"over {want.tokens:,} tokens of the uploaded notes.jsonl.gz in" in unescaped(at.caption[1].value)
    mean = next(t for t in chart(at, 0)["data"] if t["name"].endswith(" mean"))["y"]
    assert np.allclose(_numbers(mean), want.stats["growth"].mean.numpy(), rtol=1e-5)
    stored = list((tmp_path / "tmp").rglob("*"))
    assert [f.name for f in stored if f.is_file()] == ["notes.jsonl.gz"], stored  # no .part left
    shards = {"b.jsonl": records[6:], "a.jsonl": records[:6]}  # several files: read in name order
    shard_dir = tmp_path / "shards"
    shard_dir.mkdir()
    for name, part in shards.items():
        (shard_dir / name).write_text("\n".join(json.dumps(r) for r in part))
    at.file_uploader(key="corpus_file").set_value(
        [(name, (shard_dir / name).read_bytes(), "application/json") for name in shards])
    _scan_button(at).click().run()
    assert not at.exception and not at.error, [e.value for e in at.error]
    want = rs.scan(rs.load("minilm-l6"), rs.streaming.Corpus(shard_dir, text_field="content"), "growth",
                   batch_size=8, seq_len=128, progress=False)
    assert f"over {want.tokens:,} tokens of the 2 uploaded files a.jsonl, b.jsonl in" in \
        unescaped(at.caption[1].value)
    mean = next(t for t in chart(at, 0)["data"] if t["name"].endswith(" mean"))["y"]
    assert np.allclose(_numbers(mean), want.stats["growth"].mean.numpy(), rtol=1e-5)


def test_an_upload_is_stored_once_per_content_under_a_name_of_its_own(tmp_path, monkeypatch):
    """The browser sends each file's name: a path in it, or characters a path should not hold, are
    dropped (the suffixes kept, they say how it is read); the same files reuse one copy; several
    files are a folder of them, two of one name refused; the last used uploads are kept."""
    import tempfile

    from residual_stream.errors import InputError

    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    monkeypatch.syspath_prepend(str(Path(APP).parent))
    import cache

    first = Path(cache.stored_upload([("../../etc/cor pus?.jsonl.gz", b"abc")]))
    assert first.name == "cor_pus_.jsonl.gz" and first.read_bytes() == b"abc"
    assert first.parent.parent == tmp_path / cache.UPLOADS
    assert Path(cache.stored_upload([(r"C:\Users\me\cor pus?.jsonl.gz", b"abc")])) == first
    assert Path(cache.stored_upload([("...", b"abc")])).name == "corpus.txt"
    other = Path(cache.stored_upload([("cor pus?.jsonl.gz", b"abd")]))
    assert other != first and other.read_bytes() == b"abd" and first.read_bytes() == b"abc"
    both = Path(cache.stored_upload([("b.txt", b"second"), ("a.txt", b"first")]))
    assert both.is_dir() and sorted(f.name for f in both.iterdir()) == ["a.txt", "b.txt"]
    assert Path(cache.stored_upload([("a.txt", b"first"), ("b.txt", b"second")])) == both  # any order
    with pytest.raises(InputError, match="two uploaded files are named 'a.txt': rename one"):
        cache.stored_upload([("x/a.txt", b"1"), ("y/a.txt", b"2")])
    assert not [f for f in tmp_path.rglob("*.part")]
    monkeypatch.setattr(cache, "UPLOADS_KEPT", 2)  # the last used kept, the oldest dropped
    for i, folder in enumerate((first.parent, other.parent, both)):
        os.utime(folder, ns=(i + 1, i + 1))
    assert cache.stored_upload([("cor pus?.jsonl.gz", b"abc")]) == str(first)  # used again: kept
    third = Path(cache.stored_upload([("c.txt", b"xyz")]))
    assert third.is_file() and first.is_file() and not other.exists() and not both.exists()


def test_the_scan_progress_gives_the_rate_and_the_time_left(monkeypatch):
    """The Corpus page's bar, by hand: 1,024 of 4,096 tokens in 4 s is 256 tokens/s, 12 s left;
    its target for the built-in corpus is what a scan of all of it reads."""
    import residual_stream as rs

    monkeypatch.syspath_prepend(str(Path(APP).parent))
    import cache
    import common

    assert common.scan_progress(1024, 4096, 4.0) == (
        0.25, "Scanning… 1,024 of 4,096 tokens · 256 tokens/s · about 12 s left")
    assert common.scan_progress(0, 4096, 0.0) == (0.0, "Scanning… 0 of 4,096 tokens")
    assert common.scan_progress(4100, 4096, 1.0)[0] == 1.0  # never past the end
    whole = rs.scan(rs.load("twin-pre-ln"), "builtin", "growth", progress=False)
    assert cache.builtin_tokens("twin-pre-ln") == whole.tokens


def test_flow_page_patches_the_stream_from_a_corrupted_text():
    """The DLA logit's stream patching: with one token changed, patching that token at point 0
    (the embeddings) *is* the corrupted run (share 1), tokens before it change nothing (share
    0), and the note's two values are the logits of plain HF forwards of the two texts. A
    corrupted text of another token count is refused in the section."""
    import torch

    import residual_stream as rs

    at = app("flow")
    text = at.sidebar.text_area(key="text").value
    corrupted = text.replace(" back.", " out.")
    model = rs.load("smollm2-135m", progress=False)
    ids = [model.tokenizer(t, return_tensors="pt")["input_ids"] for t in (text, corrupted)]
    assert ids[0].shape == ids[1].shape
    differ = int((ids[0] != ids[1]).nonzero()[0, 1])
    with torch.no_grad():
        clean, other = (model.module(input_ids=i).logits[0, -1].double() for i in ids)
    top = int(clean.argmax())
    at.text_input(key="patch_text").input(corrupted).run()
    assert not at.exception, at.exception
    fig = chart(at, 4)
    assert "Patching the stream" in fig["layout"]["title"]["text"]
    z = _grid(fig["data"][0]["z"])  # [point, token]
    assert z.shape == (model.anatomy.n_layers + 1, ids[0].shape[1])
    assert z[0, differ] == pytest.approx(1.0, abs=1e-3)
    assert (z[:, :differ] == 0).all()
    notes = [unescaped(m.value) for m in at.markdown]
    note = next(n for n in notes if "corrupted text's" in n)
    assert f"({float(clean[top]):.3f})" in note and f"({float(other[top]):.3f})" in note
    at.radio(key="patch_method").set_value("estimated").run()  # attribution patching: same axes
    assert not at.exception, at.exception
    estimated = _grid(chart(at, 4)["data"][0]["z"])
    assert estimated.shape == z.shape and (estimated[:, :differ] == 0).all()
    assert np.corrcoef(estimated.flatten(), z.flatten())[0, 1] > 0.5 and not np.allclose(estimated, z)
    heads = chart(at, 5)  # every head's patch estimated; the 20 largest measured on request
    assert "one head patched" in heads["layout"]["title"]["text"] and len(heads["data"]) == 1
    assert len(heads["data"][0]["y"]) == 20
    at.checkbox(key="patch_heads_measure").check().run()
    assert not at.exception, at.exception
    bars = chart(at, 5)["data"]
    assert [b["name"] for b in bars] == ["estimated", "measured"] and bars[1]["y"] == bars[0]["y"]
    with torch.no_grad():  # the largest head's measured change by hooks of the test's own
        largest = bars[0]["y"][0]
        layer, h = (int(x) for x in largest[1:].split("H"))
        o_proj, seen = model.module.model.layers[layer].self_attn.o_proj, []
        record = o_proj.register_forward_pre_hook(lambda m, a: seen.append(a[0].clone()))
        model.module(input_ids=ids[1])
        record.remove()
        part = slice(h * 64, (h + 1) * 64)

        def patch(m, a):
            z = a[0].clone()
            z[..., part] = seen[0][..., part]
            return (z,)

        handle = o_proj.register_forward_pre_hook(patch)
        patched = model.module(input_ids=ids[0]).logits[0, -1].double()
        handle.remove()
    measured = _numbers(bars[1]["x"]) if isinstance(bars[1]["x"], dict) else np.array(bars[1]["x"])
    assert measured[0] == pytest.approx(float(patched[top] - clean[top]), abs=2e-3)
    at.text_input(key="patch_text").input(corrupted + " And more.").run()
    assert not at.exception and "the same token length" in unescaped(at.error[0].value)


def test_flow_page_patches_each_heads_path_into_the_typed_receivers():
    """Path patching on request: every head into the typed receiver, the figure's cells the
    shares of ``rs.path_patch`` itself (checked against hooks in ``tests/test_paths.py``), heads
    after the receiver blank; an unknown receiver is refused in the section."""
    import torch

    import residual_stream as rs

    at = app("flow")
    text = at.sidebar.text_area(key="text").value
    corrupted = text.replace(" back.", " out.")
    at.text_input(key="patch_text").input(corrupted).run()
    at.text_input(key="paths_receivers").input("L2.attn").run()
    at.checkbox(key="paths_run").check().run()
    assert not at.exception, at.exception
    fig = next(chart(at, i) for i in range(len(at.get("plotly_chart")))
               if "Path patching" in chart(at, i)["layout"]["title"]["text"])
    z, senders = _grid(fig["data"][0]["z"])[:, 0], list(fig["data"][0]["y"])
    assert fig["data"][0]["x"] == ["L2.attn"] and len(senders) == 20
    model = rs.load("smollm2-135m", progress=False)
    tr, other = rs.trace(model, text), rs.trace(model, corrupted)
    ids = model.tokenizer(text, return_tensors="pt")["input_ids"]
    with torch.no_grad():
        top = int(model.module(input_ids=ids).logits[0, -1].argmax())
    want = rs.path_patch(tr, other, lambda logits: logits[0, -1, top], senders=senders, receivers="L2.attn")
    early = np.array([int(s[1:s.index("H")]) < 2 for s in senders])
    share = want.share()[early, 0].numpy()  # stacked runs of other sizes round differently (~1e-6)
    assert np.allclose(z[early], share, atol=1e-4) and np.isnan(z[~early]).all()
    assert np.abs(share).max() > 0.01  # a check with teeth: some head's path moves the logit
    assert early.sum() == 18  # blocks 0 and 1 reach block 2; the 20 rows are all 18 and 2 blank ones
    at.text_input(key="paths_receivers").input("L99.attn").run()
    assert not at.exception and "no receiver 'L99.attn'" in unescaped(at.error[0].value)


def test_a_text_encoder_from_a_pipeline_folder_runs_every_page_that_reads_text(tmp_path, monkeypatch):
    """A diffusion pipeline's T5 text encoder (``text_encoder_2``, its tokenizer in ``tokenizer_2``),
    typed as a local path: Overview, Writes and Flow each draw their figures for a model without an LM
    head, with no error and nothing raised."""
    from test_loading import save_t5_pipeline

    allowed = tmp_path / "allowed"
    pipeline = save_t5_pipeline(allowed / "pipeline")
    monkeypatch.setenv("RESIDUAL_STREAM_ALLOWED_DIRS", str(allowed))
    at = app()
    at.sidebar.selectbox(key="model").select("local path…").run()
    at.sidebar.text_input(key="path").set_value(str(pipeline / "text_encoder_2")).run()
    assert not at.exception and not at.error, [e.value for e in at.error]
    for page in ("overview", "writes", "flow"):
        at.switch_page(f"views/{page}.py").run()
        assert not at.exception, (page, at.exception)
        assert not at.error, (page, [e.value for e in at.error])
        assert at.get("plotly_chart"), page
    assert any("LM head" in i.value for i in at.info), [i.value for i in at.info]  # (Flow: what needs logits)
