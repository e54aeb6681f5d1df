"""Norm lab: the training-stability experiments of the twins."""

import cache
import common
import streamlit as st

st.title("Norm lab")
experiments = {
    "Forward norm at initialization (Xiong et al. 2020, Lemma 2)": "forward",
    "Gradient norms at initialization (Xiong et al. 2020, Theorem 1)": "gradients",
    "DeepNorm: model update over the first steps (Wang et al. 2022)": "deepnorm",
    "LayerNorm vs RMSNorm: invariances and speed": "norms",
    "Warm-up sensitivity (short trainings)": "warmup",
}
notes = {
    "forward": "E‖x‖²/d against depth at initialization, in the paper's simplified setting. "
               "Pre-LN: the stream grows linearly. Post-LN: the sum entering each LayerNorm stays "
               "at one scale.",
    "gradients": "‖∂L/∂W_out‖ of each FFN at initialization. Post-LN's gradients grow towards the "
                 "output; pre-LN's do not, and its last layer's gradient shrinks with depth.",
    "deepnorm": "RMS change of the final hidden states on a fixed batch after each Adam step, for a "
                "48-layer post-LN model and its DeepNorm twin. Post-LN's first update jumps.",
    "norms": "RMSNorm's speed-up over LayerNorm (time LN / time RMS), eager, this machine. Reported, "
             "not asserted: the source article quotes 7–64 %.",
    "warmup": "Training loss of post-LN and pre-LN twins with and without warm-up.",
}
label = st.radio("Experiment", list(experiments), key="experiment")
kind = experiments[label]
with common.guarded():
    result = cache.experiment(kind)
if kind == "norms":
    st.dataframe(result.invariances, hide_index=True)
common.show(result.figure(), result.to_frame(), key=f"lab-{kind}", note=notes[kind])
