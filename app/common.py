"""What every page shares: the sidebar (model and text), guarded calls, figure + downloads."""

from __future__ import annotations

import os
import re
from collections.abc import Callable
from contextlib import contextmanager
from pathlib import Path

import cache
import pandas as pd
import streamlit as st
import torch

from residual_stream import plotting
from residual_stream.errors import ContextLengthError, ResidualStreamError
from residual_stream.streaming.columnar import NAME_FIELD
from residual_stream.streaming.sources import DESCRIBED, JSON_SUFFIXES, SUFFIXES
from residual_stream.streaming.utf8 import REPLACE

DEFAULT_MODEL = "smollm2-135m"
# short enough for the twins' 128-byte context
DEFAULT_TEXT = "The residual stream is a shared channel: every head and MLP reads it and writes back."
MAX_CHARS = 4000
ALLOW_ENV = "RESIDUAL_STREAM_ALLOWED_DIRS"
REPLACE_BOX = "Read bytes that are not UTF-8 as U+FFFD"  # the box for encoding_errors (Corpus, Compare)
FIELD_BOX = "Text field"  # the box for text_field (the Corpus and Compare pages)
PNG_SCALE = 3  # a figure's PNG (from its toolbar) in pixels per pixel on the page
UPLOAD_TYPES = sorted({s.rsplit(".", 1)[-1] for s in (*SUFFIXES, *JSON_SUFFIXES)})  # a name's last suffix


def corpus_uploader(key: str) -> tuple[list, str]:
    """The uploader of corpus files (``key``) of the Corpus and Compare pages: ``(files, how named)``."""
    files = st.file_uploader(f"Corpus files ({DESCRIBED}; a .txt holds one text per line; several "
                             "are read in name order)", type=UPLOAD_TYPES, accept_multiple_files=True,
                             key=key) or []
    names = sorted(f.name for f in files)
    shown = f"the uploaded {names[0]}" if len(names) == 1 else \
        f"the {len(names)} uploaded files {', '.join(names[:3])}{', …' if len(names) > 3 else ''}"
    return files, shown


def corpus_options(key: str) -> tuple[str, str]:
    """``(text_field, encoding_errors)`` from a page's two boxes for a corpus file (keys ``key_*``)."""
    field = st.text_input(f"{FIELD_BOX} (of each JSON Lines record, or the Parquet or Arrow column)",
                          "text", key=f"{key}_field")
    replace = st.checkbox(f"{REPLACE_BOX} (else a file holding one is refused)", key=f"{key}_replace")
    return field.strip() or "text", "replace" if replace else "strict"


def allowed_dirs() -> list[Path]:
    """Folders from which local models may be loaded (``residual-stream app --allow DIR``)."""
    return [Path(p).resolve() for p in os.environ.get(ALLOW_ENV, "").split(os.pathsep) if p]


def check_local_path(raw: str) -> str:
    """The resolved path if it lies inside an allowed folder; ``ValueError`` otherwise."""
    try:
        path = Path(raw).expanduser().resolve()
    except (RuntimeError, OSError) as e:  # "~nobody/x": no such home folder
        raise ValueError(f"{raw!r} is not a usable path ({e})") from None
    if not any(path == d or d in path.parents for d in allowed_dirs()):
        raise ValueError(f"{raw!r} is outside the allowed folders; start the app with "
                         "`residual-stream app --allow DIR` to allow one")
    return str(path)


def sidebar(*, key: str = "", label: str = "Model") -> tuple[str | None, str]:
    """Model and text pickers: ``(model, text)``; the model None after a path error shown.

    The text is as typed: a page that measures it checks it (``selection``), so one that does
    not (the corpus, the norm lab, the models) is not stopped by an empty text.
    """
    table = cache.registry()
    names = table[table.installed].name.tolist()
    if allowed_dirs():
        names.append("local path…")
    default = names.index(DEFAULT_MODEL) if DEFAULT_MODEL in names else 0
    name = st.sidebar.selectbox(label, names, index=default, key=f"model{key}")
    raw = st.sidebar.text_input("Model folder or .gguf", key=f"path{key}") \
        if name == "local path…" else None
    text = st.sidebar.text_area("Text", DEFAULT_TEXT, key="text", height=150)  # kept on a path error
    if raw is not None and not raw.strip():
        st.info(plain("Type the path of a model folder or a .gguf file in an allowed folder: "
                      + ", ".join(map(str, allowed_dirs()))))
        return None, text
    if raw is not None:
        try:
            name = check_local_path(raw)
        except ValueError as e:
            st.error(plain(str(e)))
            return None, text
    return name, text


def text_problem(text: str) -> str | None:
    """What is wrong with the sidebar's text for the app (empty, too long), or None."""
    if not text.strip():
        return "The text is empty: type something to analyse."
    if len(text) > MAX_CHARS:
        return (f"The text is {len(text)} characters; the app takes at most {MAX_CHARS}. "
                "Shorten it, or use the Python API for long texts.")
    return None


def selection(*, text: bool = True) -> tuple[str, str]:
    """The sidebar's ``(model, text)``; stops the page, error shown, when either is unusable.

    ``text=False``: for a page that does not measure the text, which is then not checked.
    """
    name, typed = st.session_state.get("choice", (None, ""))
    if name is None:  # the sidebar has said why
        st.stop()
    problem = text_problem(typed) if text else None
    if problem:
        st.error(problem)
        st.stop()
    return name, typed


