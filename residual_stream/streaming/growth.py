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

from ..analyses.growth import MASSIVE_ABS, MASSIVE_REL, NormGrowth, _fit
from ..fusion import acc_dtype, fused, wide
from ..program import Add, Norm
from ..walk import component_of, summed
from .base import Accumulator, histogram_quantile, log_histogram
from .lean import reduce_trace

MIN_CANDIDATES = 256  # tokens per point searched for massive activations on a replayed pass


def _token_sums(values: Tensor, mask: Tensor) -> Tensor:
    """Float64 sums over real tokens of ``values [k, batch, pos]`` → ``[k]``.

    Padding is excluded even where it holds NaN (``where``, not a product), with no sync.
    """
    return torch.where(mask, values, 0).double().sum((1, 2))


@fused
def _point_sums(x: Tensor, mask: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """Per token of ``x [batch, pos, d]``: its norm, coordinate sum and candidacy.

    The candidacy ``tok`` says whether a real token can hold a massive activation: a
    coordinate over ``MASSIVE_ABS`` and a median |x| under its largest over ``MASSIVE_REL``,
    which a count decides without sorting (the lower median is below ``t`` iff more than
    ``(d − 1) // 2`` coordinates are; ``t`` is nudged up by 1e-6 relative, so this is a
    superset of the tokens that hit). A bf16 ``x`` is reduced in float32 (``acc_dtype``).
    """
    acc = acc_dtype(x)
    top = torch.linalg.vector_norm(x, ord=float("inf"), dim=-1, dtype=acc)
    below = (x.abs() < (top * ((1 + 1e-6) / MASSIVE_REL)).unsqueeze(-1)).sum(-1)
    tok = (top > MASSIVE_ABS) & (below > (x.shape[-1] - 1) // 2) & mask
    return torch.linalg.vector_norm(x, dim=-1, dtype=acc), x.sum(-1, dtype=acc), tok


def _first(flags: Tensor, k: int) -> tuple[Tensor, Tensor]:
    """Indices of the first ``k`` true entries of the 1-D ``flags``, in order, and which slots hold one.

    Slots past the number of true entries hold index 0. No device sync, fixed shapes.
    """
    rank = flags.cumsum(0) - 1                                   # rank among the true entries
    slot = torch.where(flags & (rank < k), rank, k)              # the rest go to a spare slot
    out = torch.zeros(k + 1, dtype=torch.long, device=flags.device)
    out.scatter_(0, slot, torch.arange(flags.numel(), device=flags.device))
    return out[:k], torch.arange(k, device=flags.device) < flags.sum()


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

    def __init__(self, mask: Tensor, n_layers: int, d_model: int, str_tokens: list[list[str]],
                 first_row: int, top_k: int, max_candidates: int | None = None) -> None:
        """Empty sums for one batch (``mask [batch, pos]``) of a model with ``n_layers`` blocks.

        ``max_candidates``: search at most this many tokens per point for massive activations,
        with no host sync (what a CUDA graph replays, ``streaming.graphs``); a point with more
        tokens that qualify makes ``overflowed()`` true and the batch must be done again without.
        None: exactly the tokens that qualify (one device sync per point).
        """
        self.mask, self.n_layers, self.d_model, self.top_k = mask.bool(), n_layers, d_model, top_k
        self.max_candidates = max_candidates
        self.str_tokens, self.first_row, self.width = str_tokens, first_row, mask.shape[1]
        self.points: dict[int, tuple[Tensor, Tensor]] = {}  # point → (‖x‖, Σ_i x_i) per token
        self.adds: list[tuple[str, int, Tensor, Tensor]] = []  # kind, layer, ‖added‖, ‖x‖
        self.norms: list[tuple[str, Tensor, Tensor]] = []      # name, ‖input‖, scale per token
        self.massive: list[tuple] = []  # (point, count, flat index, value, median, batch/pos)
        self.qualifying: list[Tensor] = []  # per point, with max_candidates: tokens that qualify

    def rebind(self, str_tokens: list[list[str]], first_row: int, width: int) -> None:
        """Name the batch whose values a replay left in these sums.

        Its token strings, first row and width (positions past it are the replay's padding,
        left out of the per-position sums).
        """
        self.str_tokens, self.first_row, self.width = str_tokens, first_row, width

    def overflowed(self) -> bool:
        """Whether a point had more candidate tokens than ``max_candidates`` (one sync)."""
        if not self.qualifying:
            return False
        return bool((torch.stack(self.qualifying) > self.max_candidates).any())

    def _rest(self) -> Tensor:
        """The tokens the mean counts: each row's first token left out (all, if nothing is left)."""
        rest = self.mask.clone()
        rest[:, 0] = False
        return rest if rest.any() else self.mask

    def point(self, point: int, x: Tensor) -> None:
        """The stream entering block ``point`` (``n_layers``: after the last block).

        Keeps two numbers per token (its norm and its coordinate sum); every sum over tokens
        is taken once per batch in ``into``, for all points together. The per-token
        reductions are one fused function (``_point_sums``: one kernel on a GPU), then the
        massive-activation search over the few tokens that can hold one.
        """
        norm, rowsum, tok = _point_sums(x, self.mask)
        self.points[point] = (norm, rowsum)
        self._massive_candidates(point, x, tok)

    def _massive_candidates(self, point: int, x: Tensor, tok: Tensor) -> None:
        """Coordinates over ``MASSIVE_ABS`` and ``MASSIVE_REL`` × their token's median |x|.

        The median is taken only for the tokens that can hold one (``tok``, from
        ``_point_sums``), in token order: exactly as many as qualify (one device sync to
        count them), or the first ``max_candidates`` (no sync; ``overflowed`` tells if any
        were left out). At most ``top_k`` hits are kept, so the stream itself can be dropped.
        """
        if self.max_candidates is None:
            k = int(tok.sum())
            if k == 0:
                return
        else:
            k = min(self.max_candidates, tok.numel())
            self.qualifying.append(tok.sum())
        flat, valid = _first(tok.flatten(), k)                        # (k,): candidate tokens
        rows = wide(x.flatten(0, -2)[flat])                           # (k, d_model)
        sel = rows.abs()
        med = sel.median(-1, keepdim=True).values
        hit = (sel > MASSIVE_ABS) & (sel > MASSIVE_REL * med) & valid[:, None]
        _, idx = torch.where(hit, sel, 0).flatten().topk(min(self.top_k, hit.numel()))
        d, positions = x.shape[-1], torch.stack((flat // x.shape[1], flat % x.shape[1]), -1)
        self.massive.append((point, hit.sum(), idx, rows.flatten()[idx], med.flatten()[idx // d],
                             positions[idx // d]))

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
        """(how many were found, the top-k as rows); one read back to the host for the batch."""
        if not self.massive:
            return 0, []
        counts = [int(c) for c in torch.stack([m[1] for m in self.massive]).tolist()]
        rows = []
        for (p, _, idx, value, med, pos), n in zip(self.massive, counts, strict=True):
            for i, v, m, (b, t) in zip(idx[:n].tolist(), value[:n].tolist(), med[:n].tolist(),
                                       pos[:n].tolist(), strict=True):  # the n hits lead the top-k
                rows.append({"point": p, "batch": b + self.first_row, "pos": t, "dim": i % self.d_model,
                             "token": self.str_tokens[b][t], "value": v,
                             "ratio_to_median": abs(v) / max(m, 1e-30)})
        return sum(counts), rows

    def into(self, acc: GrowthStats) -> None:
        """Add this batch's sums to ``acc``: every token sum of every point and step at once."""
        rest = self._rest()
        norms = torch.stack([self.points[p][0] for p in range(self.n_layers + 1)])  # (point, b, pos)
        rowsum = torch.stack([self.points[p][1] for p in range(self.n_layers + 1)])
        ones = rowsum.pow(2) / (self.d_model * norms.pow(2).clamp_min(1e-30))
        acc.add("mean", _token_sums(norms, rest))
        acc.add("sumsq", _token_sums(norms.pow(2), rest))
        acc.add("first", norms[:, :, 0].double().sum(-1))
        acc.add("ones_share", _token_sums(ones, self.mask))
        acc.add("per_position", torch.where(self.mask, norms, 0).sum(1)[:, : self.width])
        acc.add("hist", log_histogram(norms.flatten(1), weights=rest.flatten()))
        acc.add("n_rest", rest.sum())
        acc.add("n_rows", self.mask.shape[0])
        acc.add("position_count", self.mask.sum(0)[: self.width])
        acc.add("n", self.mask.sum())
        dev = self.mask.device
        updates = {k: torch.full((self.n_layers,), float("nan"), dtype=torch.float64, device=dev)
                   for k in ("attn", "mlp")}
        if self.adds:
            ratio = (torch.stack([a for _, _, a, _ in self.adds])
                     / torch.stack([x for _, _, _, x in self.adds]).clamp_min(1e-30))
            sums = _token_sums(ratio, self.mask)
            for i, (kind, layer, _, _) in enumerate(self.adds):
                updates[kind][layer] = sums[i]
        for kind, values in updates.items():
            acc.add(f"update_{kind}", values)
        if self.norms:
            acc.add("norm_input", _token_sums(torch.stack([v for _, v, _ in self.norms]), self.mask))
            acc.add("norm_scale", _token_sums(torch.stack([s for _, _, s in self.norms]), self.mask))
        else:
            acc.add("norm_input", torch.zeros(0))
            acc.add("norm_scale", torch.zeros(0))
        acc.meta["norms"] = [name for name, _, _ in self.norms]
        found, rows = self.massive_rows()
        acc.add("massive_found", found)
        acc.keep_massive(rows)


class GrowthStats(Accumulator):
    """Norm growth, update sizes, norm inputs, centering share and massive activations."""

    name = "growth"
    lean = True
    replayable = True

    def __init__(self, top_k: int = 1000) -> None:
        super().__init__()
        self.top_k = top_k

    def sums_for(self, model, batch, first_row: int, shared: dict | None = None,
                 replayable: bool = False) -> GrowthSums:
        """A ``GrowthSums`` for one batch of ``model`` (fill it, then ``into(self)``).

        ``replayable``: never wait for the device (``streaming.graphs``), searching a fixed
        number of candidate tokens per point for massive activations.
        """
        self.meta["model_name"] = model.name
        cap = max(MIN_CANDIDATES, 4 * batch.tokens.shape[0]) if replayable else None
        return GrowthSums(batch.attention_mask.to(model.device), model.anatomy.n_layers,
                          model.anatomy.d_model, batch.str_tokens, first_row, self.top_k, cap)

    def update(self, trace, first_row: int = 0) -> None:
        """Add one batch from a finished trace (``first_row``: the corpus index of its first row)."""
        reduce_trace(self, trace, first_row)

    def keep_massive(self, rows: list[dict]) -> None:
        """Keep the ``top_k`` largest by magnitude of what was kept and ``rows``."""
        kept = list(self.meta.get("massive", [])) + rows
        kept.sort(key=lambda r: (-abs(r["value"]), r["batch"], r["pos"], r["point"], r["dim"]))
        self.meta["massive"] = kept[: self.top_k]

    def merge(self, other: Accumulator) -> None:
        """Add sums; keep the top-k massive activations of both."""
        mine = list(self.meta.get("massive", []))
        super().merge(other)
        self.meta["massive"] = mine
        self.keep_massive(list(other.meta.get("massive", [])))

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
        """Standard deviation of the stream norm per point (population, from the second moment).

        Over the tokens the mean counts (each row's first token left out), in float64 throughout.
        """
        n = self.sums["n_rest"].cpu().double()
        mean = self.sums["mean"].cpu() / n
        return (self.sums["sumsq"].cpu() / n - mean.pow(2)).clamp_min(0).sqrt().float()


