"""Scans of disjoint corpora merged into one, as if one scan had read them all.

A corpus too large for one job is scanned in parts by separate jobs (a SLURM array, several
machines without a shared process group: ``torchrun`` needs one), each saving its scan whole
(``--out part-3.pt``); ``merge_scans`` adds their accumulators exactly as the processes of one
``torchrun`` scan are merged (``Accumulator.merge``: float64 sums and counts, histograms, top-k
lists), so the merged means are those of one scan over the parts' tokens, up to float64
summation order.

What must agree, else ``InputError`` naming the two scans and what differs:

* the model (name, shape, dtype, and the fingerprints of its weights and tokenizer: a scan
  saved whole holds them, one in memory computes them from its model, ``ScanResult.fingerprinted``;
  only a scan loaded from a file saved before they were kept lacks them), the statistics and
  their options, the row length (``seq_len``);
* each statistic's calibration (``subspaces``' PCA basis, fixed on its scan's first batch): parts
  of different corpora calibrate differently, so ``subspaces`` is merged only where they agree:
  where the parts were scanned with one ``calibration`` (``streaming.calibration``);
* the corpora must differ: a corpus scanned twice would count its tokens twice.

A massive activation names its text by its index in its own scan's corpus (``text``); in a
merged scan a ``scan`` column says which of the scans given it came from.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import torch

from ..errors import InputError
from .base import merged
from .saved import load_scan
from .scan_result import ScanResult, replaced_in
from .specs import make_accumulators

SAME = ("model", "shape", "dtype", "stats", "seq_len")  # settings every part must share
FINGERPRINTS = ("weights", "tokenizer")  # compared where both parts have them
OWN_META = ("massive", "result")  # meta an accumulator merges itself, or the model gives alike


def merge_scans(scans: Sequence) -> object:
    """One ``ScanResult`` over every scan in ``scans`` (``ScanResult``s, or paths of scans saved whole).

    Its tokens, batches and seconds are the parts' sums; its ``config`` the first part's with its
    fingerprints (``fingerprinted``), and ``corpus`` listing every part's corpus (a merged part's
    each). Saved parts are read one at a time, each checked and added before the next is read:
    memory holds the first, the merge, and the sums of the part last added beside the part being
    read, however many there are. The parts are left as they were. See the module docstring for
    what must agree.
    """
    if isinstance(scans, (str, Path)) or not isinstance(scans, Sequence) or not scans:
        raise InputError("merge_scans takes a list of scans (ScanResult or saved .pt paths), at least one")
    first = _part(scans[0], 0)
    totals, corpora, replaced = [0, 0, 0.0, 0], {}, []  # tokens, batches, seconds, resumed; corpus → scan

    def states():  # each part's sums, checked and counted as it comes
        for i, scan in enumerate(scans):
            part = first if i == 0 else _part(scan, i)
            _check_alike(first, part, i)
            _check_corpus(part, i, corpora)
            for k, value in enumerate((part.tokens, part.batches, part.seconds, part.resumed_tokens)):
                totals[k] += value
            replaced.append(part.replaced)
            state = {spec: acc.state_dict() for spec, acc in part.accumulators.items()}
            del part  # gone before the next is read: its sums stay, in ``state``, until added
            yield state

    accs = merged(make_accumulators(list(first.accumulators)), states(), _admit)
    config = {**first.fingerprinted(), "corpus": list(corpora)}
    return ScanResult({spec: acc.result() for spec, acc in accs.items()}, totals[0], totals[1],
                      totals[2], first.model_name, accs, totals[3], config, replaced=replaced_in(replaced))


def _part(scan, i: int):
    """Scan ``i``: a ``ScanResult`` as given, or loaded from its path; ``InputError`` for anything else."""
    part = load_scan(scan) if isinstance(scan, (str, Path)) else scan
    if not isinstance(part, ScanResult):
        raise InputError(f"scan {i} is a {type(part).__name__}: give ScanResults or paths of scans "
                         "saved whole (.pt)")
    return part


def _check_alike(first, part, i: int) -> None:
    """``InputError`` unless scan ``i`` (``part``) can be merged with scan 0 (``first``)."""
    if sorted(part.accumulators) != sorted(first.accumulators):
        raise InputError(f"scans 0 and {i} measured different statistics ({sorted(first.accumulators)}, "
                         f"{sorted(part.accumulators)}): merge scans of the same statistics")
    a, b = first.fingerprinted(), part.fingerprinted()
    if part.model_name != first.model_name:
        raise InputError(f"scans 0 and {i} are of different models ({first.model_name}, "
                         f"{part.model_name}): merge scans of one model")
    for key in SAME + FINGERPRINTS:
        if key in a and key in b and a[key] != b[key]:
            raise InputError(f"scans 0 and {i} differ in {key} ({a[key]}, {b[key]}): merge scans of "
                             "one model with the same statistics and row length")


def _check_corpus(part, i: int, seen: dict) -> None:
    """``InputError`` where scan ``i`` read a corpus that one of ``seen`` (corpus → scan) read.

    A merged scan lists its parts' corpora (``config["corpus"]``), so merging it again with one
    of its parts, or with a merge of one, is refused too. Adds the scan's corpora to ``seen``.
    """
    corpus = part.config.get("corpus")
    for fingerprint in corpus if isinstance(corpus, list) else [corpus]:
        if fingerprint is not None and fingerprint in seen:
            raise InputError(f"scans {seen[fingerprint]} and {i} read the same corpus ({fingerprint}): "
                             "merging would count its tokens twice; merge scans of different parts "
                             "of a corpus")
        seen.setdefault(fingerprint, i)


def _admit(acc, other, spec: str, i: int) -> None:
    """Scan ``i``'s statistic ``spec`` (``other``), checked against the merge so far.

    Its massive activations are marked with ``i``, as copies: the part's own rows stay as they were.
    """
    _check_calibration(acc, other, spec, i)
    if "massive" in other.meta:
        other.meta["massive"] = [{**row, "scan": i} for row in other.meta["massive"]]


def _check_calibration(acc, other, spec: str, i: int) -> None:
    """``InputError`` where scan ``i``'s statistic ``spec`` was calibrated unlike those before it."""
    for key in acc.meta.keys() & other.meta.keys():
        if key in OWN_META:
            continue
        mine, theirs = acc.meta[key], other.meta[key]
        tensors = isinstance(mine, torch.Tensor) and isinstance(theirs, torch.Tensor)
        if not (mine.shape == theirs.shape and torch.equal(mine, theirs) if tensors else mine == theirs):
            raise InputError(f"scans 0 and {i} calibrated {spec!r} differently ({key!r}: fixed on each "
                             f"scan's first batch): scan the parts with one calibration (rs.scan(…, "
                             f"calibration=scan), --calibration scan.pt), leave {spec!r} out of the scans to "
                             "merge, or scan the parts as one corpus (torchrun shares one calibration)")
