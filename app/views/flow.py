"""Flow: the read-write graph, survival, the logit lens, logit attribution, what heads attend to."""

import math

import cache
import common
import pandas as pd
import streamlit as st

from residual_stream import plotting
from residual_stream.errors import NotAvailableError, ResidualStreamError
from residual_stream.plotting.labels import escape, readable


def one_token(model, typed: str, what: str) -> int | None:
    """The id of ``typed`` if it is one token, None when empty; ``ValueError`` saying why if not."""
    if not typed:
        return None
    ids = list(model.tokenizer(typed, add_special_tokens=False)["input_ids"])  # HF's and the twins'
    if len(ids) != 1:
        raise ValueError(f"The {what} is {len(ids)} tokens ({model.tokenizer.convert_ids_to_tokens(ids)}); "
                         "type text that is one token, e.g. ' Paris' with its leading space.")
    return ids[0]


def logit_attribution(name: str, text: str, model, tr) -> None:
    """Direct logit attribution at one token of the first text: its largest terms as bars."""
    st.subheader("Direct logit attribution")
    tokens = tr.str_tokens[0]
    if st.session_state.get("dla_for") != (name, text):  # a new text or model: its last token
        st.session_state["dla_for"] = (name, text)
        st.session_state["dla_pos"] = len(tokens) - 1
    c1, c2, c3 = st.columns(3)
    pos = c1.selectbox("At token (what it predicts)", range(len(tokens)), index=len(tokens) - 1,
                       format_func=lambda p: f"{p}: {readable(tokens[p])}", key="dla_pos")
    typed_target = c2.text_input("Target token (empty: the model's top prediction)", key="dla_target")
    typed_baseline = c3.text_input("Baseline token (optional: a logit difference)", key="dla_baseline")
    try:  # on a problem the section says why, and the rest of the page still runs
        target = one_token(model, typed_target, "target")
        baseline = one_token(model, typed_baseline, "baseline")
        dla = cache.logit_attribution(name, text, "top" if target is None else target, baseline)
    except ValueError as e:
        st.error(common.plain(str(e)))
        return
    except NotAvailableError as e:
        st.info(common.plain(str(e)))
        return
    frame = dla.to_frame("each")
    frame = frame[(frame.batch == 0) & (frame.pos == pos)]
    ids = [int(dla.targets[0, pos])] + ([] if baseline is None else [baseline])
    names = [readable(t) for t in model.tokenizer.convert_ids_to_tokens(ids)]
    what = f"logit({names[0]})" + (f" − logit({names[1]})" if baseline is not None else "")
    capped = " before the soft-cap" if dla.softcap else ""
    title = f"{escape(what)} at token {pos}{capped}: {float(dla.total()[0, pos]):.3f}"
    top = frame.reindex(frame.logit.abs().sort_values(ascending=False).index).head(20)
    common.show(plotting.contribution_bars(frame, "logit", title=title, top=20, unit="logit"),
                frame, key="dla", note=(
        "The final-normed stream at that token is an exact sum of contributions (embeddings, each "
        "head, each MLP, biases), with the final norm's scale frozen at its value; the unembedding "
        "is linear, so the target's logit is an exact sum of their terms (bars: the 20 largest in "
        "size). With a baseline, the terms are of the logit difference, which does not depend on "
        "a shift of every logit. The title's total is every term plus the head's bias. A model "
        "that soft-caps its logits (Gemma 2) is attributed before the cap, where the map is "
        "linear; the cap keeps the order of the logits. The CSV holds every term."))
    if len(frame) > len(top):
        st.caption(f"The {len(top)} bars sum to {top.logit.sum():.3f}; the other {len(frame) - len(top)} "
                   f"terms to {frame.logit.sum() - top.logit.sum():.3f}.")
    stream_patching(name, text, pos, ids, what)


def stream_patching(name: str, text: str, pos: int, ids: list[int], what: str) -> None:
    """Patch the stream from a corrupted text at every point and token; the DLA's logit as metric."""
    st.markdown(f"**Where {common.plain(what)} at token {pos} comes from: patch the stream from another "
                "text**")
    corrupted = st.text_input("Corrupted text (as many tokens as the text, e.g. one name changed)",
                              key="patch_text")
    if not corrupted:
        return
    left, right = st.columns(2)
    method = left.radio("Method", ["measured", "estimated"], horizontal=True, key="patch_method",
                        help="measured: one run per cell; estimated: attribution patching, every cell to "
                             "first order from one backward pass (fast, off where the patch is large)")
    measure = right.radio("Measure", ["share", "change"], horizontal=True, key="patch_measure")
    try:
        grid = cache.stream_patching(name, text, corrupted, pos, ids[0], ids[1] if len(ids) > 1 else None,
                                     method == "estimated")
    except ResidualStreamError as e:  # another token count, an empty or too long text
        st.error(common.explain(e))
        return
    cell = ("Each cell estimates, to first order, a run of the text" if method == "estimated"
            else "Each cell is a run of the text")
    common.show(plotting.patching_figure(grid, measure), grid.to_frame(), key="patching", note=(
        f"{cell} with the stream at one point (rows: what enters block L) and one token (columns) "
        f"taken from the corrupted text's run; the colour is how far {common.plain(what)} at token "
        f"{pos} moves: 'share' is the part of the way from the text's value ({grid.metric_clean:.3f}) "
        f"to the corrupted text's ({grid.metric_reference:.3f}), both measured. A token whose stream "
        f"is the same in both runs changes nothing. 'measured' runs every cell; 'estimated' computes "
        f"every cell from one backward pass (the gradient of {common.plain(what)} at each point and "
        f"token times the change of the stream there): fast, but where a patch is large, as a "
        f"changed word at the first points, it can be far from the measured value."))
    head_patching(name, text, corrupted, pos, ids, what)


