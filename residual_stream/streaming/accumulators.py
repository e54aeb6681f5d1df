"""Every statistic's accumulator, and the registry ``STATS``.

Each keeps ``mean × tokens`` in a float64 sum beside the count (see ``base``). ``growth``
(``growth.GrowthSums``), survival and read attribution at component granularity
(``flow.FlowSums``), subspaces (``subspaces.SubspaceSums``, fed from the flow buffer) and the
lens (``lens.LensSums``) reduce a batch with a reducer that runs inside the forward pass
(``lean``) or from a trace; per-head flow runs the package's own analysis on each batch's
trace. Composition is a function of the weights
alone: computed once, not accumulated. ``specs`` makes them from specs (``"lens:every=16"``).
"""

from __future__ import annotations

import dataclasses
from typing import ClassVar

import pandas as pd
import torch

from ..analyses.composition import Composition, composition
from ..analyses.flow import ReadAttribution, Survival, read_attribution, survival
from ..analyses.subspace_measures import head_write_bases
from ..analyses.subspaces import Subspace, WriteSubspaces, named_subspaces, pca_subspace
from ..analyses.tokens import safe_ratio
from ..errors import InputError
from .base import BIN_WIDTH, LOG_BINS, NORM_RANGE, Accumulator, histogram_quantile, log_histogram
from .basis import resolve, rows_for
from .clusters import OpenTexts
from .flow import FlowSums
from .growth import GrowthStats
from .lean import reduce_trace
from .lens import LensSums, check_tf32
from .sampling import TokenChoice, check_every, row_texts
from .subspaces import ReadPlans

__all__ = ["BIN_WIDTH", "LOG_BINS", "NORM_RANGE", "STATS", "Accumulator", "GrowthStats",
           "histogram_quantile", "log_histogram"]


class _TokenMeans(Accumulator):
    """An analysis whose ``FIELDS`` are means over a batch's real tokens: keeps ``mean × tokens``.

    ``LABELS`` (the axes' names) are structural, the same for every batch; they go to ``meta``.
    """

    FIELDS: ClassVar[tuple[str, ...]] = ()
    LABELS: ClassVar[tuple[str, ...]] = ()

    def analyse(self, trace):  # pragma: no cover - abstract
        """The single-trace analysis of one batch."""
        raise NotImplementedError

    def update(self, trace) -> None:
        """Add one batch."""
        result, n = self.analyse(trace), int(trace.attention_mask.sum())
        for key in self.FIELDS:
            self.add(key, getattr(result, key).double() * n)
        self.add("n", n)
        for key in self.LABELS:
            self.meta[key] = list(getattr(result, key))


class _FlowStats(_TokenMeans):
    """Survival or read attribution, from a ``flow.FlowSums`` or the replay analysis.

    At component granularity the batch feeds a shared ``flow.FlowSums`` (during the forward
    pass when every statistic can, else from the trace's walk); per-head granularity runs the
    replay analysis on the trace.
    """

    replayable = True  # at component granularity ``FlowSums`` never waits for the device
    OPTIONS = ("granularity", "every")

    def __init__(self, granularity: str = "component", every: int = 1) -> None:
        super().__init__()
        if granularity not in ("component", "head"):
            raise InputError(f"{self.name}: granularity must be 'component' or 'head', not "
                             f"{granularity!r}")
        self.granularity = granularity
        self.lean = granularity == "component"
        self.every = check_every(self.name, every)
        if every > 1 and not self.lean:
            raise InputError(f"{self.name}: every applies at component granularity; the "
                             "per-head statistic reads every token")

    def sums_for(self, model, batch, shared: dict | None = None,
                 replayable: bool = False) -> FlowSums:
        """The batch's ``FlowSums`` (shared with the other flow statistics), asked for this one.

        ``every > 1``: on about one real token in ``every``. ``replayable`` changes nothing:
        the flow sums never wait for the device.
        """
        flow = FlowSums.shared(shared, model, batch)
        flow.ask(self.name, self.every)
        return flow

    def update(self, trace) -> None:
        """Add one batch from a finished trace."""
        if not self.lean:
            super().update(trace)
            return
        reduce_trace(self, trace)


