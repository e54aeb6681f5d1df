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
    "gradients": "‖∂L/∂W_out‖ of each FFN at initialization, in the paper's simplified setting. "
                 "Right (Theorem 1): as layers are added, pre-LN's last-layer gradient shrinks "
                 "(about as 1/√depth, the theorem's bound); post-LN's stays at one scale. Left: "
                 "across one model's layers, pre-LN's fall more steeply towards the output than "
                 "post-LN's. At this "
                 "size post-LN's do not rise towards the output as in the paper's Fig. 3. "
                 "Sandwich sits far lower because its twins start the gains of the norms after "
                 "each write at 0.02/√(2N).",
    "deepnorm": "RMS change of the final hidden states on a fixed batch after each Adam step, for a "
                "48-layer post-LN model and its DeepNorm twin. Post-LN's first update jumps.",
    "norms": "RMSNorm's speed-up over LayerNorm (time LN / time RMS), eager, this machine. Reported, "
             "not asserted: the source article quotes 7–64 %.",
    "warmup": "Training loss of post-LN and pre-LN twins with and without warm-up.",
}
waits = {  # measured on 2 CPU cores at the app's sizes (app/cache.py: experiment)
    "forward": "24-layer models at initialization, a few seconds",
    "gradients": "16 backward passes (4 placements, 4 depths), a few seconds",
    "deepnorm": "two 48-layer models trained 10 steps each, about 10 s on 2 CPU cores",
    "norms": "timing both norms, a few seconds",
    "warmup": "four trainings of 150 steps, about 30 s on 2 CPU cores",
}
label = st.radio("Experiment", list(experiments), key="experiment")
kind = experiments[label]
with common.guarded(), st.spinner(f"Running the experiment: {waits[kind]}…"):
    result = cache.experiment(kind)
if kind == "norms":
    st.dataframe(result.invariances, hide_index=True)
common.show(result.figure(), result.to_frame(), key=f"lab-{kind}", note=notes[kind])