def head_patching(name: str, text: str, corrupted: str, pos: int, ids: list[int], what: str) -> None:
    """Every head's patch from the corrupted text, estimated; the 20 largest measured on request."""
    st.markdown("**Which heads carry it: each head patched from the corrupted text**")
    args = (name, text, corrupted, pos, ids[0], ids[1] if len(ids) > 1 else None)
    est = cache.head_patching(*args)
    frame = est.to_frame().head(20).rename(columns={"write": "label", "metric_change": "estimated"})
    if st.checkbox("Measure these 20 heads (a run each)", key="patch_heads_measure"):
        measured = cache.head_patching_measured(*args, tuple(frame.label))
        measured = measured.rename(columns={"write": "label", "metric_change": "measured"})
        frame = frame.merge(measured, on="label")
    title = f"Change of {escape(what)} at token {pos} with one head patched: the 20 largest estimates"
    common.show(plotting.patching_bars(frame, title=title), est.to_frame(), key="head_patching", note=(
        f"Each head's part of the attention output (z_h W_O[h]) taken from the corrupted text's run at "
        f"every token. 'estimated': to first order from one backward pass (the gradient of "
        f"{common.plain(what)} with respect to the head's z times its change), for every head at once; "
        f"'measured': each of the 20 run with that head patched. Where they differ, the head's patch "
        f"is too large for first order. The CSV holds every head's estimate."))
    path_patching(name, text, corrupted, pos, ids, what)


def path_patching(name: str, text: str, corrupted: str, pos: int, ids: list[int], what: str) -> None:
    """Every head's write from the corrupted text sent into chosen readers only (on request)."""
    st.markdown("**By which road: each head's write sent into one reader only (path patching)**")
    typed = st.text_input("Receivers, comma-separated: logits (the direct effect), L5.attn, L5H3 (its "
                          "query, key and value), L5H3.q, L5.mlp", value="logits", key="paths_receivers")
    if not st.checkbox("Patch every head's path into them (a run per head and receiver)", key="paths_run"):
        return
    receivers = tuple(r.strip() for r in typed.split(",") if r.strip())
    try:
        paths = cache.path_patching(name, text, corrupted, pos, ids[0], ids[1] if len(ids) > 1 else None,
                                    receivers)
    except ResidualStreamError as e:  # an unknown receiver, none at all
        st.error(common.explain(e))
        return
    common.show(plotting.path_patching_figure(paths, top=20), paths.to_frame(), key="path_patching", note=(
        f"Each cell is a run of the text in which one receiver (column) reads the stream plus the "
        f"difference between the corrupted text's write of one head (row) and the text's own, and "
        f"every other component reads the text's stream; the receiver's write then flows on as in "
        f"the model. The colour is how far {common.plain(what)} at token {pos} moves, as a share of "
        f"the way to the corrupted text's value. 'logits' receives the stream after the last block: "
        f"the head's direct effect. A blank cell has no path (the receiver reads before the head "
        f"writes). Rows: the 20 heads with the largest share; the CSV holds every head."))


name, text = common.selection()
st.title("Flow")
with common.guarded():
    model = cache.model(name)
    matrix = cache.read_matrix(name, text, "component")
left, right = st.columns([1, 2])
threshold = left.slider("Edge threshold (mean |share|)", 0.0, 0.5, 0.05, 0.01, key="threshold")
nodes = list(matrix.index)
node = left.selectbox("Component", nodes, index=len(nodes) - 1, key="node")
event = common.show(plotting.read_write_graph(matrix, threshold=threshold, highlight=node), matrix,
                    key="graph", on_select="rerun", selection_mode="points", note=(
    "Nodes are components by layer (attention below, MLPs above, embeddings at the left). An edge "
    "from A to B means A's write makes up at least the threshold of B's normalized read, averaged "
    "over heads, Q/K/V and tokens (linear through the frozen norm scales). Click a node or pick it "
    "on the left: its edges turn red and the tables list whom it reads and who reads it."))
picked = (event or {}).get("selection", {}).get("points", []) if event else []
if picked and picked[0].get("customdata") in nodes:
    node = picked[0]["customdata"]