class SurvivalStats(_FlowStats):
    """Survival of every write: mean norm, share and (derived) retention per point.

    ``every > 1`` (component granularity) measures about one real token in ``every``
    (``sampling.sampled``); the contributions are carried for the tokens sampled at the
    greatest common divisor of the flow statistics' rates (``flow.FlowSums``).
    """

    name = "survival"
    FIELDS, LABELS = ("norm", "share", "born_norm"), ("sources",)

    def analyse(self, trace) -> Survival:
        """``survival`` of one batch (per-head granularity)."""
        return survival(trace, granularity=self.granularity)

    def result(self) -> Survival:
        """``Survival`` over every token so far; retention = mean norm / mean norm when added."""
        norm, born = self.mean("norm"), self.mean("born_norm")
        return Survival(tuple(self.meta["sources"]), norm, self.mean("share"),
                        safe_ratio(norm, born[:, None]), born, self.granularity)


class ReadAttributionStats(_FlowStats):
    """Mean share of every source in every reader's linear read.

    ``every > 1`` (component granularity) measures the reads of about one real token in
    ``every`` (``sampling.sampled``): the reads' products (the statistic's cost) are made for
    the chosen tokens, and the contributions are carried for the tokens sampled at the
    greatest common divisor of the flow statistics' rates (``flow.FlowSums``).
    """

    name = "read_attribution"
    FIELDS, LABELS = ("share", "abs_share"), ("readers", "sources")

    def result(self) -> ReadAttribution:
        """``ReadAttribution`` over every token read so far (no per-token shares)."""
        return ReadAttribution(tuple(self.meta["readers"]), tuple(self.meta["sources"]),
                               self.mean("share"), self.mean("abs_share"), None, self.granularity)

    def analyse(self, trace) -> ReadAttribution:
        """``read_attribution`` of one batch (per-head granularity)."""
        return read_attribution(trace, granularity=self.granularity)


class SubspaceStats(Accumulator):
    """Energy fractions of every write in the named subspaces, head overlaps, reads.

    The stream's principal components are fixed from the scan's first batch (the
    calibration: with ``order="length"``, of the first window's longest rows) so every batch
    and every process measures against the same subspace; or taken from another scan
    (``rs.scan(…, calibration=)``, ``calibration``), so that separate scans merge. Lean:
    each batch is reduced from the contribution buffer of ``flow.FlowSums`` by a
    ``subspaces.SubspaceSums``; the subspaces, the heads' write bases and the readers' bases
    are computed once per scan, so a scan of it replays as a CUDA graph (``graphs``).
    ``every > 1`` measures about one real token in ``every`` (``sampling``). ``basis``: directions
    of one's own, rows ``[k, d_model]`` (a tensor, an array, or a ``.pt``/``.npy``/``.safetensors``
    file: ``subspaces:basis=probe.pt``), measured as ``write_subspaces(basis=)`` measures them and
    named in the spec by their fingerprint (``streaming.basis``).
    """

    name = "subspaces"
    calibrates = True
    CALIBRATION = ("pca_basis",)  # [d_model, pca_k], orthonormal columns
    lean = True
    replayable = True  # its bases and read plans are made once per scan, at the first batch
    OPTIONS = ("pca_k", "unembed_k", "every", "basis")

    def __init__(self, pca_k: int = 16, unembed_k: int = 32, every: int = 1, basis: object = "") -> None:
        super().__init__()
        if pca_k < 1 or unembed_k < 1:
            raise InputError(f"subspaces: pca_k and unembed_k must be at least 1 (got {pca_k}, "
                             f"{unembed_k})")
        self.pca_k, self.unembed_k = pca_k, unembed_k
        self.every = check_every(self.name, every)
        self.basis, self._rows = resolve(basis)  # the spec's fingerprint; the rows (None: a state's)
        self._fixed: tuple | None = None  # (PCA basis, model, subspaces, head bases, read plans)

    @property
    def calibrated(self) -> bool:
        """Whether the PCA subspace is fixed already (a loaded state brings it)."""
        return "pca_basis" in self.meta

    def prepare(self, model, calibration) -> None:
        """Fix the PCA subspace from ``calibration`` (unless a loaded state already did).

        And a user's basis: its rows kept in ``meta`` (so a saved state or scan holds them), checked
        against the stream's width (``basis.rows_for``).
        """
        super().prepare(model, calibration)
        if self.basis:
            self.meta["basis"] = rows_for(model, self.basis, self._rows, self.meta.get("basis"))
        if "pca_basis" not in self.meta:
            self.meta["pca_basis"] = pca_subspace(calibration, k=self.pca_k).basis.cpu()

    def check_calibration(self, model, key: str, value: object) -> None:
        """``InputError`` unless ``value`` is a finite basis of ``model``'s stream (``d_model`` rows)."""
        d = model.anatomy.d_model
        if not (isinstance(value, torch.Tensor) and value.ndim == 2 and value.shape[0] == d
                and value.is_floating_point() and bool(value.isfinite().all())):
            raise InputError(f"subspaces: the calibration's {key!r} is not a finite basis of a "
                             f"{d}-wide stream: calibrate with a scan of the model scanned")

    def sums_for(self, model, batch, shared: dict | None = None,
                 replayable: bool = False) -> FlowSums:
        """The batch's ``FlowSums`` (shared with the flow statistics), feeding a ``SubspaceSums``.

        Everything that depends on the model alone (the named subspaces, the heads' write
        bases, the readers' bases: ``subspaces.ReadPlans``) is made once per scan and model,
        on its device, at the first batch; ``replayable`` changes nothing: a replay's
        warm-up is that first batch, and later passes never wait for the device.
        """
        basis = self.meta["pca_basis"]
        if self._fixed is None or self._fixed[0] is not basis or self._fixed[1] is not model:
            pca = Subspace(f"pca{basis.shape[1]}@{model.anatomy.n_layers}", basis)  # as pca_subspace names it
            subs = [Subspace(s.name, s.basis.to(model.device))  # not copied inside the pass
                    for s in named_subspaces(model, pca, self.unembed_k, self.meta.get("basis"))]
            self._fixed = (basis, model, subs, head_write_bases(model).to(model.device),
                           ReadPlans(model))
        flow = FlowSums.shared(shared, model, batch)
        flow.ask(self.name, self.every)
        flow.subspace_parts = self._fixed[2:]
        return flow

    def update(self, trace) -> None:
        """Add one batch from a finished trace."""
        reduce_trace(self, trace)

    def result(self) -> WriteSubspaces:
        """``WriteSubspaces`` over every token so far."""
        m = self.meta
        return WriteSubspaces(tuple(m["writes"]), tuple(m["subspaces"]), self.mean("named"),
                              tuple(m["heads"]), self.mean("head_overlap"), tuple(m["readers"]),
                              self.mean("read_fraction"), self.mean("read_strength"))


