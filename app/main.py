"""Streamlit entry point: the shared sidebar, then the page router.

Run with ``make app`` or ``residual-stream app``. Pages live in ``views/``; every cache in
``cache.py``; shared widgets in ``common.py``.
"""

import sys
from pathlib import Path

import streamlit as st

sys.path.insert(0, str(Path(__file__).resolve().parent))  # pages import cache and common

import common  # noqa: E402

st.set_page_config(page_title="residual-stream", layout="wide")
st.sidebar.title("residual-stream")
st.session_state["choice"] = common.sidebar()
pages = [
    st.Page("views/overview.py", title="Overview", default=True),
    st.Page("views/writes.py", title="Writes"),
    st.Page("views/flow.py", title="Flow"),
    st.Page("views/compare.py", title="Compare"),
    st.Page("views/corpus.py", title="Corpus"),
    st.Page("views/normlab.py", title="Norm lab"),
    st.Page("views/models.py", title="Models"),
]
# no page icons: material icons are fetched from fonts.gstatic.com (unreachable offline), and
# headless chromium has no emoji font
st.navigation(pages).run()
