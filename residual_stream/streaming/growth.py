"""Norm growth over a corpus: the same measures as ``analyses.growth.norm_growth``, as sums.

``GrowthSums`` reduces one batch point by point (the stream at every ``Mark``) and operation
by operation (every step of the program's walk: update sizes at each ``Add``, the sum entering
each stream norm and its scale), keeping everything on the batch's device. It is fed either
from a finished trace (``GrowthStats.update``) or block by block during the forward pass
(``lean.lean_pass``), so the two paths cannot drift apart.
"""

from __future__ import annotations

import pandas as pd
import torch
from torch import Tensor

from ..analyses.growth import NormGrowth, _fit
from ..errors import InputError
from ..fusion import acc_dtype, fused
from ..inputs import Batch
from ..program import Add, Norm
from ..walk import component_of, summed
from .base import Accumulator, cloned, device_constant, histogram_quantile, host_lists, log_histogram
from .lean import reduce_trace
from .massive import first_k, hits, point_sums, stacked

MIN_CANDIDATES = 256  # tokens per point searched for massive activations on a replayed pass


def _token_sums(values: Tensor, mask: Tensor) -> Tensor:
    """Float64 sums over real tokens of ``values [k, batch, pos]`` → ``[k]``.

    Padding is excluded even where it holds NaN (``where``, not a product), with no sync.
    """
    return torch.where(mask, values, 0).double().sum((1, 2))


@fused
def _norms(a: Tensor, *terms: Tensor) -> tuple[Tensor, Tensor]:
    """``‖a‖`` and ``‖terms[0] + terms[1] + …‖`` per token, in float32 at least.

    The sum is ``walk.summed``'s (the walk's stream as ``Step.terms``), made inside the
    reduction: on a GPU one kernel reads the terms and writes two numbers per token.
    """
    x = summed(terms)
    return (torch.linalg.vector_norm(a, dim=-1, dtype=acc_dtype(a)),
            torch.linalg.vector_norm(x, dim=-1, dtype=acc_dtype(x)))