class LensStats(Accumulator):
    """Logit lens per point: mean KL to the final distribution, top-1 agreement, median rank.

    Lean: each batch's points and logits are reduced by ``lens.LensSums`` (the median rank is
    exact: its histogram covers the vocabulary). ``every > 1`` reduces about one real token in
    ``every``, chosen by its place in the corpus (``sampling.sampled``), from the same pass that
    gives the logits: a ``1/every`` share of the lens's unembeddings and no second forward
    pass, for means estimated from a sample (``kl_se`` and ``kl_se_texts`` state its error).
    ``tf32``: the unembeddings' inputs rounded to TF32 and, on a GPU, their products on the
    tensor cores (a 16-bit ``W_U`` only; ``lens.tf32_round``, where its effect is measured).
    """

    name = "lens"
    lean = True
    replayable = True  # every token: the logits' pass and the lean pass are one graph
    OPTIONS = ("every", "tf32")
    PARTS = ("open_texts",)

    def __init__(self, every: int = 1, tf32: bool = False) -> None:
        super().__init__()
        self.every = check_every(self.name, every)
        if not isinstance(tf32, bool):
            raise InputError(f"lens: tf32 is True or False, not {tf32!r}")
        self.tf32 = tf32
        self.open_texts = OpenTexts()  # the current segment's texts (``clusters``)

    def prepare(self, model, calibration) -> None:
        """Refuse what the scan could not do, before its first batch.

        A model without an LM head (``NotAvailableError``); TF32 products for a float32
        ``W_U`` or a head with a transform (``InputError``, ``lens.check_tf32``).
        """
        super().prepare(model, calibration)
        unembed = model.unembed(native=True)
        if self.tf32:
            check_tf32(unembed)

    def sums_for(self, model, batch, shared: dict | None = None,
                 replayable: bool = False) -> LensSums:
        """A ``LensSums`` for one batch of ``model``, on the sampled tokens when ``every > 1``.

        ``replayable`` changes nothing: the lens never waits for the device (on every token
        the plain forward pass for the logits comes first in the same replayed graph).
        """
        mask = batch.attention_mask.to(model.device)
        return LensSums(model, TokenChoice.of(batch, mask, self.every),
                        row_texts(batch, model.device), self.tf32)

    def update(self, trace) -> None:
        """Add one batch from a finished trace."""
        reduce_trace(self, trace)

    def result(self) -> pd.DataFrame:
        """Per point: ``kl``, ``top1_agreement``, ``median_rank``, ``kl_se``, ``tokens``.

        The first three as ``LogitLens.summary`` gives them (KL in nats). ``kl_se``: the
        standard error of the mean KL, ``std / √tokens``, treating the reduced tokens as
        independent draws. ``kl_se_texts``: the same clustered by text (tokens of one text are
        correlated): ``√(T/(T−1) Σ_t (S_t − m n_t)²) / tokens`` over the ``texts`` T that
        have a reduced token, ``S_t`` a text's KL sum, ``n_t`` its tokens, ``m`` the mean, over
        all its rows in every batch (``clusters``); NaN over one text, as ``kl_se`` over one
        token. ``tokens``: how many tokens the means are over (all real ones when ``every`` is 1).
        """
        n = int(self.sums["n"])
        k = (n - 1) // 2  # torch.median's order statistic
        cum = self.sums["rank_hist"].cpu().cumsum(-1)
        median = [float(torch.searchsorted(c, torch.tensor(k), right=True)) if n else float("nan")
                  for c in cum]
        kl = self.sums["kl"].cpu() / n if n else torch.full_like(self.sums["kl"].cpu(), float("nan"))
        var = ((self.sums["kl_sq"].cpu() / n - kl.square()).clamp_min(0) * n / (n - 1) if n > 1
               else kl * float("nan"))  # one token: no spread to see
        t = self.open_texts.totals(self.sums)  # closed texts and the open ones
        texts = int(t["texts"])  # Σ_t (S_t − m n_t)², the texts' residual sums, expanded
        spread = (t["text_kl_sq"] - 2 * kl * t["text_kl_n"] + kl.square() * t["text_n_sq"]).clamp_min(0)
        var_texts = spread * texts / (texts - 1) / n ** 2 if texts > 1 else kl * float("nan")
        return pd.DataFrame({"point": range(cum.shape[0]), "kl": kl.clamp_min(0).float().numpy(),
                             "top1_agreement": self.mean("top1").numpy(), "median_rank": median,
                             "kl_se": (var / max(n, 1)).sqrt().float().numpy(),
                             "kl_se_texts": var_texts.sqrt().float().numpy(), "tokens": n,
                             "texts": texts})