reads = matrix.loc[node].sort_values(ascending=False) if node in matrix.index else pd.Series()
read_by = matrix[node].sort_values(ascending=False) if node in matrix.columns else pd.Series()
c1, c2 = st.columns(2)
c1.markdown(f"**{node} reads from**")
c1.dataframe(reads[reads > 0].rename("mean |share|").head(10))
c2.markdown(f"**{node} is read by**")
c2.dataframe(read_by[read_by > 0].rename("mean |share|").head(10))


st.subheader("Survival")
measure = st.radio("Measure", ["retention", "share", "norm"], horizontal=True, key="surv")
with common.guarded():
    surv = cache.survival(name, text)
common.show(plotting.survival_figure(surv, measure), surv.to_frame(), key="survival", note=(
    "Each row is a write; each column a later point of the stream. Retention is its norm there "
    "over its norm when it was added: exactly 1 everywhere in pre-norm models, rescaled at every "
    "block in post-norm ones. Share is its signed part of ‖x‖² (columns sum to 1)."))

st.subheader("Logit lens")
if not model.anatomy.has_lm_head:
    st.info(model.anatomy.lm_head_note)
else:
    with common.guarded():
        lens = cache.logit_lens(name, text)
    tr = cache.trace(name, text)
    common.show(plotting.lens_figure(lens, 0, tr.str_tokens[0]), lens.summary(), key="lens", note=(
        "The stream at every point read as if it were final (the final norm applied as the model "
        "applies it, then the unembedding). Cell text: the lens's top token; color: KL to the "
        "model's final distribution in nats."))
    st.dataframe(lens.summary(), hide_index=True)  # per point: KL, top-1 agreement, median rank
    logit_attribution(name, text, model, tr)

st.subheader("Heads")
kind = st.radio("Score", ["induction", "previous_token", "duplicate_token"], horizontal=True,
                key="head_kind", format_func=lambda k: k.replace("_", "-"))
with common.guarded():
    scores = cache.head_scores(name)
grid = getattr(scores, kind)
grid = pd.DataFrame(grid.numpy(), index=[f"L{L}" for L in range(grid.shape[0])],
                    columns=[f"H{h}" for h in range(grid.shape[1])])
common.show(plotting.heatmap(grid, title=f"{kind.replace('_', '-')} score", x_title="head",
                             y_title="layer", colorbar="attention"),
            scores.to_frame(), key="heads", note=(
    "Each head's mean attention on a few sequences of random tokens repeated once (the text in "
    "the sidebar is not used). Previous-token: to the token just before. Duplicate-token: from "
    "the repeat to the earlier copy of the same token. Induction: from the repeat to the token "
    "after the earlier copy, the one to predict next. A head spreading its attention evenly "
    "scores about 1/position."))
if not math.isnan(scores.loss_first):  # NaN without a next-token LM head
    st.caption(f"Next-token loss: {scores.loss_first:.2f} nats on the first copy, "
               f"{scores.loss_repeat:.2f} on the repeat (a model using the repeat predicts it).")
if kind == "induction":  # an induction head finds its key by the token before it: K-composition
    best, layer = scores.top(kind, 1).loc[0, ["head", "layer"]]
    if layer == 0:
        st.info(f"{best}, the top induction head, is in the first layer: no head writes before it.")
    else:
        with common.guarded():
            top = cache.composition(name).top(best, "k")
        st.markdown(f"**{best}, the top induction head, reads its keys from** (K-composition from "
                    "the weights, the writes as they reach it; an induction circuit reads a "
                    "previous-token head's write)")
        st.dataframe(top[["writer", "score", "baseline"]], hide_index=True)

st.subheader("Composition")
with common.guarded():
    comp = cache.composition(name)
c1, c2, c3 = st.columns(3)
reads = {"q": "queries", "k": "keys", "v": "values", "in": "MLP inputs"}
comp_kind = c1.radio("Read by", list(reads)[:3] + (["in"] if comp.mlps else []), index=1, horizontal=True,
                     key="comp_kind", format_func=reads.get)
comp_level = c2.radio("Cells", ["layer", "head"], horizontal=True, key="comp_level",
                      format_func=lambda v: "largest per layer pair" if v == "layer" else "every head")
if c3.checkbox("Writes as they reach the reader", value=True, key="comp_norms"):
    shown = comp
else:
    with common.guarded():
        shown = cache.composition(name, False)
common.show(plotting.composition_figure(shown, comp_kind, comp_level),
            shown.matrix(comp_kind, comp_level).rename_axis("reader").reset_index(), key="composition", note=(
    "How strongly each reader's map from the stream lines up with each earlier head's write map, from "
    "the weights alone (no text): ‖W_OV W_QKᵀ‖ / (‖W_OV‖ ‖W_QK‖) for keys, W_QK for queries, the reader's "
    "W_OV for values, W_in for MLP inputs, each reading norm's gain folded in. A score means something "
    "against the random baseline in the title. 'Writes as they reach the reader' folds every norm on "
    "the stream between the two into the write (post-norm and DeepNorm models; a pre-norm model has "
    "none, and the two settings agree); unticked, the weights alone. Blank: the reader reads before "
    "the write is added."))
