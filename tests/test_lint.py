"""Style gates that CI enforces: ruff (Google docstrings, complexity 10), module size, and the
library never importing streamlit."""

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def test_ruff_is_clean():
    paths = ["residual_stream", "app", "tests", "benchmarks", "models"]
    result = subprocess.run([sys.executable, "-m", "ruff", "check", *paths],
                            cwd=ROOT, capture_output=True, text=True)
    assert result.returncode == 0, result.stdout[-3000:]


def test_modules_stay_small_and_library_never_imports_streamlit():
    for path in (ROOT / "residual_stream").rglob("*.py"):
        text = path.read_text()
        assert len(text.splitlines()) <= 400, f"{path.name} has grown past 400 lines: split it"
        assert "import streamlit" not in text and "from streamlit" not in text, path
