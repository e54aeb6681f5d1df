"""Accumulators: every corpus-level statistic as sums, counts, histograms and top-k lists.

Each accumulator keeps only what merges exactly: a mean over the real tokens of a batch
becomes ``mean × tokens`` added to a float64 sum, with the token count beside it (growth,
flow, subspaces and the lens reduce a batch with their own reducers, ``growth``, ``flow``,
``subspaces``, ``lens``; per-head flow runs the package's analysis per batch). Means over the corpus are
the means the analysis would give on one trace of every row (up to float64 summation order),
and memory depends on the model, never on the number of tokens.

Two statistics are not means and use a stated approximation or a bound:

* quantiles of the stream norm (median, 5th, 95th percentile) come from a histogram with
  ``LOG_BINS`` log-spaced bins between ``NORM_RANGE``; the estimate interpolates
  geometrically inside the bin holding the order statistic, so it is within one bin width
  (``BIN_WIDTH`` ≈ 0.58 % relative) of ``torch.quantile`` on the same values; a norm of
  exactly 0 (a zeroed embedding, as ESM's token dropout gives a mask token) has a bin of its
  own and reads 0; other norms outside the range are clamped into the end bins;
* massive activations keep the ``top_k`` largest by magnitude (and the total number found);
  the logit lens's median rank is exact (an integer histogram over the vocabulary).

Composition is a function of the weights alone: computed once, not accumulated.
"""

from __future__ import annotations

import copy
import functools
import inspect
import math
from collections.abc import Callable, Iterable
from typing import ClassVar

import torch
from torch import Tensor

LOG_BINS = 4000
NORM_RANGE = (1e-4, 1e6)
BIN_WIDTH = (NORM_RANGE[1] / NORM_RANGE[0]) ** (1 / LOG_BINS) - 1
_EDGES = torch.logspace(math.log10(NORM_RANGE[0]), math.log10(NORM_RANGE[1]), LOG_BINS + 1,
                        dtype=torch.float64)


