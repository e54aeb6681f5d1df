"""Read ahead: a scan's batches are tokenized and packed by a thread while the model runs.

On a GPU the forward pass of a small model outruns a reader that tokenizes one text at a
time (SmolLM2-135M on an H200: ~523,000 tokens/s at 32×512; that reader on one core of this
project's CPU: ~250,000–270,000 on short lines). The model's thread spends most of a
replayed or device-bound pass waiting on the device, with the GIL released, so reading the
next batches in a thread overlaps the two. With the device replaced by a GIL-free wait of
the H200's time per batch, the scan loop runs at 79–80 % (short lines) and 95 % (documents)
of the device's rate, against 32–50 % reading one text at a time inline
(``benchmarks/corpus_speed.py``). The reader does hold the GIL for part of its work (a
pure-Python loop keeps 0.37 of its speed beside it on this CPU: the tokenizer's encodings
become Python lists, and batches are packed), so a launch-bound eager pass shares the
interpreter with it; the work is the same as reading inline, interleaved.
``prefetched`` keeps at most ``depth`` items ready, so memory stays a few batches of ids.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Iterator
from typing import TypeVar

T = TypeVar("T")
_END = object()
POLL_S = 0.1  # how often a reader blocked on a full queue checks that it is still wanted


class _Reader(threading.Thread):
    """Computes ``items`` into a queue of at most ``depth`` entries ``(item, error)``."""

    def __init__(self, items: Iterator, depth: int, stop: threading.Event | None = None) -> None:
        super().__init__(name="residual-stream reader", daemon=True)
        self.items, self.ready = items, queue.Queue(maxsize=depth)
        self.stop = threading.Event() if stop is None else stop

    def put(self, item: object, error: BaseException | None = None) -> bool:
        """Queue one entry, waiting while the queue is full; False once the caller has left."""
        while not self.stop.is_set():
            try:
                self.ready.put((item, error), timeout=POLL_S)
                return True
            except queue.Full:
                continue
        return False

    def run(self) -> None:
        """Every item, then the end (or the exception that ended them)."""
        try:
            for item in self.items:
                if not self.put(item):
                    return
            self.put(_END)
        except BaseException as e:  # noqa: BLE001 - handed to the caller, raised there
            self.put(_END, e)


def prefetched(items: Iterator[T], depth: int = 16, stop: threading.Event | None = None) -> Iterator[T]:
    """``items``, computed by a background thread up to ``depth`` items ahead of the caller.

    ``stop`` is set when the caller leaves; ``items`` may watch it too (a wait of its own).
    An exception in ``items`` is raised here, at the item where it happened; leaving the
    loop early (``break``, an exception in the caller's body) stops the thread after at most
    the item it is computing.
    """
    reader = _Reader(items, depth, stop)
    reader.start()
    try:
        while True:
            item, error = reader.ready.get()
            if error is not None:
                raise error
            if item is _END:
                return
            yield item
    finally:
        reader.stop.set()
        reader.join(timeout=60)
