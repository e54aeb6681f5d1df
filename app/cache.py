"""Every cache of the app, in one place: models (resources, never mutated) and small results."""

from __future__ import annotations

import pandas as pd
import streamlit as st

import residual_stream as rs


@st.cache_resource(show_spinner="Loading model (the first SmolLM2 load dequantizes, ~20 s)...")
def model(name: str) -> rs.Model:
    """A loaded model, shared by every session (treated as read-only)."""
    return rs.load(name, progress=False)


@st.cache_data(show_spinner=False)
def registry() -> pd.DataFrame:
    """The registry table."""
    return rs.list_models()


@st.cache_data(show_spinner="Tracing...")
def conservation(name: str, text: str) -> pd.DataFrame:
    """The conservation report of ``text`` on model ``name``, as a table."""
    return rs.trace(model(name), text).check().to_frame()
