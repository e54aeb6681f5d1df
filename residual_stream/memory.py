"""What a trace will hold, counted before the forward pass, and the memory there is for it.

A trace keeps every stream point, every attention's ``z`` and MLP write, every norm's scale
and the logits of every token, in float32: for SmolLM2 about 400 KB a token, half of it the
logits over 49,152 tokens. ``rs.trace`` of a corpus-sized batch would fill the machine and
end in the system's out-of-memory kill; counting first turns that into an error that says
what to do (fewer or shorter texts, or ``rs.scan``, which keeps statistics, not tensors).
``pass_bytes`` estimates what one copy of a batch adds to a patched pass, which sets how
many copies patching stacks by default.
"""

from __future__ import annotations

import psutil
import torch

from .errors import TraceTooLargeError

FLOAT32 = 4  # bytes: every captured tensor is float32
INT64 = 8


def trace_bytes(anatomy, shape: tuple[int, int], *, verify: bool = False, patterns: bool = False,
                heads: bool = True) -> int:
    """The bytes ``capture`` keeps for a batch of ``shape`` ``(batch, pos)``, counted from the anatomy.

    Exactly the tensors of ``Captured``: the stream at every point, each embedding's output,
    each attention's ``z`` (``n_heads × d_head``; with ``heads=False`` its output,
    ``d_model``, instead), each MLP write, a scale per norm and token, the logits (with an LM
    head); with ``verify``, each norm module's input and each attention output; with
    ``patterns``, every layer's ``[batch, head, query, key]`` attention.
    """
    a, m = anatomy, anatomy.modules
    tokens = shape[0] * shape[1]
    per_token = (len(m.layers) + 1 + len(m.embeds) + len(m.mlp_out)) * a.d_model + len(a.norms)
    z = sum(a.n_heads * a.heads_at(L)[0] for L in range(len(m.attn_out))) if heads else 0
    per_token += z + len(m.attn_out) * (a.d_model if verify or not heads else 0)
    per_token += a.d_vocab if a.has_lm_head else 0
    if verify:
        per_token += len(set(m.norms.values())) * a.d_model
    total = tokens * per_token
    if patterns:
        total += a.n_layers * a.n_heads * shape[0] * shape[1] ** 2
    return total * FLOAT32


def pass_bytes(anatomy, shape: tuple[int, int], itemsize: int, logit_positions: int | None = None,
               *, eager: bool = True) -> int:
    """What one copy of the batch adds to a forward pass at its peak, estimated.

    Its logits (at ``logit_positions`` positions per row, default every one) and the largest
    transient tensors of a block: attention scores and probabilities as eager attention
    makes them (``2 × n_heads × pos²`` per row, in at least float32, as its softmax runs: a
    fused kernel needs less, so this is an upper estimate there; ``eager=False`` leaves them
    out), the MLP's hidden activations (three of ``d_mlp``; of an MLP of experts, three for
    each expert a token uses, and the one-hot routing mask, ``experts a token uses × experts``
    int64s per token, that transformers' experts build) and four states of ``d_model`` per
    token, in ``itemsize`` bytes. Stacking many copies of a long text is bounded by the
    attention term, whatever the logits.
    """
    b, p = shape
    used, experts = anatomy.routing or (1, 0)
    per_token = 3 * (anatomy.d_mlp or 0) * used + 4 * anatomy.d_model
    logits = b * (p if logit_positions is None else logit_positions) * anatomy.d_vocab
    attention = 2 * b * anatomy.n_heads * p * p * max(itemsize, FLOAT32) if eager else 0
    return (logits + b * p * per_token) * itemsize + attention + b * p * used * experts * INT64


def available_bytes(device: torch.device) -> int | None:
    """Memory free for new tensors on ``device``.

    The system's available memory for the CPU; for a CUDA device the driver's free memory
    plus what PyTorch's allocator holds cached but unused; None where neither can say (MPS,
    meta).
    """
    if device.type == "cpu":
        return int(psutil.virtual_memory().available)
    if device.type == "cuda":  # the driver's free memory and what PyTorch holds cached, unused
        cached = torch.cuda.memory_reserved(device) - torch.cuda.memory_allocated(device)
        return int(torch.cuda.mem_get_info(device)[0] + cached)
    return None


def check_trace_fits(model, shape: tuple[int, int], *, verify: bool = False, patterns: bool = False) -> None:
    """``TraceTooLargeError`` when a trace of ``shape`` would need more than the memory available.

    Checked before the forward pass, so nothing is run, hooked or kept when it is refused.
    The need is what the trace keeps (``trace_bytes``) and what the pass adds at its peak
    (``pass_bytes``: the logits in the model's dtype while their float32 copy is made, a
    block's largest activations, and the attention scores where the pass runs eager
    attention: with ``patterns``, or a model set to it). An estimate: the allocator's own
    slack, and other processes, can still make a pass that was let through fail.
    """
    a = model.anatomy
    keep = trace_bytes(a, shape, verify=verify, patterns=patterns)
    implementation = getattr(getattr(model.module, "config", None), "_attn_implementation", None)
    eager = patterns or implementation == "eager"
    need = keep + pass_bytes(a, shape, model.dtype.itemsize, eager=eager)
    free = available_bytes(torch.device(model.device))
    if free is None or need <= free:
        return
    tokens = shape[0] * shape[1]
    raise TraceTooLargeError(
        f"tracing {shape[0]} × {shape[1]} tokens would need about {_size(need)}: it keeps "
        f"{_size(keep)} ({_size(keep // tokens)} a token: every stream point, write and norm scale, "
        f"and the logits) and the forward pass adds {_size(need - keep)} at its peak; "
        f"{model.device} has {_size(free)} available: trace fewer or shorter texts at a time (in "
        "rs.scan, a smaller batch_size); for a corpus's statistics, rs.scan streams them without "
        "keeping the tensors")


def _size(n: int) -> str:
    for unit, scale in (("GB", 2**30), ("MB", 2**20), ("KB", 2**10)):
        if n >= scale:
            return f"{n / scale:.1f} {unit}"
    return f"{n} B"
