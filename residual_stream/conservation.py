"""Conservation: does every part sum back to the stream the model really computed?

Hook names are not trusted (DESIGN §3): ``check_conservation`` tests, on real tokens only,

1. ``hidden_states``: the captured stream against the framework's own
   ``output_hidden_states`` at every block (and the final-norm output at the end);
2. ``hook``: a replay of the stream program over the captured writes: each norm's
   captured input must equal the replayed stream (or write) at that point, and each block's
   output the replayed sum, so a hook on the wrong tensor is caught where it sits;
3. ``norm``: each norm module run on its captured input against ``NormSpec.apply``, so a
   wrong kind, ε or Gemma offset is caught;
4. ``decomposition``: ``trace.decompose(L).total()`` against the stream at every point.

Errors are max-abs differences divided by the reference's RMS over real tokens.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import pandas as pd
import torch
from torch import Tensor

from .capture import capture, hidden_states_reference
from .decomposition import collect, replay_states
from .errors import ConservationError
from .program import Add, Mark, Norm, Read
from .walk import component_of, walk_stream

if TYPE_CHECKING:
    from .trace import Trace

TOLERANCE_F32 = 1e-4   # relative to the stream's RMS, float32 models
TOLERANCE_HALF = 3e-2  # bf16 / fp16 models: the framework itself rounds at ~4e-3 per op


@dataclass(frozen=True)
class CheckRow:
    """One comparison: what, against which reference, its error relative to the reference RMS."""

    check: str
    point: str
    max_abs_error: float
    reference_rms: float

    @property
    def relative_error(self) -> float:
        """``max_abs_error / reference_rms``."""
        return self.max_abs_error / max(self.reference_rms, 1e-30)


@dataclass(frozen=True, eq=False)
class ConservationReport:
    """All comparisons of one ``check`` with the tolerance they are judged against."""

    rows: tuple[CheckRow, ...]
    tolerance: float

    @property
    def ok(self) -> bool:
        """True when every relative error is within the tolerance."""
        return all(r.relative_error <= self.tolerance for r in self.rows)

    @property
    def worst(self) -> CheckRow:
        """The comparison with the largest relative error."""
        return max(self.rows, key=lambda r: r.relative_error)

    def to_frame(self) -> pd.DataFrame:
        """One row per comparison, with ``relative_error`` and ``ok``."""
        return pd.DataFrame([
            {"check": r.check, "point": r.point, "max_abs_error": r.max_abs_error,
             "reference_rms": r.reference_rms, "relative_error": r.relative_error,
             "ok": r.relative_error <= self.tolerance}
            for r in self.rows
        ])

    def raise_if_failed(self) -> None:
        """Raise ``ConservationError`` naming the worst comparison, if any fails."""
        if not self.ok:
            w = self.worst
            raise ConservationError(
                f"conservation fails at {w.check} {w.point}: relative error "
                f"{w.relative_error:.2e} > {self.tolerance:.0e}; this architecture's anatomy "
                "or hooks are wrong: please report it with the model's config")

    def __str__(self) -> str:
        w = self.worst
        status = "OK" if self.ok else "FAILED"
        return (f"conservation {status}: {len(self.rows)} checks, worst {w.check} {w.point} "
                f"relative error {w.relative_error:.2e} (tolerance {self.tolerance:.0e})")


class _Recorder:
    def __init__(self, mask: Tensor) -> None:
        self.mask = mask.bool()
        self.rows: list[CheckRow] = []

    def compare(self, check: str, point: str, actual: Tensor, expected: Tensor) -> None:
        a = actual.float()[self.mask.to(actual.device)]
        e = expected.float()[self.mask.to(expected.device)].to(a.device)
        self.rows.append(CheckRow(check, point, float((a - e).abs().max()),
                                  float(e.pow(2).mean().sqrt())))


def check_conservation(trace: Trace, *, tolerance: float | None = None) -> ConservationReport:
    """Run every conservation comparison on ``trace`` (see the module docstring)."""
    model, anatomy = trace.model, trace.anatomy
    if tolerance is None:
        tolerance = TOLERANCE_F32 if model.dtype in (torch.float32, torch.float64) else TOLERANCE_HALF
    tokens = trace.tokens.to(model.device)
    mask = trace.attention_mask.to(model.device)
    verified = bool(trace.captured.attn_out)  # traced with verify=True already
    cap = trace.captured if verified else capture(model.module, anatomy, tokens, mask, verify=True)
    rec = _Recorder(trace.attention_mask)
    refs = hidden_states_reference(model.module, tokens, mask)
    n = anatomy.n_layers
    for L in range(n):
        rec.compare("hidden_states", f"resid_pre {L}", cap.resid[L], refs[L])
    final = trace.decompose("final").total()
    rec.compare("hidden_states", "final" if "ln_final" in anatomy.norms else f"resid_pre {n}",
                final, refs[n])
    _replay_hooks(trace, cap, rec)
    for name, spec in anatomy.norms.items():
        module = model.module.get_submodule(spec.module_path)
        with torch.inference_mode():
            expected = module(cap.norm_in[name].to(model.dtype))
        rec.compare("norm", name, spec.apply(cap.norm_in[name]), expected)
    for op, pieces in replay_states(anatomy.program, trace.sources()):  # one pass, every point
        if isinstance(op, Mark) and op.point != "final":
            rec.compare("decomposition", f"resid_pre {op.point}",
                        collect(pieces, op.point, trace.attention_mask).total(),
                        trace.stream(op.point))
    return ConservationReport(tuple(rec.rows), tolerance)


def _replay_hooks(trace: Trace, cap, rec: _Recorder) -> None:
    """Walk the stream program over captured writes, comparing at every hooked point."""
    for step in walk_stream(trace, cap):
        op = step.op
        if isinstance(op, Read) and op.norm is not None:
            rec.compare("hook", f"{op.norm} input", step.x, cap.norm_in[op.norm])
        elif isinstance(op, Add):
            layer, kind = component_of(op.component)
            if kind == "attn" and cap.attn_out:
                rec.compare("hook", f"{op.component} heads sum", step.write, cap.attn_out[layer])
            if op.via is not None:
                rec.compare("hook", f"{op.via} input", step.write, cap.norm_in[op.via])
        elif isinstance(op, Norm):
            rec.compare("hook", f"{op.norm} input", step.x, cap.norm_in[op.norm])
        elif isinstance(op, Mark) and op.point != "final":
            rec.compare("hook", f"resid_pre {op.point}", step.x, cap.resid[op.point])
