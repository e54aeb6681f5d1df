"""A scan's calibration taken from another scan, so that scans of a corpus's parts merge.

A statistic that ``calibrates`` fixes something from its scan's first batch before it adds
any (``subspaces``: the stream's principal components after the last block, ``pca_basis``), so
that every batch and every ``torchrun`` process measures against one subspace. Separate jobs
(a SLURM array, ``merging``) read different first batches and calibrate differently, and their
energy fractions are of different subspaces: ``merge_scans`` refuses them. ``rs.scan(…,
calibration=first)`` (``--calibration first.pt``) takes each such statistic's calibration from
``first``, a ``ScanResult`` or a scan saved whole, instead of from its own first batch:

    residual-stream scan MODEL part-0.txt --stats subspaces --max-tokens 1024 --out calibration.pt
    residual-stream scan MODEL part-$i.txt --stats growth,subspaces --calibration calibration.pt \
        --out part-$i.pt
    residual-stream merge part-*.pt --out all.pt

(the first line scans one batch of the default 8 × 128 tokens: the batch that fixes the basis.)

What is taken is each calibrating statistic's ``CALIBRATION`` meta, from the statistic of
the same spec in ``first`` (``subspaces:pca_k=8`` from ``subspaces:pca_k=8``), as given: the
model's name and shape are compared, not its weights (``merge_scans`` compares those). Refused with
``InputError``, before the model runs: a source without that statistic, one of another model
name or shape, a calibration that does not fit the model, and a resumed state calibrated
otherwise.
"""

from __future__ import annotations

import io
from pathlib import Path

import torch

from ..errors import InputError


def calibration_source(source, accs: dict):
    """``source`` as a ``ScanResult`` holding every calibrating statistic of ``accs``; no model needed.

    ``source``: a ``ScanResult``, or the path of a scan saved whole (or an open one). What
    ``calibrate`` checks first, and the CLI before it loads the model.
    """
    from .saved import load_scan
    from .scan_result import ScanResult

    wanted = [spec for spec, acc in accs.items() if acc.calibrates]
    if not wanted:
        raise InputError(f"a calibration was given, but none of the statistics {sorted(accs)} "
                         "calibrates (subspaces does): leave the calibration out")
    first = load_scan(source) if isinstance(source, (str, Path, io.IOBase)) else source
    if not isinstance(first, ScanResult):
        raise InputError(f"calibration is a ScanResult or the path of a scan saved whole (.pt), not a "
                         f"value of type {type(first).__name__}")
    for spec in wanted:
        if spec not in first.accumulators:
            raise InputError(f"the calibration scan holds no {spec!r} (it holds "
                             f"{sorted(first.accumulators)}): calibrate with a scan of {spec!r}, the "
                             "same options included")
    return first


def calibrate(model, accs: dict, source) -> None:
    """Fix each calibrating accumulator of ``accs`` from ``source``'s (``calibration_source``).

    An accumulator already calibrated (by a resumed state) must hold the same calibration.
    Nothing is changed where anything is refused; nothing is done for a ``source`` of None.
    """
    if source is None:
        return
    first = calibration_source(source, accs)
    _check_model(model, first)
    fixed = {}
    for spec, acc in accs.items():
        for key in acc.CALIBRATION if acc.calibrates else ():
            value = first.accumulators[spec].meta.get(key)
            acc.check_calibration(model, key, value)
            if key in acc.meta and not _equal(acc.meta[key], value):
                raise InputError(f"the resumed state's {spec!r} was calibrated otherwise ({key!r}): "
                                 "resume it with the calibration it began with, or start a new state")
            fixed[spec, key] = value.clone() if isinstance(value, torch.Tensor) else value
    for (spec, key), value in fixed.items():
        accs[spec].meta[key] = value


def _check_model(model, first) -> None:
    """``InputError`` unless ``first`` was scanned with a model of ``model``'s name and shape."""
    a = model.anatomy
    shape = [a.n_layers, a.d_model, a.n_ctx]
    theirs = first.config.get("shape")
    if first.model_name != model.name or (theirs is not None and list(theirs) != shape):
        raise InputError(f"the calibration scan is of {first.model_name} (shape {theirs}), this scan of "
                         f"{model.name} (shape {shape}): calibrate with a scan of the model scanned")


def _equal(a, b) -> bool:
    """Whether two calibration values are equal (tensors by shape and value)."""
    if isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor):
        return a.shape == b.shape and torch.equal(a.cpu(), b.cpu())
    return a == b
