"""Capture: run a model once with forward hooks that keep only what the analyses need.

Hooked (paths from the ``Anatomy``): the input of every block and the output of the last
(the stream), each embedding's output, the input of each attention output projection
(``z``, from which per-head writes ``z_h @ W_O[h]`` follow), each MLP's write, and the
input of every norm, reduced inside the hook to its per-token scale. With ``verify=True``
the full norm inputs and projection outputs are kept too, so ``Trace.check`` can test each
hook against the replayed stream instead of trusting its name.

Hooks are attached inside a context manager and removed even when the forward pass raises;
the model's own parameters, buffers and settings are never touched.
"""

from __future__ import annotations

import functools
import inspect
from collections import defaultdict
from collections.abc import Callable, Collection, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field, fields

import torch
from jaxtyping import Float, Int
from torch import Tensor, nn

from .anatomy import Anatomy
from .contexts import eager_attention, edited, model_lock, untouched
from .errors import NotAvailableError
from .hookio import by_token, first_input, first_output, with_first_input
from .program import Add, Norm, Read, Scale


@dataclass
class Captured:
    """Raw float32 tensors recorded by one forward pass (all ``[batch, pos, ...]``)."""

    resid: dict[int, Tensor] = field(default_factory=dict)
    embeds: dict[str, Tensor] = field(default_factory=dict)
    z: dict[int, Tensor] = field(default_factory=dict)
    mlp_out: dict[int, Tensor] = field(default_factory=dict)
    norm_scale: dict[str, Tensor] = field(default_factory=dict)
    norm_in: dict[str, Tensor] = field(default_factory=dict)
    attn_out: dict[int, Tensor] = field(default_factory=dict)
    logits: Tensor | None = None
    patterns: tuple[Tensor, ...] | None = None  # per layer [batch, head, query, key]

    def rows(self, rows: slice) -> Captured:
        """``rows`` of every tensor (views): one copy's own capture, from a pass over stacked copies."""
        parts = {f.name: {key: t[rows] for key, t in getattr(self, f.name).items()}
                 for f in fields(self) if isinstance(getattr(self, f.name), dict)}
        return Captured(**parts, logits=None if self.logits is None else self.logits[rows],
                        patterns=None if self.patterns is None else tuple(p[rows] for p in self.patterns))


@contextmanager
def hooked(
    model: nn.Module, anatomy: Anatomy, out: Captured, shape: torch.Size, *, verify: bool,
    home: torch.device | None = None, heads: bool = True, dtype: torch.dtype | None = torch.float32,
    scales: Collection[str] | None = None,
) -> Iterator[None]:
    """Attach the capture hooks for ``anatomy`` to ``model``; remove them on exit, always.

    ``shape`` is the ``(batch, pos)`` of the input; outputs that broadcast over the batch
    (learned position embeddings, ``[pos, d_model]`` or ``[1, pos, d_model]``) are expanded to it.
    ``scales``: the norms whose scale to keep (None: every norm).
    """
    handles: list[torch.utils.hooks.RemovableHandle] = []
    with model_lock(model):  # one pass's hooks at a time (``model_lock``)
        try:
            for name, norm in anatomy.norms.items():  # a multiplier's scale is 1, before any hook
                if norm.constant and (scales is None or name in scales or verify):
                    out.norm_scale[name] = torch.ones(shape, device=home or norm.weight.device)
            named = dict(model.named_modules())  # one walk; get_submodule per hook costs ~4x more
            for path, fn, is_pre in _hook_plan(anatomy, out, shape, verify, home, heads, dtype, scales):
                module = named[path] if path in named else model.get_submodule(path)
                handles.append(module.register_forward_pre_hook(fn, with_kwargs=True) if is_pre
                               else module.register_forward_hook(fn))
            yield
        finally:
            for h in handles:
                h.remove()


