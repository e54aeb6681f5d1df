"""Accumulators: every corpus-level statistic as sums, counts, histograms and top-k lists.

Each accumulator runs the package's own analysis on one batch's trace and keeps only what
merges exactly: a mean over the real tokens of a batch becomes ``mean × tokens`` added to a
float64 sum, with the token count beside it. Means over the whole corpus are then exactly
the means the analysis would give on one trace of every row (up to float64 summation order),
and memory depends on the model, never on the number of tokens.

Two statistics are not means and use a stated approximation or a bound:

* quantiles of the stream norm (median, 5th, 95th percentile) come from a histogram with
  ``LOG_BINS`` log-spaced bins between ``NORM_RANGE``; the estimate interpolates
  geometrically inside the bin holding the order statistic, so it is within one bin width
  (``BIN_WIDTH`` ≈ 0.58 % relative) of ``torch.quantile`` on the same values; norms outside
  the range are clamped into the end bins;
* massive activations keep the ``top_k`` largest by magnitude (and the total number found);
  the logit lens's median rank is exact (an integer histogram over the vocabulary).

Composition is a function of the weights alone: computed once, not accumulated.
"""

from __future__ import annotations

import math
from typing import ClassVar

import numpy as np
import pandas as pd
import torch
from torch import Tensor

from ..analyses.composition import composition
from ..analyses.flow import read_attribution, survival
from ..analyses.growth import MASSIVE_ABS, MASSIVE_REL, NormGrowth, _fit, _updates_and_norm_inputs
from ..analyses.lens import logit_lens
from ..analyses.subspaces import WriteSubspaces, pca_subspace, write_subspaces
from ..analyses.tokens import real, safe_ratio
from ..errors import InputError

LOG_BINS = 4000
NORM_RANGE = (1e-4, 1e6)
BIN_WIDTH = (NORM_RANGE[1] / NORM_RANGE[0]) ** (1 / LOG_BINS) - 1
_EDGES = torch.logspace(math.log10(NORM_RANGE[0]), math.log10(NORM_RANGE[1]), LOG_BINS + 1,
                        dtype=torch.float64)


def _real_count(trace) -> int:
    return int(trace.attention_mask.sum())


class Accumulator:
    """Base: named float64 / int64 sums that add on ``update`` and ``merge``.

    Subclasses implement ``update(trace, first_row)`` (add one batch) and ``result()``.
    ``state_dict`` / ``load_state_dict`` hold only tensors, numbers, strings and lists, so a
    state can be saved with ``torch.save`` and read back with ``weights_only=True``.
    """

    name: ClassVar[str] = ""
    calibrates: ClassVar[bool] = False  # needs the corpus's first batch before any update

    def __init__(self) -> None:
        self.sums: dict[str, Tensor] = {}
        self.meta: dict[str, object] = {}

    def prepare(self, model, calibration) -> None:
        """Fix anything data-dependent before the first batch (``calibration``: batch 0's trace)."""
        self.model = model

    def add(self, key: str, value: Tensor | float | int) -> None:
        """Add ``value`` to the sum ``key`` (float64, or int64 for integer values).

        Sums stay on the device of their first value (no host sync per batch); ``state_dict``
        and ``result`` read them back to the CPU.
        """
        v = torch.as_tensor(value).detach()
        v = v.to(torch.int64) if not v.is_floating_point() else v.to(torch.float64)
        old = self.sums.get(key)
        if old is None:
            self.sums[key] = v.clone()
            return
        v = v.to(old.device)
        if old.shape != v.shape:  # per-position sums: pad the shorter along the last axis
            width = max(old.shape[-1], v.shape[-1])
            old, v = (torch.nn.functional.pad(t, (0, width - t.shape[-1])) for t in (old, v))
        self.sums[key] = old + v

    def merge(self, other: Accumulator) -> None:
        """Add ``other``'s sums (same statistic, disjoint batches) into this one."""
        if type(other) is not type(self):
            raise TypeError(f"cannot merge {type(other).__name__} into {type(self).__name__}")
        for key, value in other.sums.items():
            self.add(key, value)
        for key, value in other.meta.items():
            self.meta.setdefault(key, value)

    def state_dict(self) -> dict:
        """Sums (on the CPU) and metadata, safe for ``torch.load(weights_only=True)``."""
        return {"sums": {k: v.detach().cpu().clone() for k, v in self.sums.items()},
                "meta": dict(self.meta)}

    def load_state_dict(self, state: dict) -> None:
        """Restore what ``state_dict`` returned."""
        self.sums = {k: v.clone() for k, v in state["sums"].items()}
        self.meta = dict(state["meta"])

    def mean(self, key: str, count: str = "n") -> Tensor:
        """The float32 mean ``sums[key] / sums[count]`` (on the CPU)."""
        return (self.sums[key].cpu() / self.sums[count].cpu()).float()

    def update(self, trace, first_row: int = 0) -> None:  # pragma: no cover - abstract
        """Add one batch."""
        raise NotImplementedError

    def result(self):  # pragma: no cover - abstract
        """The statistic over every batch added so far."""
        raise NotImplementedError


