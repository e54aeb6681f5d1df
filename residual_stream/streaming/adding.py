"""Adding one batch to a scan's accumulators: the eager step, or a replayed CUDA graph.

``add_batch`` is the eager step (a lean pass when every statistic has a reducer, else one
trace); ``batch_adder`` picks it or ``graphs.Replayed`` for a scan, and both answer
``add(batch)`` and ``add.flush()``.
"""

from __future__ import annotations

from ..errors import InputError
from ..trace import trace_batch
from .accumulators import Accumulator
from .graphs import Replayed
from .lean import feed_trace, lean_pass


def add_batch(model, batch, accs: dict[str, Accumulator]) -> None:
    """Add one batch: a lean pass when every statistic can take one, else a full trace.

    Lean-capable statistics give a reducer (``sums_for``; survival and read attribution share
    one); on the trace path those reducers are fed from the trace's walk.
    """
    shared: dict = {}
    sums = {n: a.sums_for(model, batch, shared) for n, a in accs.items() if a.lean}
    reducers = list(dict.fromkeys(sums.values()))
    if len(sums) == len(accs):
        lean_pass(model, batch, reducers)
    else:
        t = trace_batch(model, batch)
        feed_trace(t, reducers)
        for name, acc in accs.items():
            if name not in sums:
                acc.update(t)
    for name, s in sums.items():
        s.into(accs[name])


class Eager:
    """``add(batch)`` by the eager step; nothing waits (``flush``)."""

    replays = 0

    def __init__(self, model, accs: dict[str, Accumulator]) -> None:
        self.model, self.accs = model, accs

    def __call__(self, batch) -> None:
        """Add ``batch`` now."""
        add_batch(self.model, batch, self.accs)

    def flush(self) -> None:
        """Nothing: each batch was added when given."""


def batch_adder(model, accs: dict[str, Accumulator], graphs: bool | str = "auto",
                seq_len: int | None = None) -> Replayed | Eager:
    """``add(batch)`` for ``accs``: replayed CUDA graphs where they can be, else eager.

    ``graphs``: ``"auto"`` replays when the model is on a CUDA device and every statistic is
    replayable (``streaming.graphs``); ``True`` insists (``InputError`` otherwise); ``False``
    never replays. Replayed batches are padded to ``seq_len`` positions or one of its halvings
    (``graphs.padded_width``). A replayed batch may be added only at the next call: call
    ``add.flush()`` before reading or saving the accumulators.
    """
    if graphs not in ("auto", True, False):
        raise InputError(f"graphs must be 'auto', True or False, not {graphs!r}")
    usable = bool(graphs) and Replayed.usable(model, accs)
    if graphs is True and not usable:
        raise InputError("graphs=True needs the model whole on one CUDA device and only "
                         f"replayable statistics ({[n for n, a in accs.items() if a.replayable]} "
                         f"of {list(accs)}); use graphs='auto'")
    return Replayed(model, accs, width=seq_len) if usable else Eager(model, accs)
