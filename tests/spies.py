"""Watching a method without changing what it does (tests only)."""

from __future__ import annotations

from collections.abc import Callable


def watch(monkeypatch, owner, name: str, note: Callable, *, after: bool = False) -> None:
    """Call ``note(self, *args)`` on every call of ``owner.name``, before it runs (or after).

    The method's own result is returned unchanged; ``monkeypatch`` undoes it.
    """
    original = getattr(owner, name)

    def watched(self, *args):
        if not after:
            note(self, *args)
        out = original(self, *args)
        if after:
            note(self, *args)
        return out

    monkeypatch.setattr(owner, name, watched)
