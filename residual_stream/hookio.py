"""How hooks see a module's tensors: its main input and output, and its tokens as ``[batch, pos, ...]``.

Hugging Face modules take the stream as their first argument or as ``hidden_states=``, and
some return a tuple (GPT-1's blocks: a list) led by their output. A few models flatten their
tokens to ``[batch·pos, features]`` around a sublayer (OPT's MLP and its norm); ``by_token``
views such a tensor as ``[batch, pos, features]``, and ``by_token_hook`` gives an
intervention hook that view, so no analysis has to know which models flatten.
"""

from __future__ import annotations

from collections.abc import Callable

from torch import Tensor


def first_output(x: object) -> Tensor:
    """A module's main output: the first element when it returns a tuple or a list."""
    return x[0] if isinstance(x, (tuple, list)) else x


def first_input(args: tuple, kwargs: dict) -> Tensor:
    """A forward pre-hook's view of a module's main input.

    The first positional argument, or ``hidden_states=`` (how Hugging Face blocks are called).
    """
    return args[0] if args else kwargs["hidden_states"]


def with_first_input(args: tuple, kwargs: dict, x: Tensor) -> tuple[tuple, dict]:
    """What a forward pre-hook returns to replace the module's main input (``first_input``) by ``x``."""
    return ((x, *args[1:]), kwargs) if args else (args, {**kwargs, "hidden_states": x})


def with_first_output(output: object, y: Tensor) -> object:
    """A module's ``output`` (a tensor, or a tuple or list led by one) with ``y`` as its main output."""
    return (y, *output[1:]) if isinstance(output, tuple) else [y, *output[1:]] if isinstance(
        output, list) else y


def by_token(t: Tensor, shape: tuple[int, int], *, expand: bool = False) -> Tensor:
    """``t`` as ``[batch, pos, ...]`` (``shape`` is ``(batch, pos)``), whatever shape it ran with.

    A tensor of flattened tokens ``[batch·pos, features]`` is viewed back (splitting a
    dimension is always a view); ``expand``: one that broadcasts over the batch (learned
    position embeddings, ``[pos, d]`` or ``[1, pos, d]``) is expanded to it. Any other tensor
    is returned as it is.
    """
    if isinstance(t, Tensor) and t.ndim == 2 and t.shape[0] == shape[0] * shape[1]:
        return t.view(*shape, t.shape[-1])
    return t.expand(*shape, t.shape[-1]) if expand and tuple(t.shape[:-1]) != tuple(shape) else t


def by_token_hook(hook: Callable, shape: tuple[int, int], pre: bool) -> Callable:
    """``hook`` (a forward hook, or a pre-hook taking kwargs if ``pre``) seeing ``[batch, pos, ...]``.

    Where the module's main input or output is flattened tokens, the hook gets them viewed as
    ``[batch, pos, features]`` and what it returns is flattened back. The module then goes
    on from the view even when the hook returns nothing, so a tensor the hook keeps is in the
    pass's graph (attribution patching differentiates with respect to it).
    """
    if pre:
        def seeing_pre(module, args, kwargs):
            x = first_input(args, kwargs)
            seen = by_token(x, shape)
            if seen is x:
                return hook(module, args, kwargs)
            args, kwargs = with_first_input(args, kwargs, seen)
            args, kwargs = hook(module, args, kwargs) or (args, kwargs)
            return with_first_input(args, kwargs, first_input(args, kwargs).reshape(x.shape))
        return seeing_pre

    def seeing(module, args, output):
        y = first_output(output)
        seen = by_token(y, shape)
        if seen is y:
            return hook(module, args, output)
        args = (by_token(args[0], shape), *args[1:]) if args else args
        result = hook(module, args, with_first_output(output, seen))
        result = with_first_output(output, seen) if result is None else result
        return with_first_output(result, first_output(result).reshape(y.shape))
    return seeing
