"""Corpus: the statistics of the other pages over a corpus, from ``rs.scan``'s accumulators."""

import json
import time
from typing import NamedTuple

import cache
import common
import streamlit as st

import residual_stream as rs
from residual_stream import plotting
from residual_stream.errors import ResidualStreamError
from residual_stream.streaming.saved import scan_bytes
from residual_stream.streaming.sources import DESCRIBED

BUDGETS = [1024, 4096, 16384, 65536]
LENS = "lens:every=4"
SUBSPACES = "subspaces:every=4"
STATS = {"growth": "norm growth and update sizes", "survival": "survival of every write",
         "read_attribution": "read attribution (the read-write graph)", LENS: "logit lens (one token in 4)",
         SUBSPACES: "write subspaces, your own directions among them (one token in 4)"}


class Asked(NamedTuple):
    """A scan the page was asked for: ``cache.scan``'s arguments, and how the caption names its corpus."""

    name: str
    corpus: str  # "builtin", a checked path, or an upload's stored copy
    budget: int
    stats: tuple[str, ...]
    reading: str  # Corpus's encoding_errors
    basis: tuple[str, bytes] | None  # an uploaded file of directions
    field: str  # Corpus's text_field
    shown: str


def show_replaced(result) -> None:
    """Name the files (or list items) whose bytes that are not UTF-8 the scan read as U+FFFD, if any."""
    n = len(result.replaced)
    if n:
        st.warning(f"Bytes that are not UTF-8 were read as U+FFFD in {n} file{'s' if n > 1 else ''} of the "
                   "corpus (the first in each is named):\n\n" + "\n".join(
                       f"- {common.worded(w)}" for w in result.replaced))


def show_scan(result, name: str) -> None:
    """Draw the statistics ``result`` (a ``ScanResult``) holds, of model ``name``."""
    show_replaced(result)
    growth, reads, survival, lens, subspaces = map(result.find, ("growth", "read_attribution", "survival",
                                                                 "lens", "subspaces"))
    if growth is not None:
        common.show(plotting.norm_growth_figure(growth, name=name), growth.to_frame(), key="corpus-growth",
                    note="As on the Overview page, over every real token of the corpus: mean, median and "
                         "the 5–95 % band (from a log histogram, within 0.6 % of exact quantiles), the "
                         "first token of each row apart.")
        common.show(plotting.update_size_figure(growth, name=name), growth.to_frame(), key="corpus-updates",
                    note="‖write‖ / ‖stream before it‖ for each attention and MLP, averaged over the corpus.")
    if reads is not None:
        matrix = reads.matrix("component", absolute=True)
        threshold = st.slider("Edge threshold (mean |share|)", 0.0, 0.5, 0.05, 0.01, key="corpus_threshold")
        common.show(plotting.read_write_graph(matrix, threshold=threshold), matrix, key="corpus-graph",
                    note="The Flow page's read-write graph, averaged over the corpus's tokens: an edge "
                         "from A to B means A's write makes up at least the threshold of B's "
                         "normalized read.")
    if survival is not None:
        measure = st.radio("Measure", ["retention", "share", "norm"], horizontal=True, key="corpus_surv")
        common.show(plotting.survival_figure(survival, measure), survival.to_frame(), key="corpus-survival",
                    note="The Flow page's survival, averaged over the corpus's tokens.")
    if subspaces is not None:
        common.subspace_measure(subspaces, key="corpus_measure", over="the corpus's tokens measured "
                                "(one in four here, chosen by a hash of each token's text and position)")
    if lens is not None:
        common.show(plotting.lens_depth_figure(lens, name=name), lens, key="corpus-lens",
                    note="Mean KL(final ‖ lens) per point over the tokens measured (one in four here, "
                         "chosen by a hash of each token's text and position), with ±2 standard errors "
                         "clustered by text; top-1 agreement with the final prediction on the right axis.")
        st.dataframe(lens, hide_index=True)


name, _ = common.selection(text=False)
st.title("Corpus")
st.caption("The other pages measure the text in the sidebar. This one streams a corpus through "
           "the model one batch (8 rows of 128 tokens) at a time with `rs.scan`, keeping only "
           "sums, counts and histograms, so memory does not grow with the corpus. On two CPU "
           "cores, 4,096 tokens take SmolLM2 about 60 s for the first four statistics, 45 s for "
           "write subspaces and 10 s for norm growth alone, and MiniLM 7 s for the four it has. "
           "The built-in corpus holds 6,388 SmolLM2 tokens; a larger budget scans all of it.")
with st.expander("Open a saved scan"):
    saved = st.file_uploader("A scan saved whole, as `scan.save('scan.pt')` or `residual-stream scan "
                             "… --out scan.pt` write it (on a cluster, say): no model is loaded",
                             type=["pt"], key="corpus_saved")
