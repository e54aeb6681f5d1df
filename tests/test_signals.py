"""Ctrl-C and SIGTERM during a scan that saves its state: the batch under way is finished
and saved, then the signal acts; resumed, the scan equals one never interrupted.

The reference is the same scan run whole; signals are sent from ``on_batch``, which runs
after a batch is added, so where they land is exact.
"""

from __future__ import annotations

import signal
import subprocess
import sys
import textwrap

import pytest
import torch

import residual_stream as rs
from residual_stream.streaming.corpus import builtin_corpus

TEXTS = builtin_corpus()[:30]
KW = dict(batch_size=2, seq_len=16, progress=False, save_seconds=3600.0)  # no save by time


@pytest.fixture(scope="module")
def model() -> rs.Model:
    return rs.twin(norm="rmsnorm", placement="pre", n_layers=2, d_model=16, n_heads=2, n_ctx=32)


def _send_at(key: tuple[int, int], *signals: int):
    def on_batch(k: tuple[int, int], tokens: int) -> None:
        if k == key:
            for sig in signals:
                signal.raise_signal(sig)
    return on_batch


def test_ctrl_c_finishes_the_batch_saves_and_resumes_exactly(model, tmp_path):
    whole = rs.scan(model, TEXTS, ["growth", "survival"], **KW)
    state = tmp_path / "scan.pt"
    before = signal.getsignal(signal.SIGINT)
    with pytest.raises(KeyboardInterrupt):
        rs.scan(model, TEXTS, ["growth", "survival"], state=state,
                on_batch=_send_at((0, 2), signal.SIGINT), **KW)
    assert signal.getsignal(signal.SIGINT) is before  # handlers restored
    assert torch.load(state, weights_only=True)["next"] == [0, 3]  # three batches, saved
    resumed = rs.scan(model, TEXTS, ["growth", "survival"], state=state, **KW)
    assert resumed.tokens == whole.tokens and resumed.batches == whole.batches
    for key, value in whole.accumulators["growth"].sums.items():
        assert torch.allclose(resumed.accumulators["growth"].sums[key], value, rtol=1e-12, atol=0)
    assert torch.allclose(resumed.stats["survival"].retention, whole.stats["survival"].retention,
                          rtol=1e-12, atol=0, equal_nan=True)


def test_a_second_ctrl_c_stops_at_once_and_without_a_state_nothing_is_held_back(model, tmp_path):
    state = tmp_path / "scan.pt"
    with pytest.raises(KeyboardInterrupt):
        rs.scan(model, TEXTS, "growth", state=state,
                on_batch=_send_at((0, 2), signal.SIGINT, signal.SIGINT), **KW)
    assert not state.exists()  # stopped inside on_batch: no save
    seen = []
    with pytest.raises(KeyboardInterrupt):  # no state: Python's own handler, at once
        rs.scan(model, TEXTS, "growth", on_batch=lambda k, t: seen.append(k) or
                _send_at((0, 1), signal.SIGINT)(k, t), **KW)
    assert seen == [(0, 0), (0, 1)]


def test_sigterm_saves_the_state_then_terminates_the_process(tmp_path):
    script = textwrap.dedent(f"""
        import os, signal
        import residual_stream as rs
        from residual_stream.streaming.corpus import builtin_corpus
        m = rs.twin(norm="rmsnorm", placement="pre", n_layers=2, d_model=16, n_heads=2, n_ctx=32)
        def on_batch(key, tokens):
            if key == (0, 4):
                os.kill(os.getpid(), signal.SIGTERM)
        rs.scan(m, builtin_corpus()[:30], "growth", batch_size=2, seq_len=16, progress=False,
                save_seconds=3600.0, state={str(tmp_path / "scan.pt")!r}, on_batch=on_batch)
        print("not reached")
    """)
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300)
    assert done.returncode == -signal.SIGTERM and "not reached" not in done.stdout, done.stderr
    assert torch.load(tmp_path / "scan.pt", weights_only=True)["next"] == [0, 5]