class _NoSums:
    """A reducer that takes nothing: for statistics that do not depend on the data."""

    def point(self, point: int, x) -> None:
        """Nothing."""

    def step(self, step, scales) -> None:
        """Nothing."""

    def into(self, acc: Accumulator) -> None:
        """Nothing."""

    def rebind(self, batch, width: int) -> None:
        """Nothing: no sums to name a batch in."""

    def overflowed(self) -> bool:
        """Never."""
        return False


class CompositionStats(Accumulator):
    """Q/K/V composition scores: weights only, computed once (nothing to accumulate).

    Lean and replayable, so that it never forces a full trace, or the eager pass on a GPU,
    on the statistics scanned beside it.
    """

    name = "composition"
    lean = True
    replayable = True

    def sums_for(self, model, batch, shared: dict | None = None,
                 replayable: bool = False) -> _NoSums:
        """Nothing to reduce per batch."""
        return _NoSums()

    def update(self, trace) -> None:
        """Nothing per batch: composition does not depend on the data."""

    def result(self):
        """``Composition`` of the scanned model, computed once.

        Its fields are kept in ``meta`` (on the CPU), so a state or a saved scan holds them and
        gives them back without the model (``saved.load_scan``).
        """
        if "result" not in self.meta:
            self.meta["result"] = _fields(composition(self.model))
        return Composition(**{k: tuple(v) if k in ("heads", "mlps") else v
                              for k, v in self.meta["result"].items()})


def _fields(result: Composition) -> dict:
    """``result``'s fields as a state holds them: tensors on the CPU, lists, dicts and a bool."""
    def kept(v):
        if isinstance(v, torch.Tensor):
            return v.detach().cpu()
        if isinstance(v, dict):
            return {k: kept(x) for k, x in v.items()}
        return list(v) if isinstance(v, tuple) else v
    return {f.name: kept(getattr(result, f.name)) for f in dataclasses.fields(result)}


STATS: dict[str, type[Accumulator]] = {
    cls.name: cls for cls in (GrowthStats, SurvivalStats, ReadAttributionStats, SubspaceStats,
                              LensStats, CompositionStats)
}
