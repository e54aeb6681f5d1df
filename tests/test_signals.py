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


def _counting_saves(monkeypatch) -> list:
    from residual_stream.streaming import runner

    saves, real = [], runner.save_state
    monkeypatch.setattr(runner, "save_state", lambda path, config, done, *a: saves.append(done) or
                        real(path, config, done, *a))
    return saves


@pytest.fixture
def handlers():
    """The process's SIGINT and SIGTERM handlers, put back after the test."""
    before = {sig: signal.getsignal(sig) for sig in (signal.SIGINT, signal.SIGTERM)}
    yield
    for sig, handler in before.items():
        signal.signal(sig, handler)


def _flagging(sig: int) -> list:
    """A previous handler that only records the signal (a framework's checkpoint flag)."""
    seen: list = []
    signal.signal(sig, lambda signum, frame: seen.append(signum))
    return seen


def test_a_signal_whose_handler_returns_is_acted_on_once(model, tmp_path, monkeypatch, handlers):
    """SIGTERM in batch 2 to a handler that only records it: the state is saved then, the
    handler called once, and the scan goes on to its end (saved once more), not saved and
    signalled again after every batch."""
    seen, saves = _flagging(signal.SIGTERM), _counting_saves(monkeypatch)
    whole = rs.scan(model, TEXTS, "growth", **KW)
    result = rs.scan(model, TEXTS, "growth", state=tmp_path / "scan.pt",
                     on_batch=_send_at((0, 2), signal.SIGTERM), **KW)
    assert seen == [signal.SIGTERM] and saves == [(0, 3), (0, whole.batches)]
    assert result.tokens == whole.tokens


def test_an_ignored_signal_stays_ignored(model, tmp_path, monkeypatch, handlers):
    """A job started in the background ignores SIGINT: the scan does not catch it either."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    saves = _counting_saves(monkeypatch)
    result = rs.scan(model, TEXTS, "growth", state=tmp_path / "scan.pt",
                     on_batch=_send_at((0, 1), signal.SIGINT), **KW)
    assert saves == [(0, result.batches)] and signal.getsignal(signal.SIGINT) is signal.SIG_IGN


def test_a_signal_after_the_last_batch_is_not_lost(model, tmp_path, monkeypatch, handlers):
    """SIGTERM while the scan waits for a batch that never comes (the reader is ending): the
    state is saved and the signal acted on when the loop ends, not dropped with the handlers."""
    import threading
    import time

    from residual_stream.streaming import runner

    n = rs.scan(model, TEXTS, "growth", **KW).batches
    seen, saves, last = _flagging(signal.SIGTERM), _counting_saves(monkeypatch), threading.Event()
    real = runner._read_batches

    def then_signal(*args, **kw):
        yield from real(*args, **kw)
        assert last.wait(timeout=60)  # the scan has added every batch and is waiting for more
        time.sleep(0.2)
        signal.raise_signal(signal.SIGTERM)  # from the reader thread: the main one handles it

    monkeypatch.setattr(runner, "_read_batches", then_signal)
    rs.scan(model, TEXTS, "growth", state=tmp_path / "scan.pt",
            on_batch=lambda key, tokens: key[1] + 1 == n and last.set(), **KW)
    assert seen == [signal.SIGTERM] and saves == [(0, n), (0, n)]
