"""Streamlit entry point: routes to the pages. Run with ``make app`` or ``residual-stream app``."""

import sys
from pathlib import Path

import streamlit as st

sys.path.insert(0, str(Path(__file__).resolve().parent))  # `app` modules import each other

st.set_page_config(page_title="residual-stream", layout="wide")
pages = [
    st.Page("views/models.py", title="Models", icon=":material/account_tree:", default=True),
]
st.navigation(pages).run()
