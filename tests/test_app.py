"""The app, page by page, with Streamlit's AppTest (no browser)."""

from pathlib import Path

import pytest
from streamlit.testing.v1 import AppTest

APP = str(Path(__file__).resolve().parent.parent / "app" / "main.py")


@pytest.mark.slow
def test_models_page_lists_models_and_shows_anatomy():
    at = AppTest.from_file(APP, default_timeout=120).run()
    assert not at.exception
    assert "Models" in at.title[0].value
    assert at.selectbox(key="model").options[:2] == ["smollm2-135m", "minilm-l6"]
    program = at.code[0].value
    assert "L0.attn reads L0.ln_attn_in(x)" in program  # SmolLM2: pre-RMSNorm
    assert "worst relative error" in at.success[0].value

    at.selectbox(key="model").select("minilm-l6").run()
    assert not at.exception
    assert "x = L0.ln_resid_attn(x)" in at.code[0].value  # MiniLM: post-LN
    assert "L0.attn reads L0.ln_attn_in" not in at.code[0].value


@pytest.mark.slow
def test_empty_text_shows_a_message():
    at = AppTest.from_file(APP, default_timeout=120).run()
    at.text_input(key="text").set_value("   ").run()
    assert not at.exception
    assert "empty" in at.error[0].value