def log_histogram(values: Tensor) -> Tensor:
    """Counts of ``values [point, n]`` in the ``LOG_BINS`` log-spaced bins (clamped), per point."""
    idx = (torch.bucketize(values.double(), _EDGES.to(values.device)) - 1).clamp(0, LOG_BINS - 1)
    offset = torch.arange(values.shape[0], device=values.device)[:, None] * LOG_BINS
    return torch.bincount((idx + offset).flatten(), minlength=values.shape[0] * LOG_BINS) \
        .view(values.shape[0], LOG_BINS)


def _order_statistic(row: Tensor, cum: Tensor, k: int) -> float:
    """Estimate of the ``k``-th smallest value (0-based) from one histogram row: inside its bin."""
    b = int(torch.searchsorted(cum, torch.tensor(k), right=True))
    before = int(cum[b - 1]) if b else 0
    frac = (k - before + 0.5) / max(int(row[b]), 1)
    lo, hi = float(_EDGES[b]), float(_EDGES[b + 1])
    return lo * (hi / lo) ** min(max(frac, 0.0), 1.0)


def histogram_quantile(counts: Tensor, q: float) -> Tensor:
    """``q``-quantile per row of log-histogram ``counts``, defined as ``torch.quantile`` does.

    ``torch.quantile`` interpolates linearly between the order statistics at ranks
    ``floor(q (n − 1))`` and the next; each is estimated inside its own bin (geometric
    interpolation by rank within the bin), so the result is within one bin width
    (``BIN_WIDTH``, relative) of the exact quantile.
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


class GrowthStats(Accumulator):
    """Norm growth, update sizes, norm inputs, centering share and massive activations."""

    name = "growth"

    def __init__(self, top_k: int = 1000) -> None:
        super().__init__()
        self.top_k = top_k

    def update(self, trace, first_row: int = 0) -> None:
        """Add one batch (``first_row``: the corpus row index of its first row).

        The same quantities as ``norm_growth``, kept as sums on the trace's device: no host
        round trip per field; massive activations are read back only when there are some.
        """
        n = trace.anatomy.n_layers
        streams = [trace.stream(L) for L in range(n + 1)]
        mask = trace.attention_mask.to(streams[0].device).bool()
        rest = mask.clone()
        rest[:, 0] = False
        rest = rest if rest.any() else mask
        energy = torch.stack([x.pow(2).sum(-1) for x in streams])          # (point, batch, pos)
        norms = energy.sqrt()
        d = streams[0].shape[-1]
        ones = torch.stack([x.sum(-1) for x in streams]).pow(2) / (d * energy.clamp_min(1e-30))
        vals = norms[:, rest]
        self.add("mean", vals.double().sum(-1))
        self.add("n_rest", rest.sum())
        self.add("sumsq", vals.double().pow(2).sum(-1))
        self.add("hist", log_histogram(vals))
        self.add("first", norms[:, :, 0].double().sum(-1))
        self.add("n_rows", mask.shape[0])
        self.add("per_position", (norms * mask).sum(1))
        self.add("position_count", mask.sum(0))
        self.add("ones_share", ones[:, mask].double().sum(-1))
        self.add("n", mask.sum())
        attn, mlp, norm_inputs = _updates_and_norm_inputs(trace)
        n_real = mask.sum()
        self.add("update_attn", attn.double() * n_real.cpu())
        self.add("update_mlp", mlp.double() * n_real.cpu())
        self.add("norm_input", torch.tensor(norm_inputs.input_norm.to_numpy()) * n_real.cpu())
        self.add("norm_scale", torch.tensor(norm_inputs.scale.to_numpy()) * n_real.cpu())
        self.meta["norms"] = list(norm_inputs.norm)
        self.meta["model_name"] = trace.model.name
        rows = self._massive(trace, streams, mask, first_row)
        self.add("massive_found", len(rows))
        self._keep_massive(rows)

    @staticmethod
    def _massive(trace, streams: list[Tensor], mask: Tensor, first_row: int) -> list[dict]:
        """Coordinates over ``MASSIVE_ABS`` and ``MASSIVE_REL`` × their token's median |x|."""
        hits = []
        for p, x in enumerate(streams):
            mags = x.abs()
            med = mags.median(-1, keepdim=True).values
            hit = (mags > MASSIVE_ABS) & (mags > MASSIVE_REL * med) & mask[..., None]
            hits.append((p, hit, x, med))
        found = torch.stack([h.any() for _, h, _, _ in hits])
        rows = []
        for (p, hit, x, med), any_hit in zip(hits, found.tolist(), strict=True):
            if not any_hit:
                continue
            for b, t, d in hit.nonzero().tolist():
                rows.append({"point": p, "batch": b + first_row, "pos": t, "dim": d,
                             "token": trace.str_tokens[b][t], "value": float(x[b, t, d]),
                             "ratio_to_median": float(x[b, t, d].abs() / med[b, t, 0].clamp_min(1e-30))})
        return rows

    def _keep_massive(self, rows: list[dict]) -> None:
        kept = list(self.meta.get("massive", [])) + rows
        kept.sort(key=lambda r: (-abs(r["value"]), r["batch"], r["pos"], r["point"], r["dim"]))
        self.meta["massive"] = kept[: self.top_k]

    def merge(self, other: Accumulator) -> None:
        """Add sums; keep the top-k massive activations of both."""
        mine = list(self.meta.get("massive", []))
        super().merge(other)
        self.meta["massive"] = mine
        self._keep_massive(list(other.meta.get("massive", [])))

    def result(self) -> NormGrowth:
        """``NormGrowth`` over every token so far (quantiles from the histogram)."""
        mean = self.mean("mean", "n_rest")
        per_pos = self.mean("per_position", "position_count")
        rate, r2 = _fit(mean)
        massive = pd.DataFrame(self.meta.get("massive", []),
                               columns=["point", "batch", "pos", "dim", "token", "value",
                                        "ratio_to_median"])
        norm_inputs = pd.DataFrame({"norm": self.meta.get("norms", []),
                                    "input_norm": self.mean("norm_input").numpy(),
                                    "scale": self.mean("norm_scale").numpy()})
        return NormGrowth(
            mean=mean, median=histogram_quantile(self.sums["hist"], 0.5),
            p5=histogram_quantile(self.sums["hist"], 0.05),
            p95=histogram_quantile(self.sums["hist"], 0.95), first_token=self.mean("first", "n_rows"),
            per_position=per_pos, growth=mean[1:] / mean[:-1], fit_rate=rate, fit_r2=r2,
            update_attn=self.mean("update_attn"), update_mlp=self.mean("update_mlp"),
            ones_share=self.mean("ones_share"), norm_inputs=norm_inputs, massive=massive,
            model_name=str(self.meta.get("model_name", "")),
        )

    def std(self) -> Tensor:
        """Standard deviation of the stream norm per point (from the second moment)."""
        mean = self.mean("mean", "n_rest").double()
        return (self.mean("sumsq", "n_rest").double() - mean.pow(2)).clamp_min(0).sqrt().float()