class Accumulator:
    """Base: named float64 / int64 sums that add on ``update`` and ``merge``.

    Subclasses implement ``update(trace)`` (add one batch) and ``result()``.
    ``state_dict`` / ``load_state_dict`` hold only tensors, numbers, strings and lists, so a
    state can be saved with ``torch.save`` and read back with ``weights_only=True``.
    """

    name: ClassVar[str] = ""
    OPTIONS: ClassVar[tuple[str, ...]] = ()  # constructor keywords a spec may set (``spec``)
    calibrates: ClassVar[bool] = False  # needs the corpus's first batch before any update
    CALIBRATION: ClassVar[tuple[str, ...]] = ()  # the meta keys that calibration fixes (``calibration``)
    lean: ClassVar[bool] = False  # can be fed during the forward pass (``lean.lean_pass``)
    replayable: ClassVar[bool] = False  # its reducer never waits for the device (``graphs``)
    PARTS: ClassVar[tuple[str, ...]] = ()  # attributes kept beside the sums (``segment_done``)

    def __init__(self) -> None:
        self.sums: dict[str, Tensor] = {}
        self.meta: dict[str, object] = {}

    @property
    def spec(self) -> str:
        """The statistic's name and every option off its default: ``"lens:every=16"``.

        What a scan keys its results and its saved state by, and what ``make_accumulators``
        reads back (``parse_spec``).
        """
        defaults = self.option_defaults()
        return self.name + "".join(f":{k}={getattr(self, k)}" for k in self.OPTIONS
                                   if getattr(self, k) != defaults[k])

    @classmethod
    def option_defaults(cls) -> dict[str, object]:
        """Each of ``OPTIONS`` with its default (the constructor's)."""
        params = inspect.signature(cls.__init__).parameters
        return {k: params[k].default for k in cls.OPTIONS}

    @property
    def tokens(self) -> int:
        """How many tokens the means are over so far.

        The sampled ones of a statistic with ``every > 1``; 0 for one that counts none
        (composition).
        """
        return int(self.sums["n"]) if "n" in self.sums else 0

    @property
    def calibrated(self) -> bool:
        """Whether nothing is left to fix from a calibration batch (``calibrates``)."""
        return not self.calibrates

    def prepare(self, model, calibration) -> None:
        """Fix anything data-dependent before the first batch.

        ``calibration``: batch 0's stream after the last block (``lean.Points``), or None when
        no statistic asked for one (``calibrates``).
        """
        self.model = model

    def check_calibration(self, model, key: str, value: object) -> None:
        """``InputError`` where ``value``, another scan's calibration ``key``, cannot serve ``model``."""

    def segment_done(self) -> None:
        """A corpus segment ended (``rs.scan`` calls this after its last batch).

        Each of ``PARTS`` (state kept per text, which no text carries past its segment: the
        lens's ``clusters.OpenTexts``) folds what it holds into the sums (``close``). Such a
        part also has ``state``, ``load`` and ``merge``, and its class makes an empty one.
        """
        for name in self.PARTS:
            getattr(self, name).close(self)

    def add(self, key: str, value: Tensor | float | int) -> None:
        """Add ``value`` to the sum ``key`` (float64, or int64 for integer values).

        Sums stay on the device of their first value (no host sync per batch); a sum on the
        CPU (restored by ``load_state_dict``, or first added there) moves to the device of the
        first value that is not, so a scan resumed on a GPU adds there. ``state_dict`` and
        ``result`` read them back to the CPU.
        """
        v = torch.as_tensor(value).detach()
        v = v.to(torch.int64) if not v.is_floating_point() else v.to(torch.float64)
        old = self.sums.get(key)
        if old is None:
            self.sums[key] = v.clone()
            return
        if old.device.type == "cpu":
            old = old.to(v.device)
        v = v.to(old.device)
        if old.shape != v.shape:  # per-position sums: pad the shorter along the last axis
            width = max(old.shape[-1], v.shape[-1])
            old, v = (torch.nn.functional.pad(t, (0, width - t.shape[-1])) for t in (old, v))
        self.sums[key] = old + v

    def empty_like(self) -> Accumulator:
        """A new accumulator with this one's settings (and model) and no sums."""
        clone = copy.copy(self)
        clone.sums, clone.meta = {}, {}
        for name in self.PARTS:
            setattr(clone, name, type(getattr(self, name))())
        return clone

    def merge(self, other: Accumulator) -> None:
        """Add ``other``'s sums (same statistic, disjoint batches) into this one."""
        if type(other) is not type(self):
            raise TypeError(f"cannot merge {type(other).__name__} into {type(self).__name__}")
        for key, value in other.sums.items():
            self.add(key, value)
        for key, value in other.meta.items():
            self.meta.setdefault(key, value)
        for name in self.PARTS:
            getattr(self, name).merge(getattr(other, name))

    def state_dict(self) -> dict:
        """Sums (on the CPU) and metadata, safe for ``torch.load(weights_only=True)``."""
        return {"sums": {k: v.detach().cpu().clone() for k, v in self.sums.items()},
                "meta": dict(self.meta), **{name: getattr(self, name).state() for name in self.PARTS}}

    def load_state_dict(self, state: dict) -> None:
        """Restore what ``state_dict`` returned."""
        self.sums = {k: v.clone() for k, v in state["sums"].items()}
        self.meta = dict(state["meta"])
        for name in self.PARTS:
            getattr(self, name).load(state.get(name, {}))

    def mean(self, key: str, count: str = "n") -> Tensor:
        """The float32 mean ``sums[key] / sums[count]`` (on the CPU)."""
        return (self.sums[key].cpu() / self.sums[count].cpu()).float()

    def update(self, trace) -> None:  # pragma: no cover - abstract
        """Add one batch."""
        raise NotImplementedError

    def result(self):  # pragma: no cover - abstract
        """The statistic over every batch added so far."""
        raise NotImplementedError


Admit = Callable[["Accumulator", "Accumulator", str, int], None]


def merged(accs: dict[str, Accumulator], states: Iterable[dict[str, dict]],
           admit: Admit | None = None) -> dict[str, Accumulator]:
    """New accumulators with ``accs``' settings holding the sum of ``states``, in their order.

    Each of ``states`` maps a statistic's name to a ``state_dict`` (a process's, a saved scan's),
    read once, in turn: a generator may load each as it is asked. ``admit(merged, part, name,
    i)`` may check or mark part ``i`` before it is added. How the processes of a scan are merged
    (``runner``), and scans of a corpus's parts (``merging``).
    """
    out = {n: a.empty_like() for n, a in accs.items()}  # same settings, no sums
    for i, state in enumerate(states):
        for name, acc in out.items():
            part = acc.empty_like()
            part.load_state_dict(state[name])
            if admit is not None:
                admit(acc, part, name, i)
            acc.merge(part)
    return out


def log_histogram(values: Tensor, weights: Tensor | None = None) -> Tensor:
    """Counts of ``values [point, n]`` in ``1 + LOG_BINS`` bins per point: zeros, then log-spaced.

    Column 0 counts values ≤ 0 (a norm is 0 exactly when its vector is); columns
    ``1..LOG_BINS`` are the log-spaced bins between ``NORM_RANGE``, the end ones taking what
    lies outside it. ``weights [n]`` (0 or 1) selects which of the ``n`` values count, without
    indexing.
    """
    log_bin = (torch.bucketize(values.double(), _edges(values.device)) - 1).clamp(0, LOG_BINS - 1)
    width = LOG_BINS + 1
    idx = torch.where(values > 0, log_bin + 1, 0)
    idx = idx + torch.arange(values.shape[0], device=values.device)[:, None] * width
    ones = torch.ones_like(idx) if weights is None else weights.to(torch.int64).expand_as(idx)
    counts = torch.zeros(values.shape[0] * width, dtype=torch.int64, device=values.device)
    counts.index_add_(0, idx.flatten(), ones.flatten())  # not bincount: it reads a maximum back
    return counts.view(values.shape[0], width)