def _hook_plan(anatomy: Anatomy, out: Captured, shape: torch.Size, verify: bool,
               home: torch.device | None = None, heads: bool = True,
               dtype: torch.dtype | None = torch.float32,
               scales: Collection[str] | None = None) -> list[tuple]:
    """``(module path, hook function, is_pre_hook)`` for everything ``out`` should receive.

    Every tensor is kept as ``dtype`` (float32; None: the model's own, no copy) on ``home``
    (default: where it was computed), so a model split over devices yields a trace on one
    device. Norm scales are float32 whatever ``dtype``. ``heads=False`` keeps each attention's
    output whole (``attn_out``) instead of the per-head ``z`` (cheaper, for statistics that
    need no per-head writes). ``scales`` names the norms whose scale is kept (None: all; a
    lean pass computes only those its walk and reducers read).
    """
    m = anatomy.modules

    def keep(t: Tensor) -> Tensor:
        return by_token(t.detach().to(home or t.device, dtype or t.dtype), shape, expand=True)

    def store_output(store: dict, key: object, in_place: bool = False):
        def hook(mod, args, y):
            y = first_output(y)
            kept = keep(y)  # a copy where the block will add to the output in place (Falcon)
            store[key] = kept.clone() if in_place and kept.data_ptr() == y.data_ptr() else kept
        return hook

    def store_input(store: dict, key: object):
        return lambda mod, args, kwargs: store.__setitem__(key, keep(first_input(args, kwargs)))

    plan = [(path, store_output(out.embeds, label), False) for label, path in m.embeds.items()]
    plan += [(path, store_input(out.resid, L), True) for L, path in enumerate(m.layers)]
    plan.append((m.layers[-1], store_output(out.resid, len(m.layers)), False))
    if heads:
        plan += [(path, store_input(out.z, L), True) for L, path in enumerate(m.attn_out)]
    if verify or not heads:
        plan += [(path, store_output(out.attn_out, L), False) for L, path in enumerate(m.attn_out)]
    plan += [(path, store_input(out.mlp_out, L), True) if m.mlp_out_input else  # (Gemma 4's experts)
             (path, store_output(out.mlp_out, L, m.mlp_out_in_place), False)
             for L, path in enumerate(m.mlp_out)]
    by_path: dict[str, list[str]] = defaultdict(list)
    for name, path in m.norms.items():
        by_path[path].append(name)  # one module may serve several roles (a shared norm)
    wanted = {n for n in m.norms if scales is None or n in scales or verify}
    for path, names in by_path.items():
        calls = [[n for n in call if n in wanted] for call in norm_calls(anatomy, names)]
        if any(calls):
            plan.append((path, _norm_hook(anatomy, calls, out, verify, keep), True))
    return plan


def norm_calls(anatomy: Anatomy, names: list[str]) -> list[list[str]]:
    """The calls one norm module serving the roles ``names`` gets in a pass, in order.

    Roles reading one stream state share a call (GPT-J's ``ln_1``, read by attention and MLP);
    roles at different points take a call each (nanochat's one norm module, run on the
    embeddings and again on the final stream).
    """
    if len(names) == 1:  # a module of its own (most): one call
        return [list(names)]
    at = _norm_states(anatomy)
    return [[n for n in names if at.get(n, -1) == s] for s in sorted(set(at.get(n, -1) for n in names))]


@functools.lru_cache(maxsize=32)  # per anatomy (hashed by identity), not per pass
def _norm_states(anatomy: Anatomy) -> dict[str, int]:
    """Each norm role's stream state: how many changes of the stream come before its first use."""
    state, at = 0, {}
    for op in anatomy.program:
        role = op.norm if isinstance(op, (Read, Norm)) else op.via if isinstance(op, Add) else None
        if role is not None:
            at.setdefault(role, state)
        state += isinstance(op, (Add, Norm, Scale))
    return at


def _norm_hook(anatomy: Anatomy, calls: list[list[str]], out: Captured, verify: bool, keep):
    count = [0]

    def hook(mod, args, kwargs):
        names = calls[count[0] % len(calls)]  # this call's roles (the module's calls in turn)
        count[0] += 1
        if not names:  # a call whose roles this pass does not keep
            return
        x = first_input(args, kwargs).detach()
        kept = keep(x) if verify else None  # the full input only when verifying
        scale = keep(anatomy.norms[names[0]].scale(x)[..., None])[..., 0]  # one call: one scale,
        for name in names:  # whatever roles it serves (GPT-J's ln_1 read by attention and MLP)
            out.norm_scale[name] = scale
            if verify:
                out.norm_in[name] = kept
    return hook


