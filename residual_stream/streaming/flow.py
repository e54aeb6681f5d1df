"""Survival and read attribution over a corpus, carried write by write instead of replayed.

``analyses.flow`` replays the program over every contribution at every operation: exact, and
right for one trace, but each step rebuilds the list of pieces (quadratic in depth). Here the
contributions live in one preallocated buffer ``[token, source, d_model]`` (component
granularity: embeddings, each attention, each MLP, each norm bias) that the walk of the
program updates in place: an ``Embed`` or ``Add`` writes one slot, a stream ``Norm`` maps the
filled slots through its frozen linear part, a ``Scale`` multiplies them. The same reducer is
fed by a finished trace's walk (``lean.feed_trace``) or block by block inside the forward
pass (``lean.lean_pass``).

* The carried tokens (``FlowSums._start``): each statistic measures every real token or,
  with ``every=k`` (``survival:every=16``), about one in ``k`` (``sampling.sampled``). The
  buffer holds the tokens sampled one in ``g``, the greatest common divisor of the
  statistics' rates: samples nest, so every statistic's tokens are among them, and each
  statistic with a coarser rate picks its own out of them (``read_attribution:every=16``
  beside ``subspaces:every=64`` carries one token in 16; ``1/g`` of the memory and of the
  copies). When ``g`` is 1 (a statistic on every token, or rates like 3 and 16) it holds
  every ``(row, position)``, padding included and weighted out.
* At each ``Mark(L)``: per source, the summed norm (recomputed only after a stream norm or a
  scale; pre-norm contributions never change) and the summed signed share ``<c, x>/‖x‖²``,
  one batched matrix product over the tokens.
* At each ``Read``: per reader, the share of every source in what it reads, with the
  reading norm folded into the maps; nothing is materialized per source (``reads``).

Token sums are float64 on the batch's device; nothing is read back until ``into``, so on a
GPU a scan of survival, read attribution and subspaces (with growth or not) replays as a
CUDA graph per batch shape (``streaming.graphs``), the buffer held in that graph's memory
pool: its host side (labels, marks, reads) depends on the program and shape only.

**The buffer's dtype** is the model's own when that is 16-bit and nothing rescales a carried
write (``carry.carry_dtype``); ``into`` warns (once per model) if a stored write was rounded.
"""

from __future__ import annotations

import math
import warnings

import torch
from torch import Tensor

from ..fusion import WIDE, wide
from ..program import Add, Embed, Mark, Norm, Read, Scale
from ..walk import component_of
from .carry import carry_dtype, n_sources, token_dots, token_sum
from .reads import read_shares
from .sampling import TokenChoice
from .subspaces import SUBSPACES, SubspaceSums

SURVIVAL, READ = "survival", "read_attribution"


_WARNED: set[str] = set()  # models whose buffer rounded a write (warned once each)


