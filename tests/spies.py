"""Watching a method, or a tokenizer, without changing what it does (tests only)."""

from __future__ import annotations

from collections.abc import Callable

import residual_stream as rs


def watch(monkeypatch, owner, name: str, note: Callable, *, after: bool = False) -> None:
    """Call ``note(self, *args, **kwargs)`` on every call of ``owner.name``, before it runs (or after).

    The method's own result is returned unchanged; ``monkeypatch`` undoes it.
    """
    original = getattr(owner, name)

    def watched(self, *args, **kwargs):
        if not after:
            note(self, *args, **kwargs)
        out = original(self, *args, **kwargs)
        if after:
            note(self, *args, **kwargs)
        return out

    monkeypatch.setattr(owner, name, watched)


class Counting:
    """A tokenizer that records every text it is asked to tokenize (``seen``)."""

    def __init__(self, tokenizer) -> None:
        self.tokenizer, self.seen = tokenizer, []

    def __call__(self, texts, **kw):
        self.seen += texts if isinstance(texts, list) else [texts]
        return self.tokenizer(texts, **kw)


def counting_twin():
    """A one-layer twin whose byte tokenizer is ``Counting``."""
    model = rs.twin(norm="rmsnorm", placement="pre", n_layers=1, d_model=16, n_heads=2, n_ctx=32)
    model.tokenizer = Counting(model.tokenizer)
    return model


def segment_inputs(segment) -> list[str]:
    """What the tokenizer is given for a ``corpus.Segment``: its texts, or its part of one."""
    return segment.texts if segment.span is None else [segment.texts[0][slice(*segment.span)]]