def capture(
    model: nn.Module,
    anatomy: Anatomy,
    tokens: Int[Tensor, "batch pos"],
    attention_mask: Int[Tensor, "batch pos"] | None,
    *,
    verify: bool = False,
    patterns: bool = False,
    edits: Sequence[tuple] = (),
    heads: bool = True,
    logits: bool | str = True,
    out: Captured | None = None,
    dtype: torch.dtype | None = torch.float32,
    scales: Collection[str] | None = None,
) -> Captured:
    """Run ``model`` on ``tokens`` under ``torch.inference_mode`` and return what was captured.

    ``patterns=True`` also records attention patterns, running a Hugging Face model with eager
    attention for this one call (its implementation is restored afterwards). ``edits`` are
    ``(module path, forward hook)`` interventions (a hook returning a value replaces the
    module's output), or ``(module path, pre-hook, True)`` (one replacing its input, as
    ``contexts.edited`` takes them); they are attached for this call only. ``heads=False`` keeps attention
    outputs whole instead of per-head ``z``; ``logits=False`` drops the logits and
    ``logits="native"`` keeps them in the model's dtype (no float32 copy of a ``[tokens,
    vocab]`` tensor, which in bf16 outweighs the forward pass's own peak); with
    ``logits=False`` a model whose forward takes ``logits_to_keep`` (Hugging Face causal LMs,
    the twins) unembeds only the last position, skipping a ``[tokens, d_model] @ [d_model,
    vocab]`` product that nothing reads; ``out`` is
    the ``Captured`` to fill (a streaming consumer can pass one that reduces and evicts);
    ``dtype=None`` keeps the hooked tensors in the model's dtype (a lean pass whose reducers
    widen them themselves) instead of float32 copies; ``scales`` names the norms whose
    per-token scale is kept (None: every norm's).
    """
    if patterns and anatomy.patterns_note:
        raise NotAvailableError(f"no attention patterns for this model: {anatomy.patterns_note}; everything "
                                "else (trace without patterns=True) is computed as the model computes it")
    out = Captured() if out is None else out
    kwargs = _forward_kwargs(model, tokens, attention_mask, headless=not logits)
    if patterns:
        kwargs["output_attentions"] = True
    with torch.inference_mode(), untouched(model, hooks=patterns), eager_attention(model, patterns), \
            edited(model, edits, tokens.shape), hooked(model, anatomy, out, tokens.shape, verify=verify,
                                         home=tokens.device, heads=heads, dtype=dtype,
                                         scales=scales):
        result = model(**kwargs)
    if patterns:
        out.patterns = tuple(a.detach().to(tokens.device, torch.float32) for a in result.attentions)
    if anatomy.has_lm_head and logits:
        raw = _logits_of(result)
        kept = None if raw is None or logits == "native" else torch.float32
        out.logits = None if raw is None else raw.to(tokens.device, kept)
    return out


def _logits_of(result) -> Tensor | None:
    """The logits a forward pass returned (an output object's ``logits``, or the tensor itself)."""
    raw = getattr(result, "logits", result)
    return raw.detach() if isinstance(raw, Tensor) else None


def _forward_kwargs(model: nn.Module, tokens: Tensor, attention_mask: Tensor | None, *,
                    headless: bool) -> dict:
    """The keyword arguments of a forward pass; ``headless``: the last position's logits only.

    ``logits_to_keep=1`` where the forward takes it (Hugging Face causal LMs, the twins):
    no ``[tokens, d_model] @ [d_model, vocab]`` product that nothing reads. No router logits
    (mixture-of-experts models), whatever the config says: their auxiliary loss reads every
    call of a router, and a patched pass calls one again on a copy's rows.
    ``attention_mask=None``: every position is real, and the model is given no mask (what a
    replayed pass of a batch without padding passes, ``StaticBatch.dense``).
    """
    kwargs: dict[str, object] = {"input_ids": tokens}
    if attention_mask is not None:
        kwargs["attention_mask"] = attention_mask
    accepts = inspect.signature(model.forward).parameters
    if "use_cache" in accepts:
        kwargs["use_cache"] = False
    if "output_router_logits" in accepts:
        kwargs["output_router_logits"] = False
    if headless and "logits_to_keep" in accepts:
        kwargs["logits_to_keep"] = 1
    return kwargs