class GrowthSums:
    """One batch's growth sums; ``point`` and ``step`` in program order, then ``into``.

    Takes the model's own bf16 tensors from a lean pass (``native_dtype``) and reduces them
    in float32: the same sums as from float32 copies.
    """

    native_dtype = True

    def __init__(self, mask: Tensor, n_layers: int, d_model: int, batch: Batch, top_k: int,
                 max_candidates: int | None = None) -> None:
        """Empty sums for one batch (``mask [batch, pos]``) of a model with ``n_layers`` blocks.

        ``max_candidates``: search at most this many tokens per point for massive activations,
        with no host sync (what a CUDA graph replays, ``streaming.graphs``); a point with more
        tokens that qualify makes ``overflowed()`` true and the batch must be done again without.
        None: exactly the tokens that qualify (one device sync per point).
        """
        self.mask, self.n_layers, self.d_model, self.top_k = mask.bool(), n_layers, d_model, top_k
        self.max_candidates = max_candidates
        self.batch, self.width = batch, mask.shape[1]  # ``batch`` names the massive hits' tokens
        self.points: dict[int, tuple[Tensor, Tensor]] = {}  # point → (‖x‖, Σ_i x_i) per token
        self.adds: list[tuple[str, int, Tensor, Tensor]] = []  # kind, layer, ‖added‖, ‖x‖
        self.norms: list[tuple[str, Tensor, Tensor]] = []      # name, ‖input‖, scale per token
        self.candidates: list[tuple] = []  # (point, rows, valid, flat token index): not searched yet
        self.massive: list[tuple] = []  # per search: (points, count, dim, value, median, batch, pos)
        self.qualifying: list[Tensor] = []  # per point, with max_candidates: tokens that qualify
        self.fetched: tuple[int, list[dict]] | None = None  # ``massive_rows``, read ahead (``fetch``)

    def rebind(self, batch: Batch, width: int) -> None:
        """Name the batch whose values a replay left in these sums.

        Its rows' texts, starts and token strings, and its width (positions past it are the
        replay's padding, left out of the per-position sums).
        """
        self.batch, self.width = batch, width

    def overflowed(self) -> bool:
        """Whether a point had more candidate tokens than ``max_candidates`` (one sync)."""
        if not self.qualifying:
            return False
        return bool((torch.stack(self.qualifying) > self.max_candidates).any())

    def snapshot(self) -> GrowthSums:
        """These sums with their tensors copied, which the graph's next replay leaves alone.

        A few MB (two numbers per token and point or update, and the massive search's top-k),
        so a replayed scan can run ``into`` on the host while the device replays the next batch.
        """
        return cloned(self)

    def fetch(self) -> None:
        """Read the massive activations back now (``into`` then reads nothing from the device).

        A replayed scan calls it before it queues the next batch's replay, so that ``into``'s
        reads do not wait for that replay; after ``rebind``, which names the rows' tokens.
        """
        self.fetched = self.massive_rows()

    def _rest(self) -> Tensor:
        """The tokens the mean counts: each row's first token left out.

        The analysis counts every token when no row has a second; whether that is so is
        known only over the whole corpus, so the first tokens' sums are kept apart
        (``GrowthStats._counted``).
        """
        rest = self.mask.clone()
        rest[:, 0] = False
        return rest

    def point(self, point: int, x: Tensor) -> None:
        """The stream entering block ``point`` (``n_layers``: after the last block).

        Keeps two numbers per token (its norm and its coordinate sum); every sum over tokens
        is taken once per batch in ``into``, for all points together. The per-token
        reductions are one fused function (``point_sums``: one kernel on a GPU), then the
        massive-activation search over the few tokens that can hold one.
        """
        norm, rowsum, flags, count = point_sums(x, self.mask)
        self.points[point] = (norm, rowsum)
        self._massive_candidates(point, x, flags, count)

    def coordinate_sums(self, point: int) -> Tensor:
        """``Σ_i x_i`` per token of the stream at ``point`` (``lean_forward``'s finiteness check)."""
        return self.points[point][1]

    def _massive_candidates(self, point: int, x: Tensor, flags: Tensor, count: Tensor) -> None:
        """Keep the rows of the ``count`` tokens that can hold a massive activation.

        ``flags`` marks them (``point_sums``). Exactly as many as qualify (one device sync
        to count them), each point searched at once (``_search``), so the stream itself can
        be dropped; or, replayed (``max_candidates``), the first ``max_candidates`` in token
        order with no sync (``overflowed`` tells if any were left out), kept until the last
        point and searched for every point at once: one median sort and one top-k per batch
        instead of one per point, each launch a fixed cost on a GPU.
        """
        if self.max_candidates is None:
            k = int(count)
            if k == 0:
                return
        else:
            k = min(self.max_candidates, flags.numel())
            self.qualifying.append(count)
        flat, valid = first_k(flags.flatten(), count, k)                 # (k,): candidate tokens
        self.candidates.append((point, x.flatten(0, -2)[flat], valid, flat))
        if self.max_candidates is None or point == self.n_layers:
            self._search()

    def _search(self) -> None:
        """Search the kept candidate rows (all the same count) for massive activations."""
        if not self.candidates:
            return
        points, rows, valid, flat = zip(*self.candidates, strict=True)
        self.candidates = []
        count, idx, value, med = hits(stacked(rows), stacked(valid), self.top_k)
        token = stacked(flat).gather(1, idx // self.d_model)              # (point, top_k)
        width = self.mask.shape[1]
        self.massive.append((list(points), count, idx % self.d_model, value, med,
                             token // width, token % width))

    def step(self, step, scales: dict[str, Tensor]) -> None:
        """One operation of the walk: update sizes at ``Add``; inputs and scales of stream norms.

        Keeps per-token norms only; ``into`` reduces them.
        """
        op = step.op
        if isinstance(op, Add):
            layer, kind = component_of(op.component)
            self.adds.append((kind, layer, *_norms(step.added, *step.terms)))
        norm = op.norm if isinstance(op, Norm) else getattr(op, "via", None)
        if norm is not None:
            entering = step.x if isinstance(op, Norm) else step.write
            self.norms.append((norm, torch.linalg.vector_norm(entering, dim=-1, dtype=acc_dtype(entering)),
                               scales[norm]))

    def massive_rows(self) -> tuple[int, list[dict]]:
        """(how many were found, the top-k as rows).

        Per search, the hits' counts are read back, then only the rows of hits (they lead the
        top-k), in one read: most batches have none, and the whole top-k (31 points × 1,000 ×
        6 values for SmolLM2) took the host ~1 ms a batch to read.
        """
        self._search()
        found, rows = 0, []
        for points, count, *tensors in self.massive:
            count = count.tolist()
            found += sum(count)
            k = min(max(count, default=0), tensors[0].shape[1])
            if k == 0:
                continue
            dim, value, med, b, t = host_lists([x[:, :k] for x in tensors])
            for j, p in enumerate(points):
                for i in range(min(count[j], k)):  # the hits lead the top-k
                    row, pos = b[j][i], t[j][i]
                    rows.append({"point": p, "text": self.batch.text_index[row],
                                 "char": self.batch.text_char[row],
                                 "pos": self.batch.text_start[row] + pos, "dim": dim[j][i],
                                 "token": self.batch.str_tokens[row][pos],
                                 "value": value[j][i],
                                 "ratio_to_median": abs(value[j][i]) / max(med[j][i], 1e-30)})
        return found, rows

    def into(self, acc: GrowthStats) -> None:
        """Add this batch's sums to ``acc``: every token sum of every point and step at once."""
        rest = self._rest()
        norms = torch.stack([self.points[p][0] for p in range(self.n_layers + 1)])  # (point, b, pos)
        rowsum = torch.stack([self.points[p][1] for p in range(self.n_layers + 1)])
        ones = rowsum.pow(2) / (self.d_model * norms.pow(2).clamp_min(1e-30))
        acc.add("mean", _token_sums(norms, rest))
        acc.add("sumsq", _token_sums(norms.pow(2), rest))
        first = norms[:, :, 0]                                                     # (point, row)
        acc.add("first", first.double().sum(-1))
        acc.add("first_sq", first.double().pow(2).sum(-1))
        acc.add("first_hist", log_histogram(first))
        acc.add("ones_share", _token_sums(ones, self.mask))
        acc.add("per_position", torch.where(self.mask, norms, 0).sum(1)[:, : self.width])
        acc.add("hist", log_histogram(norms.flatten(1), weights=rest.flatten()))
        acc.add("n_rest", rest.sum())
        acc.add("n_rows", self.mask.shape[0])
        acc.add("position_count", self.mask.sum(0)[: self.width])
        acc.add("n", self.mask.sum())
        dev = self.mask.device
        kinds = ("attn", "mlp")
        updates = torch.full((len(kinds), self.n_layers), float("nan"), dtype=torch.float64,
                             device=dev)
        if self.adds:
            ratio = (torch.stack([a for _, _, a, _ in self.adds])
                     / torch.stack([x for _, _, _, x in self.adds]).clamp_min(1e-30))
            slots = tuple((kinds.index(kind), layer) for kind, layer, _, _ in self.adds)
            where = device_constant(slots, dev)                       # [update, 2], made once
            updates[where[:, 0], where[:, 1]] = _token_sums(ratio, self.mask)  # one scatter
        for kind, values in zip(kinds, updates, strict=True):
            acc.add(f"update_{kind}", values)
        if self.norms:
            acc.add("norm_input", _token_sums(torch.stack([v for _, v, _ in self.norms]), self.mask))
            acc.add("norm_scale", _token_sums(torch.stack([s for _, _, s in self.norms]), self.mask))
        else:
            acc.add("norm_input", torch.zeros(0))
            acc.add("norm_scale", torch.zeros(0))
        acc.meta["norms"] = [name for name, _, _ in self.norms]
        found, rows = self.massive_rows() if self.fetched is None else self.fetched
        self.fetched = None
        acc.add("massive_found", found)
        acc.keep_massive(rows)


class GrowthStats(Accumulator):
    """Norm growth, update sizes, norm inputs, centering share and massive activations."""

    name = "growth"
    lean = True
    replayable = True
    OPTIONS = ("top_k",)

    def __init__(self, top_k: int = 1000) -> None:
        super().__init__()
        if top_k < 0:
            raise InputError(f"growth: top_k (massive activations kept) must be ≥ 0, not {top_k}")
        self.top_k = top_k

    def sums_for(self, model, batch, shared: dict | None = None,
                 replayable: bool = False) -> GrowthSums:
        """A ``GrowthSums`` for one batch of ``model`` (fill it, then ``into(self)``).

        ``replayable``: never wait for the device (``streaming.graphs``), searching a fixed
        number of candidate tokens per point for massive activations.
        """
        self.meta["model_name"] = model.name
        self.meta["norm_kinds"] = {name: spec.kind for name, spec in model.anatomy.norms.items()}
        cap = max(MIN_CANDIDATES, 4 * batch.tokens.shape[0]) if replayable else None
        return GrowthSums(batch.attention_mask.to(model.device), model.anatomy.n_layers,
                          model.anatomy.d_model, batch, self.top_k, cap)

    def update(self, trace) -> None:
        """Add one batch from a finished trace (its rows' texts and starts name the massive hits)."""
        reduce_trace(self, trace)

    def keep_massive(self, rows: list[dict]) -> None:
        """Keep the ``top_k`` largest by magnitude of what was kept and ``rows``.

        Equal magnitudes are ordered by text, character, position, point and dimension. A
        batch hands over its own ``top_k`` per point, so if more than ``top_k`` equal values
        tie at one point of one batch (a small ``top_k``), which of them are kept can depend
        on the batching; the values kept and the count found do not.
        """
        kept = list(self.meta.get("massive", [])) + rows
        kept.sort(key=lambda r: (-abs(r["value"]), r["text"], r["char"], r["pos"], r["point"], r["dim"]))
        self.meta["massive"] = kept[: self.top_k]

    def merge(self, other: Accumulator) -> None:
        """Add sums; keep the top-k massive activations of both."""
        mine = list(self.meta.get("massive", []))
        super().merge(other)
        self.meta["massive"] = mine
        self.keep_massive(list(other.meta.get("massive", [])))

    def result(self) -> NormGrowth:
        """``NormGrowth`` over every token so far (quantiles from the histogram).

        Its ``massive`` rows name each hit by the corpus's ``text`` (its index among the
        corpus's texts, ``Corpus.texts``: blank lines and empty strings are not texts) and
        ``pos`` (the token's position in that text, counted from its character ``char``: 0
        unless the scan cut the text into parts, ``corpus.Segment``), where the
        single-trace analysis names the trace's ``batch`` row and the position in the row.
        """
        total, _, hist, n = self._counted()
        mean = self.mean(total, n)
        per_pos = self.mean("per_position", "position_count")
        rate, r2 = _fit(mean)
        rows = self.meta.get("massive", [])
        merged = ["scan"] if any("scan" in r for r in rows) else []  # which part (``merging``)
        massive = pd.DataFrame(rows, columns=["point", "text", "char", "pos", "dim", "token", "value",
                                              "ratio_to_median", *merged])
        names, kinds = self.meta.get("norms", []), self.meta.get("norm_kinds", {})
        norm_inputs = pd.DataFrame({"norm": names, "kind": [kinds.get(n, "") for n in names],
                                    "input_norm": self.mean("norm_input").numpy(),
                                    "scale": self.mean("norm_scale").numpy()})
        return NormGrowth(
            mean=mean, median=histogram_quantile(self.sums[hist], 0.5),
            p5=histogram_quantile(self.sums[hist], 0.05),
            p95=histogram_quantile(self.sums[hist], 0.95), first_token=self.mean("first", "n_rows"),
            per_position=per_pos, growth=mean[1:] / mean[:-1], fit_rate=rate, fit_r2=r2,
            update_attn=self.mean("update_attn"), update_mlp=self.mean("update_mlp"),
            ones_share=self.mean("ones_share"), norm_inputs=norm_inputs, massive=massive,
            model_name=str(self.meta.get("model_name", "")),
        )

    def std(self) -> Tensor:
        """Standard deviation of the stream norm per point (population, from the second moment).

        Over the tokens the mean counts (each row's first token left out), in float64 throughout.
        """
        total, squares, _, count = self._counted()
        n = self.sums[count].cpu().double()
        mean = self.sums[total].cpu() / n
        return (self.sums[squares].cpu() / n - mean.pow(2)).clamp_min(0).sqrt().float()

    def _counted(self) -> tuple[str, str, str, str]:
        """Names of the sum, sum of squares, histogram and count of the tokens the mean counts.

        Each row's first token is left out, unless no row has a second: then the first tokens.
        """
        if int(self.sums["n_rest"]) > 0:
            return "mean", "sumsq", "hist", "n_rest"
        return "first", "first_sq", "first_hist", "n_rows"


