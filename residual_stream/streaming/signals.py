"""Stopping a scan that saves its state: finish the batch, save, then stop.

A scan saves its state every ``save_seconds`` (60), so an interruption would redo up to that
much. ``Deferred`` catches SIGINT (Ctrl-C, a notebook's interrupt) and SIGTERM (a cluster's
preemption notice) while such a scan runs: the batch under way is finished and added, the
state saved, and the signal then takes its course (``KeyboardInterrupt`` for SIGINT, the
previous handler or termination for SIGTERM). A second signal before that stops at once.
A signal is acted on once: if the previous handler returns (a framework's checkpoint flag),
the scan goes on under it. A signal that comes after the last batch is acted on when the
loop ends (``runner.scan`` asks once more). Handlers can only be set from the main thread;
elsewhere, without a state, and for a signal that is ignored (``SIG_IGN``: a job started
in the background) or whose handler Python cannot restore, the signals are left alone.
"""

from __future__ import annotations

import signal
import threading
from collections.abc import Callable

SIGNALS = (signal.SIGINT, signal.SIGTERM)


class Deferred:
    """Holds SIGINT and SIGTERM back until ``stop_if_asked`` (``with``: restored on exit)."""

    def __init__(self, active: bool) -> None:
        """Catch the signals when ``active`` and on the main thread."""
        self.received: int | None = None
        self.previous: dict[int, object] = {}
        if active and threading.current_thread() is threading.main_thread():
            for sig in SIGNALS:
                if signal.getsignal(sig) not in (signal.SIG_IGN, None):  # None: set outside Python
                    self.previous[sig] = signal.signal(sig, self._handle)

    def _handle(self, signum: int, frame: object) -> None:
        if self.received is not None:  # asked twice: stop now
            self.restore()
            signal.raise_signal(signum)
            return
        self.received = signum

    def restore(self) -> None:
        """Put the handlers back as they were."""
        for sig, handler in self.previous.items():
            signal.signal(sig, handler)
        self.previous = {}

    def stop_if_asked(self, save: Callable[[], None]) -> None:
        """If a signal came: ``save()``, restore the handlers and let the signal act."""
        received, self.received = self.received, None
        if received is None:
            return
        save()
        self.restore()
        signal.raise_signal(received)

    def __enter__(self) -> Deferred:
        """The handlers are set; the block runs."""
        return self

    def __exit__(self, *exc: object) -> None:
        """Restore the handlers however the block ended."""
        self.restore()
