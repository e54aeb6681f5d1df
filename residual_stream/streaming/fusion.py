"""Fused reductions: a pure tensor function compiled into one kernel on a GPU, eager elsewhere.

A statistic reduces each point of the stream several ways (its norm, coordinate sum, largest
coordinate, a count under a threshold): in eager PyTorch each is its own pass over a
``[batch, pos, d_model]`` tensor and its own kernel launch. ``fused(fn)`` runs ``fn`` through
``torch.compile`` when its first argument is on a CUDA device, so the reductions share one
read of the tensor; on the CPU (and wherever compiling fails, with a warning, once) it runs
``fn`` as written, so the values are defined by the eager code the tests check.
Set ``ENABLED = False`` (or ``RESIDUAL_STREAM_COMPILE=0``) to run eagerly everywhere.
"""

from __future__ import annotations

import functools
import os
import warnings
from collections.abc import Callable

import torch

ENABLED = os.environ.get("RESIDUAL_STREAM_COMPILE", "1") != "0"


def fused(fn: Callable) -> Callable:
    """``fn`` compiled on CUDA inputs (see the module docstring); ``fn`` itself otherwise."""
    state: dict = {"compiled": None, "failed": False}

    @functools.wraps(fn)
    def run(*args):
        if not ENABLED or state["failed"] or args[0].device.type != "cuda":
            return fn(*args)
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
            return fn(*args)

    return run
