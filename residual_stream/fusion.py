"""Fused reductions: a pure tensor function compiled into one kernel on a GPU, eager elsewhere.

A statistic reduces each point of the stream several ways (its norm, coordinate sum, largest
coordinate, a count under a threshold): in eager PyTorch each is its own pass over a
``[batch, pos, d_model]`` tensor and its own kernel launch. ``fused(fn)`` runs ``fn`` through
``torch.compile`` when its first argument is on a CUDA device, so the reductions share one
read of the tensor; on the CPU (and wherever compiling fails, with a warning, once) it runs
``fn`` as written, so the values are defined by the eager code the tests check.
Set ``ENABLED = False`` (or ``RESIDUAL_STREAM_COMPILE=0``) to run eagerly everywhere.

``acc_dtype`` and ``wide`` say what a 16-bit tensor is reduced and added in (float32), so a
lean pass can keep the model's own bf16 tensors and widen them inside the fused kernels.
"""

from __future__ import annotations

import functools
import os
import warnings
from collections.abc import Callable

import torch

ENABLED = os.environ.get("RESIDUAL_STREAM_COMPILE", "1") != "0"
WIDE = (torch.float32, torch.float64)


def acc_dtype(t: torch.Tensor) -> torch.dtype:
    """The dtype arithmetic on ``t`` runs in: float64 for float64, float32 for everything else."""
    return torch.float64 if t.dtype == torch.float64 else torch.float32


def wide(t: torch.Tensor) -> torch.Tensor:
    """``t`` itself if it is float32 or float64, else a float32 copy (of a bf16/fp16 tensor)."""
    return t if t.dtype in WIDE else t.float()


def fused(fn: Callable, eager: Callable | None = None) -> Callable:
    """``fn`` compiled on CUDA inputs (see the module docstring); otherwise ``eager`` or ``fn``.

    ``eager``: the same values computed another way where nothing compiles (one that bounds
    its memory by chunks, say, where ``fn`` written for a compiler would materialize).
    """
    state: dict = {"compiled": None, "failed": False}
    plain = fn if eager is None else eager

    @functools.wraps(fn)
    def run(*args):
        if not ENABLED or state["failed"] or args[0].device.type != "cuda":
            return plain(*args)
        if state["compiled"] is None:
            state["compiled"] = torch.compile(fn, fullgraph=True)
        try:
            return state["compiled"](*args)
        except Exception as e:  # noqa: BLE001 - any compiler failure: run eagerly from now on
            if torch.cuda.is_available() and torch.cuda.is_current_stream_capturing():
                raise  # a graph being captured cannot take an eager retry: its caller decides
            state["failed"] = True
            warnings.warn(f"torch.compile failed for {fn.__name__} ({type(e).__name__}: {e}); "
                          "running it eagerly", RuntimeWarning, stacklevel=2)
            return plain(*args)

    run.fused = fn  # what a profiler can count as one kernel (``benchmarks/op_count.py``)
    return run