class SurvivalStats(Accumulator):
    """Survival of every write: mean norm, share and (derived) retention per point."""

    name = "survival"

    def __init__(self, granularity: str = "component") -> None:
        super().__init__()
        self.granularity = granularity

    def update(self, trace, first_row: int = 0) -> None:
        """Add one batch."""
        s = survival(trace, granularity=self.granularity)
        n = _real_count(trace)
        for key in ("norm", "share", "born_norm"):
            self.add(key, getattr(s, key).double() * n)
        self.add("n", n)
        self.meta["sources"] = list(s.sources)

    def result(self):
        """``Survival`` over every token so far; retention = mean norm / mean norm when added."""
        from ..analyses.flow import Survival

        norm, born = self.mean("norm"), self.mean("born_norm")
        return Survival(tuple(self.meta["sources"]), norm, self.mean("share"),
                        safe_ratio(norm, born[:, None]), born, self.granularity)


class ReadAttributionStats(Accumulator):
    """Mean share of every source in every reader's linear read."""

    name = "read_attribution"

    def __init__(self, granularity: str = "component") -> None:
        super().__init__()
        self.granularity = granularity

    def update(self, trace, first_row: int = 0) -> None:
        """Add one batch."""
        r = read_attribution(trace, granularity=self.granularity)
        n = _real_count(trace)
        self.add("share", r.share.double() * n)
        self.add("abs_share", r.abs_share.double() * n)
        self.add("n", n)
        self.meta["readers"], self.meta["sources"] = list(r.readers), list(r.sources)

    def result(self):
        """``ReadAttribution`` over every token so far (no per-token shares)."""
        from ..analyses.flow import ReadAttribution

        return ReadAttribution(tuple(self.meta["readers"]), tuple(self.meta["sources"]),
                               self.mean("share"), self.mean("abs_share"), None, self.granularity)