def scan_progress(tokens: int, target: int, seconds: float) -> tuple[float, str]:
    """The progress bar of a scan ``seconds`` into it: its fraction and its words.

    ``target``: the tokens it will reach (its budget, or fewer when the corpus holds fewer);
    the time left assumes the rate so far holds.
    """
    rate = tokens / seconds if seconds > 0 else 0.0
    text = f"Scanning… {tokens:,} of {target:,} tokens"
    if rate > 0:
        text += f" · {rate:,.0f} tokens/s · about {max(target - tokens, 0) / rate:,.0f} s left"
    return min(tokens / target, 1.0), text


def plain(text: str) -> str:
    """``text`` with Markdown's special characters escaped: shown as typed, never formatted."""
    return re.sub(r"([\\`*_\[\]<>$~|#])", r"\\\1", text)  # what formats mid-line in Streamlit


def explain(e: ResidualStreamError) -> str:
    """A library error's message for the page (Markdown-escaped), a context overflow worded for it."""
    if isinstance(e, ContextLengthError) and e.tokens is not None:  # the app has no overflow="chunk"
        return plain(f"The text is {e.tokens:,} tokens, over {e.model}'s limit of {e.limit:,}: "
                     "shorten it (the Python API can split a long text into rows: overflow='chunk').")
    return worded(str(e))


def worded(message: str) -> str:
    """A library message for the page (Markdown-escaped), its API arguments named as the page's boxes.

    An uploaded corpus file is named by its own name, not by the path of its stored copy, and
    the folder of several as "the uploaded files".
    """
    folder = re.escape(str(cache.uploads())) + r"[/\\][0-9a-f]+"
    message = re.sub(folder + r"[/\\]", "", message)  # a file in it: its name alone
    message = re.sub(f"'?{folder}'?", "the uploaded files", message)
    return plain(message.replace(REPLACE, f"the box '{REPLACE_BOX}' on this page")
                 .replace(NAME_FIELD, f"(the box '{FIELD_BOX}' on this page)"))


@contextmanager
def guarded():
    """Show library errors (bad input, unavailable analyses) in the page instead of crashing."""
    try:
        yield
    except ResidualStreamError as e:
        st.error(explain(e))
        st.stop()


def head_max(fraction, readers) -> torch.Tensor:
    """``[write]``: a write's largest read fraction over heads' Q, K and V readers.

    MLP inputs are left out (they read almost every direction); NaN where no head reads.
    """
    heads = torch.tensor([r.endswith((".q", ".k", ".v")) for r in readers], dtype=torch.bool)
    f = fraction[:, heads]
    best = f.nan_to_num(nan=float("-inf")).max(1).values
    return torch.where(f.isnan().all(1), torch.tensor(float("nan")), best)


def subspace_measure(ws, *, key: str, over: str) -> None:
    """A measure of ``ws`` (a ``WriteSubspaces``) picked in a selectbox, as a layer × component heatmap.

    The Writes page's (one text) and the Corpus page's (a scan); ``over``: what each cell averages over.
    """
    measures = {f"fraction in {s}": ("named", i) for i, s in enumerate(ws.subspaces)}
    measures["max fraction read by a later head (Q, K or V)"] = ("read_fraction", None)
    measures["mean read strength of later readers"] = ("read_strength", None)
    choice = st.selectbox("Measure", list(measures), key=key)
    field, index = measures[choice]
    values = ws.named[:, index] if field == "named" else (
        head_max(ws.read_fraction, ws.readers) if field == "read_fraction"
        else getattr(ws, field).nanmean(1))
    grid = pd.DataFrame({"write": ws.writes, "value": values.numpy()})
    grid["layer"] = grid.write.str.extract(r"L(\d+)").astype(int)
    grid["component"] = grid.write.str.split(".").str[1]
    matrix = grid.pivot(index="component", columns="layer", values="value")
    show(plotting.heatmap(matrix, title=choice, x_title="layer", y_title="component", colorbar="value"),
         grid, key=key, note=f"Each cell is one write (attention total or MLP) averaged over {over}. Read "
         "measures use the write as it arrives at each later reader, through every norm between.")


def show(fig, frame: pd.DataFrame | None, *, key: str, note: str, **chart) -> object:
    """Render ``fig`` with a 'how to read this' note and CSV / HTML downloads.

    PNG: the figure's own toolbar (plotly.js draws it in the browser, no server-side renderer),
    set here to ``PNG_SCALE`` × the figure's size on the page, named ``{key}.png``.
    """
    config = {"displaylogo": False, "toImageButtonOptions": {"format": "png", "filename": key,
                                                             "scale": PNG_SCALE}}
    event = st.plotly_chart(fig, key=f"chart-{key}", config=config, **chart)
    with st.expander("How to read this"):
        st.markdown(note)
    cols = st.columns(3)
    if frame is not None:
        cols[0].download_button("Data (CSV)", frame.to_csv(index=False), f"{key}.csv", "text/csv",
                                key=f"csv-{key}")
    html: Callable[[], str] = lambda: fig.to_html(include_plotlyjs=True, full_html=True)  # noqa: E731
    cols[1].download_button("Figure (HTML)", html, f"{key}.html", "text/html", key=f"html-{key}")
    cols[2].caption(f"PNG: 'Download plot as a PNG' on the figure's toolbar ({PNG_SCALE}× its size here).")
    return event
