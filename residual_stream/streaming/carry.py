"""The contribution buffer of ``flow.FlowSums``: its dtype and the products that read it.

**The buffer's dtype.** In a 16-bit model whose program only adds writes to the stream
before its last block (no stream norm, no scale, no write through a norm: Llama, Qwen,
SmolLM2, GPT-2, parallel blocks), every slot holds a module's output as the model computed
it, a 16-bit value that nothing rescales, so the buffer keeps it in the model's dtype: half
the memory, the same numbers. Every product upcasts it in ``UPCAST_CHUNKS`` token chunks;
the running sum ``total`` stays float32. Each stored write's round trip is checked on the
device, and ``FlowSums.into`` warns (once per model) if one was not a value of that dtype.
Otherwise the buffer is float32.
"""

from __future__ import annotations

import torch
from torch import Tensor

from ..decomposition import count_pieces
from ..fusion import fused
from ..program import Add, Mark, Norm, Scale

UPCAST_CHUNKS = 8  # token chunks in which a 16-bit buffer is upcast for a product


def n_sources(program, norms: dict) -> int:
    """How many component-level contributions ``program`` creates (the buffer's depth)."""
    return count_pieces(program, norms, lambda component: 1)


def carry_dtype(model) -> torch.dtype:
    """The buffer's dtype for ``model`` (module docstring).

    The model's own if it is 16-bit and nothing rescales a carried write before the last
    block, else float32.
    """
    program, n = model.anatomy.program, model.anatomy.n_layers
    last = program.index(Mark(n))
    only_adds = not any(isinstance(op, (Norm, Scale)) or (isinstance(op, Add) and op.via)
                        for op in program[:last])
    dtype = model.dtype
    return dtype if only_adds and dtype in (torch.bfloat16, torch.float16) else torch.float32


def token_sum(values: Tensor, real: Tensor) -> Tensor:
    """Float64 sum of ``values [token, *rest]`` over the tokens ``real`` counts → ``[*rest]``."""
    m = real.reshape(-1, *([1] * (values.ndim - 1)))
    return torch.where(m, values, 0).double().sum(0)


def token_bmm(c: Tensor, y: Tensor) -> Tensor:
    """``bmm(c, y)`` over tokens in ``y``'s dtype.

    A 16-bit ``c [token, n, d]`` is upcast in ``UPCAST_CHUNKS`` token chunks: each a quarter
    of the 16-bit buffer's size in float32, and a fixed number of launches however large the
    batch.
    """
    if c.dtype == y.dtype or len(c) == 0:  # no token (a sampled batch may choose none)
        return torch.bmm(c.to(y.dtype), y)
    step = -(-len(c) // UPCAST_CHUNKS)
    return torch.cat([torch.bmm(c[t: t + step].to(y.dtype), y[t: t + step])
                      for t in range(0, len(c), step)])


def _dots(c: Tensor, x: Tensor) -> Tensor:
    """``<c[t, i], x[t]>`` per token ``t`` and source ``i``, in ``x``'s dtype.

    Written for the compiler: on a GPU one kernel reads the 16-bit buffer once and accumulates
    in float32 (a product over an upcast copy moves three times the bytes).
    """
    return (c.to(x.dtype) * x.unsqueeze(1)).sum(-1)


def _dots_chunked(c: Tensor, x: Tensor) -> Tensor:
    return token_bmm(c, x.unsqueeze(-1)).squeeze(-1)


token_dots = fused(_dots, eager=_dots_chunked)  # eagerly: the chunked product (bounded memory)