@functools.cache
def _edges(device: torch.device) -> Tensor:
    """``_EDGES`` on ``device``, copied there once (a copy per call waits for the device)."""
    return _EDGES.to(device)


@functools.cache
def device_constant(values: tuple, device: torch.device, dtype: torch.dtype | None = None) -> Tensor:
    """``torch.tensor(values)`` on ``device``, made once: a copy per batch waits for the device.

    Read-only (shared by every caller with the same ``values``).
    """
    return torch.tensor(values, device=device, dtype=dtype)


def cloned(obj: object) -> object:
    """A shallow copy of ``obj`` whose tensors, also in its lists, tuples and dicts, are copies.

    The copies are ``copies``'s (growth's sums hold ~200 tensors of a few shapes). Other
    attributes (a batch, say) are shared.
    """
    found: list[Tensor] = []

    def walk(v, rebuild: list | None = None):
        if isinstance(v, Tensor):
            if rebuild is None:
                found.append(v)
                return v
            return rebuild.pop()
        if isinstance(v, (list, tuple)):
            return type(v)(walk(x, rebuild) for x in v)
        return {k: walk(x, rebuild) for k, x in v.items()} if isinstance(v, dict) else v

    walk(vars(obj))
    out = copy.copy(obj)
    out.__dict__.update(walk(vars(obj), copies(found)[::-1]))
    return out


def copies(tensors: list[Tensor]) -> list[Tensor]:
    """A copy of each tensor, in order, made by one ``torch.stack`` per shape, dtype and device.

    Each copy is a view of its stack: a few kernels on a GPU, not one per tensor.
    """
    groups: dict[tuple, list[int]] = {}
    for i, t in enumerate(tensors):
        groups.setdefault((tuple(t.shape), t.dtype, t.device), []).append(i)
    out: list = [None] * len(tensors)
    for members in groups.values():
        for i, view in zip(members, torch.stack([tensors[i] for i in members]).unbind(), strict=True):
            out[i] = view
    return out


def host_lists(tensors: list[Tensor]) -> list[list]:
    """Each tensor (1-D or 2-D) as a list, or a list of rows, in one read back from the device.

    Float64 holds every value exactly (float32 values, indices and counts below 2**53);
    integer tensors come back as ints.
    """
    flat = torch.cat([t.double().flatten() for t in tensors]).tolist()
    out, at = [], 0
    for t in tensors:
        part = flat[at:at + t.numel()]
        at += t.numel()
        if not t.is_floating_point():
            part = [int(v) for v in part]
        out.append([part[i * t.shape[1]:(i + 1) * t.shape[1]] for i in range(t.shape[0])]
                   if t.dim() == 2 else part)
    return out


def _order_statistic(row: Tensor, cum: Tensor, k: int) -> float:
    """Estimate of the ``k``-th smallest value (0-based) from one histogram row: inside its bin.

    Bin 0 holds exact zeros; log bin ``b ≥ 1`` spans ``_EDGES[b - 1]`` to ``_EDGES[b]``.
    """
    b = int(torch.searchsorted(cum, torch.tensor(k), right=True))
    if b == 0:
        return 0.0
    before = int(cum[b - 1])
    frac = (k - before + 0.5) / max(int(row[b]), 1)
    lo, hi = float(_EDGES[b - 1]), float(_EDGES[b])
    return lo * (hi / lo) ** min(max(frac, 0.0), 1.0)


def histogram_quantile(counts: Tensor, q: float) -> Tensor:
    """``q``-quantile per row of log-histogram ``counts``, defined as ``torch.quantile`` does.

    ``torch.quantile`` interpolates linearly between the order statistics at ranks
    ``floor(q (n − 1))`` and the next; each is estimated inside its own bin (geometric
    interpolation by rank within the bin), so the result is within one bin width
    (``BIN_WIDTH``, relative) of the exact quantile; an order statistic that is 0 reads 0.
    """
    out = []
    for row in counts.cpu():
        n, cum = int(row.sum()), row.cumsum(0)
        rank = q * (n - 1)
        k = math.floor(rank)
        lo = _order_statistic(row, cum, k)
        hi = _order_statistic(row, cum, min(k + 1, n - 1))
        out.append(lo + (rank - k) * (hi - lo))
    return torch.tensor(out, dtype=torch.float32)


