"""Compare: two models on the same text (or corpus), or saved scans, depth aligned."""

import cache
import common
import pandas as pd
import plotly.graph_objects as go
import streamlit as st

import residual_stream as rs
from residual_stream.errors import InputError
from residual_stream.plotting.labels import escape

CORPUS_TOKENS = 4096  # the Corpus page's default budget: a growth scan there is reused here

name, text = common.selection(text=False)  # checked below, when the text is what is measured
st.title("Compare")
table = cache.registry()
names = [n for n in table[table.installed].name.tolist() if n != name]  # never itself
if not names:
    st.info("Install a second model to compare with (`residual-stream models` lists them).")
    st.stop()
if st.session_state.get("other") not in names:  # it was the model now in the sidebar
    st.session_state.pop("other", None)
default = next((n for n in ("twin-post-ln", "minilm-l6") if n in names), names[0])
other = st.selectbox("Compare with", names, index=names.index(default), key="other")
measure = st.selectbox("Measure", ["mean stream norm", "relative update (attention)",
                                   "relative update (MLP)", "all-ones share",
                                   "retention of the embedding"], key="cmp_measure")
SOURCES = {"text": "the sidebar's text",
           "corpus": f"the built-in corpus ({CORPUS_TOKENS:,} tokens, rs.scan)",
           "upload": f"corpus files you upload ({CORPUS_TOKENS:,} tokens, rs.scan)",
           "saved": "saved scans (.pt files)"}
source = st.radio("Measured over", list(SOURCES), format_func=SOURCES.get, horizontal=True,
                  key="cmp_source")
if source == "text" and common.text_problem(text):
    st.error(common.text_problem(text))
    st.stop()
corpus = ("builtin", "text", "strict")  # the scans' corpus, text_field, encoding_errors
if source == "upload":
    uploaded, _ = common.corpus_uploader("cmp_corpus")
    field, reading = common.corpus_options("cmp")
    if not uploaded:
        st.info(f"Upload a corpus file: each model scans its first {CORPUS_TOKENS:,} tokens.")
        st.stop()
    with common.guarded():
        corpus = (cache.stored_upload(uploaded), field, reading)


def results(model_name: str) -> tuple:
    """``(norm growth, survival or None)`` over the text, the built-in corpus or the uploaded one."""
    survival = measure == "retention of the embedding"
    if source == "text":
        return cache.norm_growth(model_name, text), cache.survival(model_name, text) if survival else None
    path, field, reading = corpus
    stats = cache.scan(model_name, path, CORPUS_TOKENS, ("growth", "survival") if survival else ("growth",),
                       reading, text_field=field).stats
    return stats["growth"], stats.get("survival")


def saved_results() -> dict[str, tuple]:
    """``{label: (norm growth, survival or None)}`` of the uploaded saved scans (``rs.load_scan``)."""
    files = st.file_uploader("Scans saved whole (scan.save('x.pt'), --out x.pt; from a cluster, say): "
                             "each one a curve, no model loaded", type=["pt"], accept_multiple_files=True,
                             key="cmp_saved")
    if not files:
        st.info("Upload one or more saved scans to compare (those of other models, or of one "
                "model over other corpora).")
        st.stop()
    out = {}
    for f in files:
        scan = rs.load_scan(f)
        growth, survival = scan.find("growth"), scan.find("survival", lambda s: "embed" in s.sources)
        if growth is None or (survival is None and measure == "retention of the embedding"):
            need = "growth" if growth is None else "survival"
            raise InputError(f"{f.name} holds no {need} statistic ({', '.join(scan.stats)}): scan "
                             f"with --stats {need}, or pick another measure")
        out[f"{scan.model_name} ({f.name}, {scan.tokens:,} tokens)"] = (growth, survival)
    return out


def series(model_name: str, measured: tuple | None = None) -> pd.DataFrame:
    g, s = results(model_name) if measured is None else measured
    if measure == "retention of the embedding":
        values = s.retention[s.sources.index("embed")].numpy()
    else:
        values = {"mean stream norm": g.mean, "relative update (attention)": g.update_attn,
                  "relative update (MLP)": g.update_mlp, "all-ones share": g.ones_share}[measure].numpy()
    depth = [i / max(len(values) - 1, 1) for i in range(len(values))]
    return pd.DataFrame({"model": model_name, "relative_depth": depth, "value": values})


with common.guarded():
    if source == "saved":
        frame = pd.concat([series(label, m) for label, m in saved_results().items()], ignore_index=True)
    else:
        frame = pd.concat([series(name), series(other)], ignore_index=True)
fig = go.Figure([go.Scatter(x=f.relative_depth, y=f.value, name=escape(m), mode="lines+markers")
                 for m, f in frame.groupby("model", sort=False)])
fig.update_layout(title=f"{measure}: " + (", ".join(escape(m) for m in frame.model.unique())
                                         if source == "saved" else f"{escape(name)} vs {escape(other)}"),
                  xaxis_title="relative depth (0 = first block's update, 1 = last block's)"
                  if measure.startswith("relative update") else
                  "relative depth (0 = embeddings, 1 = after the last block)",
                  yaxis_title=measure, yaxis_type="log" if "norm" in measure else "linear")
common.show(fig, frame, key="compare", note=(
    "Both models on the same text, or on the first tokens of the built-in corpus or of an uploaded "
    "one (each model's own tokens: a byte-level twin covers fewer of its texts than a subword "
    "model), or each saved "
    "scan over every token it read. Depth is "
    "relative so models with different layer counts align. "
    "Pre-norm streams grow and keep every contribution (retention 1); post-norm streams are "
    "renormalized every block."))
