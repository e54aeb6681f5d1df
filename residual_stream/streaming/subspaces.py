"""Subspace energy fractions over a corpus, from the contribution buffer of ``flow.FlowSums``.

``analyses.subspaces.write_subspaces`` replays a trace to get each write as added and as
carried to every later read. The buffer of ``FlowSums`` already holds exactly that, at
component granularity (each attention, each MLP): slot ``i`` is a write as added until a
stream norm or a scale maps it, and at a ``Read`` every filled slot is a write as carried to
that read, before the reading norm. So ``SubspaceSums`` is fed by the buffer's owner:

* ``added(label, value)`` when a write enters the buffer: its token sums of energy fraction
  in each named subspace and in each head's write subspace (``analyses.subspace_measures.write_sums``);
* ``read(component, buffer, labels)`` at each read: the read fraction and strength of every
  write present, against each reader's map (``analyses.subspace_measures.read_sums``, token chunks).

The arithmetic is the analysis's (the same two functions), so a scan reproduces it on one
trace to float summation order, while memory is the buffer plus one bounded product. With
``subspaces:every=k`` both measure about one real token in ``k`` (``sampling``): the buffer
carries the tokens sampled at the greatest common divisor of the rates of the statistics it
serves (``flow.FlowSums``), and the measures pick the chosen ones among them.
"""

from __future__ import annotations

import torch
from torch import Tensor

from ..analyses.subspace_measures import (
    ReadBasis,
    map_steps,
    read_maps,
    read_sums,
    reader_map,
    reader_names,
    write_sums,
)
from ..analyses.subspaces import Subspace
from .sampling import TokenChoice

SUBSPACES = "subspaces"


class ReadPlans:
    """What each read needs that depends on the model alone, made at its first batch, reused.

    Per component: its maps' grouped-query strides (``map_steps``), each reader's map index
    and the maps' bases (``ReadBasis``: one ``eigh`` per scan instead of one per batch); per
    read, which buffer slots hold writes and their rows. A later batch finds them on the
    device: no eigendecomposition, comparison or host-to-device copy, so a CUDA graph can
    capture the reads (``graphs``). Memory, for the scan: the wide maps' bases (an MLP's
    input: ``d_model²`` per layer in the model's dtype; SmolLM2-135M 40 MB in float32) and
    the narrow maps' ``d_head × d_head`` factors in float64 (12 MB).
    """

    def __init__(self, model) -> None:
        self.model = model
        self.maps: dict[str, tuple] = {}   # component → (steps, index, ReadBasis)
        self.slots: dict[tuple, tuple[Tensor, Tensor] | None] = {}  # (component, labels) → slots, rows

    def read(self, comp, weights, device) -> tuple[Tensor, Tensor, ReadBasis]:
        """``comp``'s distinct read maps ``M`` on ``device``, each reader's map index, the bases."""
        if comp.name in self.maps:
            steps, index, basis = self.maps[comp.name]
            w = weights or self.model.weights(comp.layer)
            return read_maps(self.model, comp, w, steps).to(device), index, basis
        steps = map_steps(self.model, comp, weights)
        _, M, index = reader_map(self.model, comp, weights, steps)
        M = M.to(device)
        self.maps[comp.name] = steps, index.to(device), ReadBasis.of(M)
        return M, *self.maps[comp.name][1:]

    def present(self, component: str, labels: list[str], row: dict[str, int], device,
                ) -> tuple[Tensor, Tensor] | None:
        """(buffer slots, write rows) of the writes among ``labels``; None if there are none."""
        key = (component, tuple(labels))
        if key not in self.slots:
            present = [(i, row[lab]) for i, lab in enumerate(labels) if lab in row]
            self.slots[key] = None if not present else tuple(
                torch.tensor(part, device=device) for part in zip(*present, strict=True))
        return self.slots[key]


class SubspaceSums:
    """One batch's subspace sums; fed by ``FlowSums`` (``added``, ``read``), then ``into``."""

    def __init__(self, model, tokens: TokenChoice, subspaces: list[Subspace],
                 head_bases: Tensor, plans: ReadPlans) -> None:
        """``tokens``: the measured tokens among those the buffer carries (``FlowSums.tokens``).

        ``subspaces``, ``head_bases`` (``subspace_measures.head_write_bases``) and ``plans``:
        fixed per scan, on the model's device.
        """
        a = model.anatomy
        self.tokens, self.mask = tokens, tokens.real
        self.model, self.subspaces = model, subspaces
        self.plans = plans
        self.components = {c.name: c for c in a.components}
        self.writes = [c.name for c in a.components]
        self.row = {w: i for i, w in enumerate(self.writes)}
        self.heads = [f"L{L}H{h}" for L in range(a.n_layers) for h in range(a.n_heads)]
        self.readers, self.columns = [], {}  # component → its readers' columns
        for comp in a.components:
            names = reader_names(a, comp)
            self.columns[comp.name] = slice(len(self.readers), len(self.readers) + len(names))
            self.readers += names
        dev, W, R = self.mask.device, len(self.writes), len(self.readers)
        self.head_bases = head_bases.to(dev)
        f64 = dict(dtype=torch.float64, device=dev)
        self.named = torch.full((W, len(subspaces)), float("nan"), **f64)
        self.overlap = torch.full((W, len(self.heads)), float("nan"), **f64)
        self.read_fraction = torch.full((W, R), float("nan"), **f64)
        self.read_strength = torch.full((W, R), float("nan"), **f64)

    def added(self, label: str, value: Tensor) -> None:
        """A buffer slot was filled with ``value [token, d]``; measure it if it is a write."""
        row = self.row.get(label)
        if row is not None:
            named, heads = write_sums(self.tokens.pick(value), self.subspaces, self.head_bases,
                                      self.mask)
            self.named[row], self.overlap[row] = named, heads

    def read(self, component: str, buf: Tensor, labels: list[str], weights=None) -> None:
        """``component`` reads; ``buf [token, slot, d]`` holds ``labels``'s contributions.

        ``weights``: the reading block's ``LayerWeights`` when the caller already has them.
        """
        present = self.plans.present(component, labels, self.row, buf.device)
        if present is None:
            return
        slots, rows = present
        M, index, basis = self.plans.read(self.components[component], weights, buf.device)
        cols = self.columns[component]
        frac, strength = read_sums(self.tokens.pick(buf), M, slots, self.mask, basis)
        self.read_fraction[rows, cols] = frac[:, index]
        self.read_strength[rows, cols] = strength[:, index]

    def into(self, acc) -> None:
        """Add this batch's sums to ``acc`` (a ``SubspaceStats``)."""
        acc.add("named", self.named)
        acc.add("head_overlap", self.overlap)
        acc.add("read_fraction", self.read_fraction)
        acc.add("read_strength", self.read_strength)
        acc.add("n", self.mask.sum())
        acc.meta.update(writes=list(self.writes), subspaces=[s.name for s in self.subspaces],
                        heads=list(self.heads), readers=list(self.readers))