def model_logits(model: nn.Module, anatomy: Anatomy, tokens: Int[Tensor, "batch pos"],
                 attention_mask: Int[Tensor, "batch pos"] | None, edits: Sequence[tuple] = (),
                 columns: Tensor | None = None) -> Tensor:
    """The model's own logits ``[batch, pos, d_vocab]`` in its dtype: one forward pass.

    No capture hooks; ``edits`` (as ``edited``'s) are attached for this pass only.
    ``columns``: the positions whose logits are wanted. The unembedding
    (``get_output_embeddings``) then reads only those, and the logits are
    ``[batch, len(columns), d_vocab]``; a model without one returns every position, as
    does one whose unembedding is not called on ``[batch, pos, d_model]``: the caller tells
    them apart by the shape.
    """
    if not anatomy.has_lm_head:
        raise NotAvailableError(anatomy.lm_head_note or "this model has no LM head")
    with torch.inference_mode(), untouched(model, hooks=False), \
            edited(model, [*edits, *_unembedding_at(model, columns, tokens.shape[1])], tokens.shape):
        raw = _logits_of(model(**_forward_kwargs(model, tokens, attention_mask, headless=False)))
    if raw is None:
        raise NotAvailableError(f"{type(model).__name__}'s forward pass returned no logits")
    return raw.to(tokens.device)


def _head_reading(model: nn.Module, reads: Callable[[Tensor], bool],
                  part: Callable[[Tensor], Tensor]) -> list[tuple]:
    """The edit (for ``edited``) that hands the unembedding ``part(x)`` of an input it ``reads``.

    ``x`` is the head's ``[batch, pos, d]`` input; another input (another shape, or ``reads``
    False) goes through unchanged. None of it for a model without ``get_output_embeddings``.
    """
    head = getattr(model, "get_output_embeddings", lambda: None)()
    if head is None:
        return []

    def narrow(module, args, kwargs):
        x = first_input(args, kwargs)
        if x.ndim != 3 or not reads(x):
            return None
        return with_first_input(args, kwargs, part(x))

    return [(head, narrow, True)]


def _unembedding_at(model: nn.Module, columns: Tensor | None, pos: int) -> list[tuple]:
    """The edit (for ``edited``) that has the unembedding read its input at ``columns`` only.

    None of it for ``columns`` None or a model without ``get_output_embeddings``.
    """
    if columns is None:
        return []
    return _head_reading(model, lambda x: x.shape[1] == pos, lambda x: x[:, columns.to(x.device)])


def unembedding_of_tokens(model: nn.Module, index: Tensor, shape: tuple[int, ...],
                          fired: list) -> list[tuple]:
    """The edit (for ``capture``) that has the unembedding read only the tokens ``index`` picks.

    ``index``: places in the flattened ``[batch × pos]`` tokens of ``shape``; the logits are then
    ``[1, len(index), d_vocab]`` (a lens on sampled tokens: ``1/k`` of the ``[tokens, vocab]``
    tensor). ``fired`` gets an entry when the edit applies; a model without
    ``get_output_embeddings``, or whose head reads another shape, unembeds every token and
    ``fired`` stays empty, so the caller tells the two apart.
    """
    def part(x: Tensor) -> Tensor:
        fired.append(True)
        return x.flatten(0, 1).index_select(0, index.to(x.device))[None]

    return _head_reading(model, lambda x: tuple(x.shape[:2]) == tuple(shape), part)


def hidden_states_reference(
    model: nn.Module, tokens: Int[Tensor, "batch pos"], attention_mask: Int[Tensor, "batch pos"],
    n_blocks: int, *, last: bool = False,
) -> tuple[Float[Tensor, "batch pos d_model"], ...]:
    """The framework's own ``output_hidden_states`` for the same inputs (float32), one per block.

    ``n_blocks + 1`` states, and with ``last`` its ``last_hidden_state`` after them (where the
    states end before the final norm: ``Anatomy.states_before_final_norm``). ``transformers``
    records them by hooks on each block module, installed once per path to it; a TransformerLens
    bridge that reaches a block by two paths (BERT's: the block wrapper and its MLP wrapper both
    hold the ``BertLayer``) has every block's output recorded twice, as one tensor: ``2 n + 1``
    states, each odd one the very object after it. Those are read once each.
    """
    with torch.inference_mode(), untouched(model):
        result = model(input_ids=tokens, attention_mask=attention_mask, output_hidden_states=True)
    states = tuple(result.hidden_states)
    if len(states) == 2 * n_blocks + 1 and all(states[i] is states[i + 1]
                                               for i in range(1, len(states), 2)):
        states = states[:1] + states[1::2]
    states += (result.last_hidden_state,) if last else ()
    return tuple(h.detach().to(tokens.device, torch.float32) for h in states)
