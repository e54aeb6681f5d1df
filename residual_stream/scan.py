"""``python -m residual_stream.scan`` (and ``torchrun ... -m residual_stream.scan``): scan a corpus.

The command line lives in ``residual_stream.streaming.cli``; this module is its entry point.
Importing it as ``residual_stream.scan`` would shadow the function ``rs.scan`` with this
module, so the module is made callable: ``rs.scan(...)`` works either way.
"""

from __future__ import annotations

import sys
import types

from .streaming.cli import main
from .streaming.runner import scan


class _CallableModule(types.ModuleType):
    def __call__(self, *args, **kwargs):
        """``rs.scan(...)``, whichever of the function or this module the attribute holds."""
        return scan(*args, **kwargs)


sys.modules[__name__].__class__ = _CallableModule

if __name__ == "__main__":
    sys.exit(main())
