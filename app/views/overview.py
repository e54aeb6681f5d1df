"""Overview: anatomy as a stream program, norm growth, relative update sizes."""

import cache
import common
import streamlit as st

from residual_stream import plotting

name, text = common.selection()
st.title("Overview")
with common.guarded():
    model = cache.model(name)
    growth = cache.norm_growth(name, text)
    report = cache.conservation(name, text)
a = model.anatomy
st.caption(f"{common.plain(name)}: {a.architecture}, {a.placement}-norm ({a.norm_kind}), "
           f"{a.n_layers} layers, "
           f"d_model {a.d_model}, {a.n_heads} heads · conservation worst relative error "
           f"{report.relative_error.max():.1e} over {len(report)} checks")
common.show(plotting.program_figure(a), a.to_frame(), key="program", note=(
    "The black line is the residual stream. Blue triangles: a component reads the stream (through "
    "the norm named on hover). Green circles: a write is added (through its own norm in sandwich "
    "models). Red squares: the whole stream is normalized (after every block in post-norm). In "
    "pre-norm programs the only red square is the final norm, so every write reaches it "
    "unchanged; a model without norms has none."))
common.show(plotting.norm_growth_figure(growth, name=name), growth.to_frame(), key="growth", note=(
    "Mean, median and the 5–95 % band of the stream's L2 norm over tokens, entering each block; "
    "the first token is drawn apart because BOS/CLS tokens often carry outsized norms. The title "
    "gives the fitted growth per layer. Log scale."))
common.show(plotting.update_size_figure(growth, name=name), growth.to_frame(), key="updates", note=(
    "‖write‖ / ‖stream before it‖ for each attention and MLP: how much each sublayer changes the "
    "stream. In pre-norm models this shrinks as the stream grows."))