class SubspaceStats(Accumulator):
    """Energy fractions of every write in the named subspaces, head overlaps, reads.

    The stream's principal components are fixed from the first batch of the corpus (the
    calibration) so every batch and every process measures against the same subspace.
    """

    name = "subspaces"
    calibrates = True

    def __init__(self, pca_k: int = 16, unembed_k: int = 32) -> None:
        super().__init__()
        self.pca_k, self.unembed_k = pca_k, unembed_k

    def prepare(self, model, calibration) -> None:
        """Fix the PCA subspace from ``calibration`` (unless a loaded state already did)."""
        super().prepare(model, calibration)
        if "pca_basis" not in self.meta:
            self.meta["pca_basis"] = pca_subspace(calibration, k=self.pca_k).basis.cpu()

    def update(self, trace, first_row: int = 0) -> None:
        """Add one batch."""
        from ..analyses.subspaces import Subspace

        pca = Subspace("pca", self.meta["pca_basis"])
        w = write_subspaces(trace, pca_trace=pca, unembed_k=self.unembed_k)
        n = _real_count(trace)
        for key in ("named", "head_overlap", "read_fraction", "read_strength"):
            self.add(key, getattr(w, key).double() * n)
        self.add("n", n)
        for key in ("writes", "subspaces", "heads", "readers"):
            self.meta[key] = list(getattr(w, key))

    def result(self) -> WriteSubspaces:
        """``WriteSubspaces`` over every token so far."""
        m = self.meta
        return WriteSubspaces(tuple(m["writes"]), tuple(m["subspaces"]), self.mean("named"),
                              tuple(m["heads"]), self.mean("head_overlap"), tuple(m["readers"]),
                              self.mean("read_fraction"), self.mean("read_strength"))


class LensStats(Accumulator):
    """Logit lens per point: mean KL to the final distribution, top-1 agreement, median rank."""

    name = "lens"

    def update(self, trace, first_row: int = 0) -> None:
        """Add one batch (the rank histogram covers the vocabulary, so the median is exact)."""
        lens = logit_lens(trace, k=1)
        n = _real_count(trace)
        m = trace.attention_mask.bool()
        self.add("kl", real(lens.kl, m, lead=1).double().sum(-1))
        self.add("top1", real(lens.top1_agree, m, lead=1).double().sum(-1))
        ranks = real(lens.final_token_rank, m, lead=1)
        V = trace.anatomy.d_vocab
        offset = torch.arange(ranks.shape[0])[:, None] * V
        self.add("rank_hist", torch.bincount((ranks + offset).flatten(),
                                             minlength=ranks.shape[0] * V).view(-1, V))
        self.add("n", n)

    def result(self) -> pd.DataFrame:
        """Per point: ``kl`` (nats), ``top1_agreement``, ``median_rank`` (as ``LogitLens.summary``)."""
        n = int(self.sums["n"])
        k = (n - 1) // 2  # torch.median's order statistic
        cum = self.sums["rank_hist"].cpu().cumsum(-1)
        median = [float(torch.searchsorted(c, torch.tensor(k), right=True)) for c in cum]
        return pd.DataFrame({"point": range(cum.shape[0]), "kl": self.mean("kl").numpy(),
                             "top1_agreement": self.mean("top1").numpy(), "median_rank": median})


class CompositionStats(Accumulator):
    """Q/K/V composition scores: weights only, computed once (nothing to accumulate)."""

    name = "composition"

    def update(self, trace, first_row: int = 0) -> None:
        """Nothing per batch: composition does not depend on the data."""

    def result(self):
        """``Composition`` of the scanned model."""
        return composition(self.model)


STATS: dict[str, type[Accumulator]] = {
    cls.name: cls for cls in (GrowthStats, SurvivalStats, ReadAttributionStats, SubspaceStats,
                              LensStats, CompositionStats)
}


def make_accumulators(stats) -> dict[str, Accumulator]:
    """Accumulators for the statistic names in ``stats`` (see ``STATS``)."""
    names = [stats] if isinstance(stats, str) else list(stats)
    unknown = [s for s in names if s not in STATS]
    if unknown or not names:
        raise InputError(f"unknown statistics {unknown or names}: choose from {sorted(STATS)}")
    return {name: STATS[name]() for name in dict.fromkeys(names)}


def frames(result) -> dict[str, pd.DataFrame]:
    """A statistic's result as named data frames (for JSON and CSV output)."""
    if isinstance(result, pd.DataFrame):
        return {"summary": result}
    out = {"values": result.to_frame()}
    for extra in ("massive", "norm_inputs"):
        if isinstance(getattr(result, extra, None), pd.DataFrame):
            out[extra] = getattr(result, extra)
    return out


def _json_ready(frame: pd.DataFrame) -> list[dict]:
    clean = frame.replace({np.nan: None})
    return clean.to_dict("records")
