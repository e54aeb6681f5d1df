"""A report's corpus section: scans saved whole (``rs.load_scan``), overlaid by relative depth.

A scan of a large model over a large corpus runs on a cluster (``--out part.pt``, merged with
``residual-stream merge``); ``residual-stream report --scan a.pt --scan b.pt`` then compares
their geometry without loading a model: mean stream norm and its fitted growth per layer,
relative update sizes, the token embedding's retention and the logit lens's KL, each where the
scan measured it, over every token it read.
"""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import plotly.graph_objects as go

from .report import overlay


def scan_numbers(result) -> dict:
    """What the report shows of one scan (a ``ScanResult``): its size and the curves it measured."""
    numbers = {"model": result.model_name, "tokens": result.tokens, "batches": result.batches,
               "stats": list(result.stats)}
    growth = result.find("growth")
    if growth is not None:
        numbers.update(norm_mean=growth.mean.tolist(), norm_median=growth.median.tolist(),
                       fit_growth_per_layer=growth.fit_growth, fit_r2=growth.fit_r2,
                       update_attn=growth.update_attn.tolist(), update_mlp=growth.update_mlp.tolist())
    survival = result.find("survival", lambda s: "embed" in s.sources)
    if survival is not None:
        numbers["embed_retention"] = survival.retention[survival.sources.index("embed")].tolist()
    lens = result.find("lens")
    if lens is not None:
        numbers["lens_kl"] = lens["kl"].tolist()
    return numbers


def scan_labels(paths: list[Path], results: list) -> list[str]:
    """``model (file)`` for each scan, numbered where that repeats."""
    out = [f"{r.model_name} ({Path(p).stem})" for p, r in zip(paths, results, strict=True)]
    return [f"{x} #{out[:i].count(x) + 1}" if out.count(x) > 1 else x for i, x in enumerate(out)]


def scan_section(scans: dict[str, dict]) -> tuple[dict[str, go.Figure], pd.DataFrame]:
    """``(figures, table)`` of the scans' numbers (``scan_numbers``), keyed by label.

    A figure for each curve some scan measured; the table: model, tokens, batches, statistics
    and the fitted growth per layer.
    """
    curves = {"norm_mean": ("Mean stream norm over each scan's corpus", "‖x‖", True),
              "update_attn": ("Relative update, attention (corpus)", "‖write‖/‖x‖", True),
              "update_mlp": ("Relative update, MLP (corpus)", "‖write‖/‖x‖", True),
              "embed_retention": ("Retention of the token embedding (corpus)",
                                  "norm now / norm when added", False),
              "lens_kl": ("Logit lens over the corpus: KL(final ‖ lens)", "nats", False)}
    figures = {f"scan_{key}": overlay(list(scans.items()), key, title, y, log=log)
               for key, (title, y, log) in curves.items()
               if any(numbers.get(key) is not None for numbers in scans.values())}
    table = pd.DataFrame([{"scan": label, "model": n["model"], "tokens": n["tokens"],
                           "batches": n["batches"], "statistics": ", ".join(n["stats"]),
                           "growth per layer": n.get("fit_growth_per_layer")}
                          for label, n in scans.items()]).set_index("scan")
    return figures, table
