"""Writes: one write split into subspaces at one token; a measure over layers × components."""

import cache
import common
import pandas as pd
import streamlit as st

import residual_stream as rs
from residual_stream import plotting
from residual_stream.analyses.subspaces import named_bases
from residual_stream.plotting.labels import readable

name, text = common.selection()
st.title("Writes")
with common.guarded():
    model, tr = cache.model(name), cache.trace(name, text)
a = model.anatomy
with st.expander("Directions of your own"):
    upload = st.file_uploader(f"Rows [k, {a.d_model}] (probe directions, a steering vector, SAE decoder "
                              "rows) as torch.save, numpy.save or safetensors write them: measured as one "
                              "more subspace, 'basis', below", type=["pt", "pth", "npy", "safetensors"],
                              key="writes_basis")
basis = None if upload is None else (upload.name, upload.getvalue())
try:  # a file that cannot serve is said, and the page goes on without it
    rows = cache.basis_rows(basis, a.d_model)
except rs.errors.InputError as e:
    st.error(common.explain(e))
    basis = rows = None
if rows is not None:
    named = named_bases(rows)  # the subspaces' names
    st.caption(common.plain(f"{upload.name}: " + ", ".join(f"{len(r)} direction(s) as the subspace '{k}'"
                                                           for k, r in named.items()) + ", below."))
left, mid, right = st.columns(3)
layer = left.slider("Layer", 0, a.n_layers - 1, 0, key="layer") if a.n_layers > 1 else 0
options = [f"L{layer}.attn", *(f"L{layer}H{h}" for h in range(a.n_heads))]
if any(c.name == f"L{layer}.mlp" for c in a.components):
    options.append(f"L{layer}.mlp")
write = mid.selectbox("Write", options, key="write")
tokens = tr.str_tokens[0]
pos = right.selectbox("Token", range(len(tokens)), format_func=lambda i: f"{i}: {readable(tokens[i])}",
                      key="token")
with common.guarded():
    names, fractions = cache.split(name, text, write, pos, basis)
frame = pd.DataFrame({"part": names, "fraction": fractions.numpy()})
common.show(plotting.subspace_bars(names, fractions[None], [f"{write} @ {pos}"],
                                   title=f"{write} at token {pos}, split into orthogonal subspaces"),
            frame, key="split", note=(
    "The write's energy ‖w‖² split over subspaces taken in order, each keeping only what the "
    "earlier ones left: the all-ones direction (what LayerNorm removes), the unembedding's top "
    "directions (what the logits read most), the stream's top principal components, your own "
    "directions if given (orthonormalized), and the rest. Fractions sum to 1."))

st.subheader("A measure over layers × components")
with common.guarded():
    ws = cache.write_subspaces(name, text, basis)
common.subspace_measure(ws, key="measure", over="the text's tokens")
