"""What a scan returns: ``ScanResult``, each statistic's result over every token scanned.

Made by ``rs.scan`` (``runner``), ``rs.load_scan`` (``saved``) and ``rs.merge_scans`` (``merging``).
Besides the statistics it carries what the scan read and ran with: ``config`` (``state.scan_settings``)
and ``replaced``, the warnings of the corpus's bytes read as U+FFFD (one per file, or per list of
texts), which a scan reading with ``encoding_errors="replace"`` gives (``utf8``), so a notebook, the
app and a saved or merged scan still say which texts held bytes that were not UTF-8.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd

from .accumulators import Accumulator
from .saved import SUFFIX, save_scan
from .state import scan_config


@dataclass
class ScanResult:
    """What a scan measured: ``stats[name]`` is the analysis result over every scanned token."""

    stats: dict[str, object]
    tokens: int
    batches: int
    seconds: float
    model_name: str
    accumulators: dict[str, Accumulator] = field(repr=False, default_factory=dict)
    resumed_tokens: int = 0  # of ``tokens``, those a saved state held when this run began
    config: dict = field(repr=False, default_factory=dict)  # what it ran with (``state.scan_settings``)
    model: Callable[[], object | None] = field(repr=False, compare=False, default=lambda: None)  # a weakref
    _fingerprints: dict = field(repr=False, compare=False, default_factory=dict)  # ``fingerprinted``'s
    replaced: tuple[str, ...] = field(repr=False, default=())  # bytes read as U+FFFD: a warning per file

    def find(self, name: str, where: Callable[[object], bool] = lambda result: True):
        """The result of the first statistic called ``name`` that ``where`` accepts.

        Whatever its options (``growth:top_k=5``); None where the scan took none.
        """
        return next((v for k, v in self.stats.items() if k.split(":")[0] == name and where(v)), None)

    def fingerprinted(self) -> dict:
        """``config`` with the fingerprints of the model's weights and tokenizer, computed once.

        A scan with a ``state`` has them already; another computes them from its model while that
        is alive (SmolLM2 on 2 CPU cores: 0.3 s), as a saved scan and ``merging`` want them, and
        keeps them beside ``config``, which stays as the scan ran.
        """
        model = self.model()
        if "weights" not in self.config and not self._fingerprints and model is not None:
            full = scan_config(model, self.config)
            self._fingerprints = {key: full[key] for key in full.keys() - self.config.keys()}
        return {**self.config, **self._fingerprints}

    @property
    def tokens_per_second(self) -> float:
        """Tokens this run scanned per second (0 when nothing was left to scan)."""
        run = self.tokens - self.resumed_tokens
        return run / self.seconds if self.seconds > 0 and run > 0 else 0.0

    def to_dict(self) -> dict:
        """JSON-ready: metadata, each statistic's token count and its frames as records.

        ``tokens_measured``: the tokens each statistic's means are over (fewer than
        ``tokens`` for one on sampled tokens).
        """
        return {
            "model": self.model_name, "tokens": self.tokens, "batches": self.batches,
            "seconds": self.seconds, "replaced": list(self.replaced),
            "tokens_measured": {name: acc.tokens for name, acc in self.accumulators.items()},
            "stats": {name: {k: _json_ready(f) for k, f in frames(result).items()}
                      for name, result in self.stats.items()},
        }

    def save(self, path: str | Path) -> Path:
        """Write the scan to ``path``, atomically: whole for a ``.pt`` name, else ``to_dict()`` as JSON.

        A ``.pt`` file holds every statistic's sums, and loads back into this result
        (``rs.load_scan``, ``saved``); JSON holds the frames, for any tool.
        """
        path = Path(path)
        if path.suffix == SUFFIX:
            return save_scan(self, path)
        tmp = path.with_name(f".{path.name}.partial")
        try:
            tmp.write_text(json.dumps(self.to_dict(), indent=1), encoding="utf-8")
            os.replace(tmp, path)
        finally:
            tmp.unlink(missing_ok=True)
        return path


def replaced_in(parts: Iterable[Iterable[str]]) -> tuple[str, ...]:
    """Every warning of bytes read as U+FFFD in ``parts`` (processes' or scans' ``replaced``), once, in order.

    Processes read the same files (each tokenizes its own segments of them), and a resumed scan reads
    again those it had read, so one file's warning may come more than once.
    """
    return tuple(dict.fromkeys(w for part in parts for w in part))


def frames(result) -> dict[str, pd.DataFrame]:
    """A statistic's result as named data frames (for JSON and CSV output)."""
    if isinstance(result, pd.DataFrame):
        return {"summary": result}
    out = {"values": result.to_frame()}
    for extra in ("massive", "norm_inputs"):
        if isinstance(getattr(result, extra, None), pd.DataFrame):
            out[extra] = getattr(result, extra)
    return out


def _json_ready(frame: pd.DataFrame) -> list[dict]:
    clean = frame.replace({np.nan: None})
    return clean.to_dict("records")