class FlowSums:
    """One batch's survival, read-attribution and subspace sums; ``step`` in order, then ``into``.

    Each statistic asks for itself (``ask``), on every real token or on about one in
    ``every``; one buffer serves them all. It carries the tokens they measure (``_start``):
    those sampled at the greatest common divisor of their rates (memory and writes ``1/gcd``
    of every token's; every token when it is 1), each statistic picking its own among them.
    Takes a 16-bit model's own writes on a lean pass (``native_dtype``): they go into the
    buffer as they are (a 16-bit buffer then needs no rounding check) or widened.
    """

    native_dtype = True

    def __init__(self, model, mask: Tensor, batch=None) -> None:
        """``batch`` (its texts and positions, ``sampling.sampled``) is needed to sample tokens."""
        self.model, self.norms = model, model.anatomy.norms
        self.mask, self.batch = mask.bool(), batch
        self.wants: dict[str, int] = {}  # statistic → every (1: every real token)
        self.carry: TokenChoice | None = None  # the batch's tokens the buffer holds (``_start``)
        self.tokens: dict[str, TokenChoice] = {}  # per statistic: its tokens among the carried
        self.born_tokens: TokenChoice | None = None  # those each write's norm is summed over
        self.depth = n_sources(model.anatomy.program, self.norms)
        self.buf: Tensor | None = None    # (carried token, source, d_model), ``carry_dtype``
        self.rounding: list[Tensor] = []  # per stored write in a 16-bit buffer: max |rounding|
        self.total: Tensor | None = None  # their running sum: the stream as the replay sees it
        self.labels: list[str] = []
        self.born: list[Tensor] = []        # per source: token sum of its norm when added
        self.norm_sums: list[Tensor] | None = []  # per source now; None after a Norm or Scale
        self.marks: list[tuple[Tensor, Tensor]] = []  # per Mark: (norm sums [n], share sums [n])
        self.reads: list[tuple[list[str], list[str], Tensor, Tensor]] = []
        self.tail = False  # past the last block: nothing reads the contributions any more
        self.block: tuple[int, object] | None = None  # (layer, its LayerWeights): both reads share
        self.subspace_parts: tuple | None = None  # (subspaces, head bases) if subspaces is asked
        self.subspaces = None  # the ``subspaces.SubspaceSums`` fed from the buffer (``_start``)
        self.layout: tuple | None = None  # where read attribution's sums go (``_read_layout``)

    @classmethod
    def shared(cls, shared: dict | None, model, batch) -> FlowSums:
        """The batch's one ``FlowSums`` in ``shared`` (made on first use)."""
        shared = {} if shared is None else shared
        if "flow" not in shared:
            shared["flow"] = cls(model, batch.attention_mask.to(model.device), batch)
        return shared["flow"]

    def ask(self, name: str, every: int = 1) -> None:
        """Compute statistic ``name`` (``SURVIVAL``, ``READ`` or ``SUBSPACES``) on this batch.

        ``every > 1``: on about one real token in ``every`` (``sampling.sampled``). Asked before
        the first write (the carried tokens are fixed then).
        """
        if self.buf is not None:
            raise RuntimeError(f"{name} asked for after the batch's first write")
        self.wants[name] = every

    def _start(self, value: Tensor) -> None:
        """Fix the carried tokens and each statistic's, and allocate the buffer for ``value``."""
        shared = math.gcd(*self.wants.values()) or 1  # every statistic's sample lies within it
        self.carry = TokenChoice.of(self.batch, self.mask, shared)
        for name, k in self.wants.items():  # a choice within the carried tokens
            self.tokens[name] = (self.carry.taken() if k == shared
                                 else TokenChoice.of(self.batch, self.mask, k, among=shared))
        self.born_tokens = self.tokens.get(SURVIVAL, self.carry.taken())  # ``born`` is survival's
        if self.subspace_parts is not None:
            self.subspaces = SubspaceSums(self.model, self.tokens[SUBSPACES], *self.subspace_parts)
        n, d = len(self.carry.real), value.shape[-1]
        self.buf = torch.empty(n, self.depth, d, device=value.device, dtype=carry_dtype(self.model))
        self.total = torch.zeros(n, d, device=value.device)

    # ---- a replayed pass (``streaming.graphs``) -------------------------------------------
    def rebind(self, batch, width: int) -> None:
        """Nothing: no sum names a text or position (padding is masked out)."""

    def overflowed(self) -> bool:
        """Never: nothing here has a fixed-size search."""
        return False

    @property
    def reads_scales(self) -> bool:
        """Whether this reads the reading norms' scales (``lean.scales_read``): read attribution."""
        return READ in self.wants

    # ---- feeding (``lean.lean_pass`` or ``lean.feed_trace``) --------------------------------
    def point(self, point: int, x: Tensor) -> None:
        """Nothing: the ``Mark`` steps carry what survival needs."""

    def step(self, step, scales: dict[str, Tensor]) -> None:
        """One operation of the walk (``walk.Step``)."""
        op = step.op
        if isinstance(op, Embed):
            self._append(op.label, step.write)
        elif isinstance(op, Add):
            if op.via is None:
                self._append(op.component, step.write)
            else:
                spec, take = self.norms[op.via], self.carry.take
                self._store(op.component,
                            spec.apply_linear(take(step.write).float(), take(scales[op.via])))
                self._append_bias(op.via)
        elif isinstance(op, Norm):
            if not self.tail and self.labels:
                spec, scale = self.norms[op.norm], self.carry.take(scales[op.norm])
                spec.apply_linear_(self._filled(), scale.unsqueeze(-1))
                spec.apply_linear_(self.total, scale)
                self.norm_sums = None
            self._append_bias(op.norm)
        elif isinstance(op, Scale) and not self.tail:
            self._filled().mul_(op.alpha)
            self.total.mul_(op.alpha)
            self.norm_sums = None
        elif isinstance(op, Mark) and op.point != "final":
            if SURVIVAL in self.wants:
                self._survival()
            self.tail = op.point == self.model.anatomy.n_layers
        elif isinstance(op, Read):
            self._on_read(op, scales)

    def _on_read(self, op: Read, scales: dict[str, Tensor]) -> None:
        if READ in self.wants:
            self._read(op, scales)
        if self.subspaces is not None:
            self.subspaces.read(op.component, self._filled(), self.labels, self._weights(op.component))

    # ---- the buffer ----------------------------------------------------------------------
    def _filled(self) -> Tensor:
        return self.buf[:, : len(self.labels)]

    def _append(self, label: str, value: Tensor) -> None:
        """Store a write ``value [batch, pos, d_model]``: its carried tokens (``_store``)."""
        if self.buf is None:
            self._start(value)
        self._store(label, self.carry.take(value))

    def _store(self, label: str, value: Tensor) -> None:
        """Store ``value [carried token, d_model]`` in the next slot.

        A 16-bit write goes in as the model made it, anything else as float32.
        """
        if value.dtype in WIDE:  # float64 (a trace of a float64 model) goes in as float32
            value = value.float()
        if not self.tail:
            slot = self.buf[:, len(self.labels)]
            slot.copy_(value)
            if slot.dtype != value.dtype and value.numel():  # float32 in a 16-bit buffer: exact?
                self.rounding.append((slot.float() - value.float()).abs().amax())
            self.total += value
        counted = self.born_tokens
        norms = torch.linalg.vector_norm(counted.pick(value), dim=-1, dtype=torch.float32)
        born = token_sum(norms, counted.real)
        self.labels.append(label)
        self.born.append(born)
        if self.subspaces is not None:
            self.subspaces.added(label, wide(value))
        if self.norm_sums is not None:
            self.norm_sums.append(born)

    def _append_bias(self, norm: str) -> None:
        bias = self.norms[norm].bias
        if bias is not None:
            like = self.total
            self._store(f"{norm}.bias", bias.to(like.device, like.dtype).expand_as(like))

    # ---- the statistics ------------------------------------------------------------------
    def _survival(self) -> None:
        tokens = self.tokens[SURVIVAL]
        c = tokens.pick(self._filled())                                       # (token, n, d)
        if self.norm_sums is None:  # contributions changed since they were added
            norms = torch.linalg.vector_norm(c, dim=-1, dtype=torch.float32)
            self.norm_sums = list(token_sum(norms, tokens.real))
        x = tokens.pick(self.total)
        dots = token_dots(c, x)                                               # (token, n)
        share = dots / x.pow(2).sum(-1).clamp_min(torch.finfo(x.dtype).tiny)[:, None]
        self.marks.append((torch.stack(self.norm_sums), token_sum(share, tokens.real)))

    def _read(self, op: Read, scales: dict[str, Tensor]) -> None:
        """Shares of every source in every linear read of ``op.component`` (``reads``)."""
        spec = None if op.norm is None else self.norms[op.norm]
        pick, real = self.tokens[READ].pick, self.tokens[READ].real  # every token, or a sample
        scale = None if spec is None else pick(self.carry.take(scales[op.norm]))
        shares = read_shares(self.model, op.component, spec, scale, pick(self.total),
                             pick(self._filled()), real, self._weights(op.component))
        self.reads += [(readers, self.labels + names, s, a) for readers, names, s, a in shares]

    def _weights(self, component: str):
        """The reading block's maps, extracted once for its attention and its MLP."""
        layer, _ = component_of(component)
        if self.block is None or self.block[0] != layer:
            self.block = layer, self.model.weights(layer)
        return self.block[1]

    # ---- into the accumulators -----------------------------------------------------------
    def into(self, acc) -> None:
        """Add this batch's sums to ``acc`` (survival, read attribution or subspaces)."""
        self._check_rounding()
        if acc.name == SUBSPACES:
            self.subspaces.into(acc)
            return
        if acc.name == SURVIVAL:
            self._survival_into(acc)
        else:
            self._read_into(acc)
        acc.add("n", self.tokens[acc.name].real.sum())

    def _check_rounding(self) -> None:
        """Warn (once per model) if a write stored in a 16-bit buffer was not a 16-bit value."""
        if not self.rounding or self.model.name in _WARNED:
            return
        worst = float(torch.stack(self.rounding).max())  # kept: a replay refills these tensors
        if worst > 0:
            _WARNED.add(self.model.name)
            warnings.warn(f"{self.model.name}: a write carried in the {self.buf.dtype} buffer was "
                          f"rounded by up to {worst:.3g}; survival, read and subspace sums are "
                          "within that rounding of the float32 analysis", RuntimeWarning,
                          stacklevel=3)

    def _survival_into(self, acc) -> None:
        S, dev = len(self.labels), self.mask.device
        norm = torch.full((S, len(self.marks)), float("nan"), dtype=torch.float64, device=dev)
        share = norm.clone()
        for j, (nm, sh) in enumerate(self.marks):
            norm[: len(nm), j], share[: len(sh), j] = nm, sh
        acc.add("norm", norm)
        acc.add("share", share)
        acc.add("born_norm", torch.stack(self.born))
        acc.meta["sources"] = list(self.labels)

    def _read_layout(self) -> tuple[list[str], list[str], tuple[Tensor, Tensor]]:
        """(readers, sources, (row, column) of every entry of every read's sums, in order).

        Fixed by the program: made once per ``FlowSums`` (so once per shape when replayed).
        """
        if self.layout is None:
            sources = list(dict.fromkeys(s for _, names, _, _ in self.reads for s in names))
            col = {s: i for i, s in enumerate(sources)}
            at, r0 = [], 0
            for readers, names, _, _ in self.reads:
                at += [(r0 + r, col[x]) for r in range(len(readers)) for x in names]
                r0 += len(readers)
            at = torch.tensor(at, dtype=torch.long, device=self.mask.device).reshape(-1, 2)
            self.layout = ([r for readers, _, _, _ in self.reads for r in readers], sources,
                           tuple(at.T))
        return self.layout

    def _read_into(self, acc) -> None:
        readers, sources, at = self._read_layout()
        for key, part in (("share", 2), ("abs_share", 3)):  # one scatter each, not one per read
            table = torch.zeros(len(readers), len(sources), dtype=torch.float64,
                                device=self.mask.device)
            if self.reads:
                table.index_put_(at, torch.cat([r[part].flatten() for r in self.reads]))
            acc.add(key, table)
        acc.meta["readers"] = list(readers)
        acc.meta["sources"] = list(sources)