if saved is not None:
    with common.guarded():
        result = rs.load_scan(saved)
    st.info("Showing the saved scan: remove the file above to scan a corpus.")
    st.caption(common.plain(f"{result.model_name} over {result.tokens:,} tokens in {result.batches} "
                            f"batches, from the saved scan {saved.name} ({', '.join(result.stats)})"))
    show_scan(result, result.model_name)
    st.stop()
BUILTIN, UPLOAD, LOCAL = ("built-in corpus (320 lines of English and code)", "files you upload",
                          "a file or folder in an allowed folder")
sources = [BUILTIN, UPLOAD, *([LOCAL] if common.allowed_dirs() else [])]
source = st.radio("Corpus", sources, key="corpus_source", horizontal=True)
with st.form("scan"):
    if source == UPLOAD:
        uploaded, named = common.corpus_uploader("corpus_file")
    elif source == LOCAL:
        path = st.text_input(f"Path ({DESCRIBED}; or a folder of them)", key="corpus_path")
    if source != BUILTIN:
        options = common.corpus_options("corpus")  # text_field, encoding_errors
    budget = st.select_slider("Tokens", BUDGETS, value=4096, key="corpus_tokens")
    stats = st.multiselect("Statistics", list(STATS), default=["growth"], format_func=STATS.get,
                           key="corpus_stats")
    upload = st.file_uploader("Directions of your own for the write subspaces (rows [k, d_model] as "
                              "torch.save, numpy.save or safetensors write them; optional)",
                              type=["pt", "pth", "npy", "safetensors"], key="corpus_basis")
    submitted = st.form_submit_button("Scan")
if submitted:
    corpus, shown, field, reading = "builtin", "the built-in corpus", "text", "strict"
    if source == UPLOAD:
        if not uploaded:
            st.error("Upload a corpus file to scan, or pick the built-in corpus.")
            st.stop()
        with common.guarded():
            corpus, shown = cache.stored_upload(uploaded), named
    elif source == LOCAL:
        try:
            corpus = shown = common.check_local_path(path)
        except ValueError as e:
            st.error(common.plain(str(e)))
            st.stop()
    if source != BUILTIN:
        field, reading = options
    if not stats:
        st.error("Pick at least one statistic to scan.")
        st.stop()
    basis = (upload.name, upload.getvalue()) if upload is not None and SUBSPACES in stats else None
    args = Asked(name, corpus, int(budget), tuple(stats), reading, basis, field, shown)
else:  # the last scan that succeeded (a failed one is not run again on every rerun)
    args = st.session_state.get("scan_args")
if args is None or args.name != name:
    st.info("Pick the statistics and press Scan.")
    st.stop()
with common.guarded():  # a model that cannot load is said in the page, as on the others
    asked, model = args, cache.model(name)
if LENS in args.stats and not model.anatomy.has_lm_head:
    st.info(f"{model.anatomy.lm_head_note} The scan leaves the lens out.")
    args = args._replace(stats=tuple(s for s in args.stats if s != LENS))
    if not args.stats:
        st.stop()
target = min(args.budget, cache.builtin_tokens(name)) if args.corpus == "builtin" else args.budget
bar, started = st.progress(0.0, text="Scanning…"), time.perf_counter()


def moved(key, tokens: int) -> None:
    """The bar after each batch of a scan that runs: tokens read of the target, the rate, the time left."""
    bar.progress(*common.scan_progress(tokens, target, time.perf_counter() - started))


try:  # the bar moves only while the scan runs (not on a cached result), and then goes
    result = cache.scan(name, args.corpus, args.budget, args.stats, args.reading, basis=args.basis,
                        text_field=args.field, on_batch=moved)
except ResidualStreamError as e:  # said once the bar is gone (st.stop ends the run where it is called)
    bar.empty()
    st.error(common.explain(e))
    st.stop()
bar.empty()
st.session_state["scan_args"] = asked
where = args.shown + (" (bytes that are not UTF-8 read as U+FFFD)" if args.reading == "replace" else "")
st.caption(common.plain(f"{name} over {result.tokens:,} tokens of {where} in {result.batches} batches, "
                        f"{result.seconds:.1f} s ({result.tokens_per_second:,.0f} tokens/s)"))
left, right = st.columns(2)
# each file is made when its button is pressed (a scan of a large model is hundreds of MB), not
# on every rerun
left.download_button("Scan (JSON)", lambda: json.dumps(result.to_dict()), "scan.json",
                     "application/json", key="scan-json", help="Every statistic's frames, for any tool.")
right.download_button("Scan (whole, .pt)", lambda: scan_bytes(result), "scan.pt", "application/octet-stream",
                      key="scan-pt", help="Every statistic's sums: open it again here, or with "
                      "rs.load_scan('scan.pt').")
show_scan(result, name)
