"""Conservation: does every part sum back to the stream the model really computed?

Hook names are not trusted (DESIGN §3): ``check_conservation`` tests, on real tokens only,

1. ``hidden_states``: the captured stream against the framework's own
   ``output_hidden_states`` at every block (and the final-norm output at the end: its
   ``last_hidden_state`` where the states end before that norm, CLIP's text model's);
2. ``hook``: a replay of the stream program over the captured writes: each norm's
   captured input must equal the replayed stream (or write) at that point, and each block's
   output the replayed sum, so a hook on the wrong tensor is caught where it sits;
3. ``norm``: each norm module run on its captured input against ``NormSpec.apply``, so a
   wrong kind, ε or Gemma offset is caught;
4. ``decomposition``: ``trace.decompose(L).total()`` against the stream at every point.

Errors are max-abs differences divided by the reference's RMS over real tokens; in a 16-bit
model, RMS differences (below).

A 16-bit model rounds its stream after every addition, and its norms magnify that rounding
(a SmolLM2 coordinate of 3,400 moves in steps of 16 in bfloat16), while a decomposition adds
its contributions in float32. So in 16 bits the stream checks (1–3) go on from the captured
stream at every block and after every norm, and the ``decomposition`` rows, the final one included,
compare against the program run over the captured writes in float32 without those resets
(``walk_stream(reset="none")``): the model's own rounding is then in neither side, and the
rows test what a decomposition claims, that its parts sum to that run. In float32 both are
the model's stream.

One op's rounding is still up to half a unit in the last place of the largest value it
touches, which for an outlier (a massive activation) is many times the stream's RMS: 16-bit
rows are judged by the RMS of the error over the reference's RMS, against twice the dtype's
machine epsilon (``HALF_EPS``). Measured on SmolLM2, MiniLM, the twins and nine tiny
families: at most 0.65 ε in both bfloat16 and float16, while a hook on the wrong tensor
errs by the size of what it confuses (two MLP writes swapped in a tiny Llama: 9 ε in bf16).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import pandas as pd
import torch
from torch import Tensor

from .capture import capture, hidden_states_reference
from .contexts import model_lock
from .decomposition import collect, replay_states
from .errors import ConservationError, InputError
from .program import Add, Mark, Norm, Read
from .walk import component_of, final_stream, walk_stream
from .weights import as_in_out

if TYPE_CHECKING:
    from .trace import Trace

TOLERANCE_F32 = 1e-4  # max-abs error over the reference's RMS, float32 models
HALF_EPS = 2.0        # 16-bit models: RMS error over the reference's RMS, in the dtype's eps


def default_tolerance(dtype: torch.dtype) -> tuple[float, str]:
    """``(tolerance, measure)`` for a model of ``dtype`` (module docstring)."""
    if dtype in (torch.float32, torch.float64):
        return TOLERANCE_F32, "max"
    return HALF_EPS * torch.finfo(dtype).eps, "rms"


@dataclass(frozen=True)
class CheckRow:
    """One comparison: what, against which reference, its error relative to the reference RMS.

    ``measure``: which error is judged, ``"max"`` (largest absolute difference) or ``"rms"``.
    """

    check: str
    point: str
    max_abs_error: float
    reference_rms: float
    rms_error: float = float("nan")
    measure: str = "max"

    @property
    def relative_error(self) -> float:
        """The judged error (``max_abs_error`` or ``rms_error``) over ``reference_rms``."""
        error = self.max_abs_error if self.measure == "max" else self.rms_error
        return error / max(self.reference_rms, 1e-30)


@dataclass(frozen=True, eq=False, repr=False)
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
             "rms_error": r.rms_error, "reference_rms": r.reference_rms, "measure": r.measure,
             "relative_error": r.relative_error, "ok": r.relative_error <= self.tolerance}
            for r in self.rows
        ])

    def raise_if_failed(self) -> None:
        """Raise ``ConservationError`` naming the worst comparison, if any fails."""
        if not self.ok:
            w = self.worst
            raise ConservationError(
                f"conservation fails at {w.check} {w.point}: relative {w.measure} error "
                f"{w.relative_error:.2e} > {self.tolerance:.3g}; this architecture's anatomy "
                "or hooks are wrong: please report it with the model's config")

    def __str__(self) -> str:
        """One line: OK or FAILED, how many checks, the worst and the tolerance."""
        w = self.worst
        status = "OK" if self.ok else "FAILED"
        return (f"conservation {status}: {len(self.rows)} checks, worst {w.check} {w.point} "
                f"relative {w.measure} error {w.relative_error:.2e} (tolerance {self.tolerance:.3g})")

    __repr__ = __str__  # a notebook cell shows the line, not every row (``to_frame`` has them)


class _Recorder:
    def __init__(self, mask: Tensor, measure: str) -> None:
        self.mask, self.measure = mask.bool(), measure
        self.rows: list[CheckRow] = []

    def compare(self, check: str, point: str, actual: Tensor, expected: Tensor) -> None:
        a = actual.float()[self.mask.to(actual.device)]
        e = expected.float()[self.mask.to(expected.device)].to(a.device)
        self.rows.append(CheckRow(check, point, float((a - e).abs().max()),
                                  float(e.pow(2).mean().sqrt()), float((a - e).pow(2).mean().sqrt()),
                                  self.measure))


def check_conservation(trace: Trace, *, tolerance: float | None = None) -> ConservationReport:
    """Run every conservation comparison on ``trace`` (see the module docstring)."""
    model, anatomy = trace.model, trace.anatomy
    default, measure = default_tolerance(model.dtype)
    tolerance = default if tolerance is None else tolerance
    if isinstance(tolerance, bool) or not isinstance(tolerance, (int, float)) or not 0 < tolerance < 1:
        raise InputError(f"tolerance is a relative error in (0, 1), e.g. 1e-4, not {tolerance!r} "
                         f"(None: {default:g} for {model.dtype})")
    tokens = trace.tokens.to(model.device)
    mask = trace.attention_mask.to(model.device)
    verified = bool(trace.captured.attn_out)  # traced with verify=True already
    cap = trace.captured if verified else capture(model.module, anatomy, tokens, mask, verify=True)
    rec = _Recorder(trace.attention_mask, measure)
    n = anatomy.n_layers
    before = anatomy.states_before_final_norm  # (CLIP's text model: its last state is not normed)
    refs = hidden_states_reference(model.module, tokens, mask, n, last=before)
    for L in range(n + before):
        rec.compare("hidden_states", f"resid_pre {L}", cap.resid[L], refs[L])
    wide = model.dtype in (torch.float32, torch.float64)
    final = trace.decompose("final").total()
    last = "final" if "ln_final" in anatomy.norms else f"resid_pre {n}"
    out = anatomy.modules.unembed_in  # OPT-350m returns it through project_out: the row says so
    rec.compare("hidden_states", last if out is None else f"{last} @ {out.rsplit('.', 1)[-1]}", _as_returned(
        trace, final if wide else final_stream(walk_stream(trace, cap))), refs[-1])
    _replay_hooks(trace, cap, rec)
    for name, spec in anatomy.norms.items():
        if spec.constant:  # a multiplier has no module; the hidden states check it
            continue
        module = model.module.get_submodule(spec.module_path)
        with torch.inference_mode(), model_lock(model.module):  # not inside another's hooked pass
            expected = module(cap.norm_in[name].to(model.dtype))
        rec.compare("norm", name, spec.apply(cap.norm_in[name]), expected)
    run = {} if wide else {s.op.point: s.x for s in walk_stream(trace, cap, reset="none")
                           if isinstance(s.op, Mark)}  # 16 bits: the writes' own float32 run
    for op, pieces in replay_states(anatomy.program, trace.sources()):  # one pass, every point
        if isinstance(op, Mark) and op.point != "final":
            rec.compare("decomposition", f"resid_pre {op.point}",
                        collect(pieces, op.point, trace.attention_mask).total(),
                        trace.stream(op.point) if wide else run[op.point])
    if not wide:
        rec.compare("decomposition", last, final, run["final"])
    return ConservationReport(tuple(rec.rows), tolerance)


def _as_returned(trace: Trace, x: Tensor) -> Tensor:
    """The final stream as the framework returns its last hidden state.

    Through ``unembed_in`` where the model has one (OPT-350m's ``project_out``, applied before
    the hidden states are returned); the stream itself otherwise.
    """
    path = trace.anatomy.modules.unembed_in
    return x if path is None else x @ as_in_out(trace.model.module.get_submodule(path), native=True).to(x)


def _replay_hooks(trace: Trace, cap, rec: _Recorder) -> None:
    """Walk the stream program over captured writes, comparing at every hooked point.

    Each comparison is local: the walk goes on from the captured stream at every block and
    after every whole-stream norm (``reset="norms"``), so a wrong hook shows where it sits
    and a 16-bit model's rounding is never carried into the next comparison.
    """
    norms = trace.anatomy.norms
    for step in walk_stream(trace, cap, reset="norms"):
        op = step.op
        if isinstance(op, (Read, Norm)) and op.norm is not None and not norms[op.norm].constant:
            rec.compare("hook", f"{op.norm} input", step.x, cap.norm_in[op.norm])
        elif isinstance(op, Add):
            layer, kind = component_of(op.component)
            if kind == "attn" and cap.attn_out:
                rec.compare("hook", f"{op.component} heads sum", step.write, cap.attn_out[layer])
            if op.via is not None and not norms[op.via].constant:  # (a multiplier has no module)
                rec.compare("hook", f"{op.via} input", step.write, cap.norm_in[op.via])
        elif isinstance(op, Mark) and op.point != "final":
            rec.compare("hook", f"resid_pre {op.point}", step.x, cap.resid[op.point])
