"""Skipping the blocks of a patched run that would only compute the clean run again.

A patch at block ``L`` (the stream entering it, a receiver reading there) leaves blocks
``0..L-1`` exactly as in the clean run, whose output at ``L`` the trace already holds. While
``skipping`` is open, those blocks return that state instead of computing it: their
``forward`` is replaced on the instance (``__call__`` still runs, so hooks on a skipped
block, such as the patch on the last block's output, still act), and restored on any exit,
including a ``forward`` that accelerate had set on the instance. For SmolLM2 with a receiver
in block 23 of 30, a patched pass computes 7 blocks instead of 30.

Skipped only where the saved state is the model's own: a float32 or 16-bit model (the trace
keeps float32, which holds a 16-bit state exactly), blocks that return their hidden state as
a tensor (probed once per model), and the first block that runs on the model's own device
(not a model split over devices or offloaded by accelerate, which computes every block).
"""

from __future__ import annotations

import weakref
from collections.abc import Iterator
from contextlib import contextmanager

import torch
from torch import Tensor, nn

from .contexts import model_lock

_RETURNS_TENSOR: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def _returns_tensor(module: nn.Module, first_block: nn.Module, run_probe) -> bool:
    """Whether the model's blocks return their hidden state as a bare tensor.

    Learned from ``first_block`` in one tiny pass (``run_probe``), once per model.
    """
    with model_lock(module):  # no other pass in between to drop the probe's hook
        if module not in _RETURNS_TENSOR:
            seen = []
            handle = first_block.register_forward_hook(lambda m, a, out: seen.append(isinstance(out, Tensor)))
            try:
                run_probe()
            finally:
                handle.remove()
            _RETURNS_TENSOR[module] = bool(seen) and seen[0]
        return _RETURNS_TENSOR[module]


def can_skip(trace) -> bool:
    """Whether a patched run of ``trace``'s model may take blocks' clean outputs from the trace."""
    model = trace.model
    kept = trace.captured.resid[0].dtype
    return model.dtype == kept or model.dtype in (torch.bfloat16, torch.float16)


@contextmanager
def skipping(trace, upto: int, copies: int, run_probe) -> Iterator[None]:
    """Blocks ``0..upto-1`` return the clean stream at point ``upto`` (``copies`` of the batch).

    ``run_probe``: a tiny forward pass of the model, run once per model to learn how its
    blocks return. Does nothing where skipping is not safe (``can_skip``, the probe, a block
    on another device than the model's).
    """
    module, a = trace.model.module, trace.anatomy
    blocks = [module.get_submodule(p) for p in a.modules.layers[:upto]]
    after = module.get_submodule(a.modules.layers[min(upto, a.n_layers - 1)])
    device = next(after.parameters()).device
    if not blocks or device != torch.device(trace.model.device) or not can_skip(trace) or \
            not _returns_tensor(module, blocks[0], run_probe):
        yield
        return
    state = trace.captured.resid[upto].to(device, trace.model.dtype).repeat(copies, 1, 1)
    with model_lock(module):
        # the instance's own dict, written directly: a wrapper's __setattr__ (TransformerLens's
        # BlockBridge) would pass the stub on to the module it wraps
        saved = [(b, b.__dict__.get("forward")) for b in blocks]
        try:
            for b in blocks:
                b.__dict__["forward"] = _stub(state)
            yield
        finally:
            for b, own in saved:
                if own is None:
                    b.__dict__.pop("forward", None)
                else:
                    b.__dict__["forward"] = own


def _stub(state: Tensor):
    """A block's ``forward`` that returns ``state`` whatever it is given."""
    def forward(*args, **kwargs) -> Tensor:
        return state
    return forward
