"""Render a report (see ``report``) as one self-contained, well-formed HTML page."""

from __future__ import annotations

import html
import json

import pandas as pd
import plotly.graph_objects as go
from plotly.offline import get_plotlyjs

from .report import METHODS, ModelSection

STYLE = """body{font-family:system-ui,sans-serif;max-width:1200px;margin:auto;padding:1em;color:#222}
h1,h2,h3{font-weight:600} table{border-collapse:collapse;margin:.5em 0}
td,th{border:1px solid #ccc;padding:2px 8px;font-size:13px} .grid{display:grid;
grid-template-columns:1fr 1fr;gap:1em} pre{white-space:pre-wrap;background:#f6f6f6;padding:.5em}"""


def _fig(fig: go.Figure, key: str) -> str:
    return fig.to_html(full_html=False, include_plotlyjs=False, div_id=f"fig-{key}",
                       config={"displaylogo": False})


def _table(frame) -> str:
    return frame.to_html(escape=True, border=0, float_format=lambda v: f"{v:.4g}")


def render(title: str, sections: list[ModelSection], comparisons: dict[str, go.Figure],
           experiments: dict[str, go.Figure], meta: dict, texts: list[str],
           corpus: tuple[dict[str, go.Figure], pd.DataFrame] | None = None) -> str:
    """The whole page. ``title`` and ``texts`` are user input: escaped here.

    ``corpus``: the saved scans' figures and table (``report_scans.scan_section``), a section
    of its own; with no ``sections`` the page holds it alone.
    """
    e = html.escape
    parts = [f"<!DOCTYPE html><html lang='en'><head><meta charset='utf-8'><title>{e(title)}</title>",
             f"<style>{STYLE}</style><script type='text/javascript'>{get_plotlyjs()}</script>",
             f"</head><body><h1>{e(title)}</h1>"]
    if sections:
        parts += _models(sections, comparisons)
    if corpus is not None:
        figures, table = corpus
        parts += ["<h2 id='corpus'>Corpus scale: saved scans</h2>",
                  "<p>Each curve over every token its scan read (rs.scan; saved whole and loaded with "
                  "rs.load_scan).</p>", _table(table)]
        parts += [_fig(fig, key) for key, fig in figures.items()]
    if sections:
        parts += _checks(sections, experiments)
    parts.append("<h2 id='methods'>Methods</h2><dl>")
    parts += [f"<dt><b>{e(k)}</b></dt><dd>{e(v)}</dd>" for k, v in METHODS]
    parts += ["</dl><h2 id='metadata'>Run metadata</h2>", f"<pre>{e(json.dumps(meta, indent=1))}</pre>"]
    if texts:
        parts += [f"<h3>Texts ({len(texts)})</h3><pre>",
                  e("\n".join(texts[:20])) + ("\n…" if len(texts) > 20 else ""), "</pre>"]
    parts.append("</body></html>")
    return "\n".join(parts)


def _models(sections: list[ModelSection], comparisons: dict[str, go.Figure]) -> list[str]:
    """The models' part of the page: anatomy, the comparisons on the texts, reads and composition."""
    e = html.escape
    parts = ["<p>Models: " + ", ".join(f"<b>{e(s.name)}</b>" for s in sections) + "</p>",
             "<h2 id='anatomy'>Anatomy and stream programs</h2><div class='grid'>"]
    for i, s in enumerate(sections):
        parts += [f"<div><h3>{e(s.name)}</h3>", _table(s.tables["anatomy"]),
                  _fig(s.figures["program"], f"program-{i}"), "</div>"]
    parts.append("</div>")
    headings = {"growth": "Norm growth and relative update sizes", "retention": "Survival",
                "unembed": "Write decomposition into subspaces", "mixing": "Mixing ratios",
                "lens": "Logit lens"}
    for key, fig in comparisons.items():
        if key in headings:
            parts.append(f"<h2 id='{key}'>{headings[key]}</h2>")
        parts.append(_fig(fig, key))
    parts.append("<h2 id='reads'>Read attribution and composition</h2><div class='grid'>")
    for i, s in enumerate(sections):
        best = s.numbers["max_k_composition"]
        note = ("No head reads another head's write (one layer)." if best is None else
                f"Max K-composition {best:.3f} (random baseline {s.numbers['k_baseline']:.3f}).")
        figures = _fig(s.figures["reads"], f"reads-{i}") + _fig(s.figures["composition"], f"comp-{i}")
        parts += [f"<div>{figures}<p>{e(note)}</p></div>"]
    parts.append("</div>")
    return parts


def _checks(sections: list[ModelSection], experiments: dict[str, go.Figure]) -> list[str]:
    """The norm-lab experiments (twins) and every model's conservation checks."""
    e = html.escape
    parts = []
    if experiments:
        parts.append("<h2 id='normlab'>Norm-lab experiments</h2>")
        parts += [_fig(f, f"lab-{k}") for k, f in experiments.items()]
    parts.append("<h2 id='conservation'>Conservation checks</h2><div class='grid'>")
    for s in sections:
        parts += [f"<div><h3>{e(s.name)}</h3>", _table(s.tables["conservation"]), "</div>"]
    parts.append("</div>")
    return parts
