"""Comparison reports: one self-contained HTML file (plotly inlined) and a JSON of the numbers.

``build_report(models, texts)`` calls the library's analyses on every model and returns the
HTML and the data; the CLI writes them atomically. Everything the user supplies (texts, model
names, file names) is HTML-escaped; figures escape their own labels.
"""

from __future__ import annotations

import platform
import time
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass

import pandas as pd
import plotly
import plotly.graph_objects as go
import torch

from . import analyses, plotting
from .errors import EmptyTextError, NotAvailableError
from .plotting.labels import escape
from .trace import trace as run_trace

METHODS = [
    ("Stream program", "Each architecture as a list of operations on the residual stream (add a "
     "write, normalize the stream, scale it); every decomposition replays it with each norm's "
     "per-token scale frozen, which makes every norm affine and the decomposition exact."),
    ("Norm growth", "L2 norm of the stream entering each block over real tokens (first token "
     "apart); growth factor mean_{L+1}/mean_L; exponential fit log mean = a + rL over points ≥ 1."),
    ("Relative update", "‖write‖ / ‖stream before it‖ per attention and MLP, averaged over tokens."),
    ("Subspace fraction", "‖P_S w‖² / ‖w‖² of a write w in subspace S: the all-ones direction, the "
     "unembedding's top-32 directions with the final norm folded, the stream's top 16 PCs."),
    ("Survival", "Norm of a write's contribution at a later point over its norm when added "
     "(retention); its signed share <c, x>/‖x‖² of the stream (shares sum to 1)."),
    ("Read attribution", "Share <L(c_i) W, y>/‖y‖² of earlier write i in a component's linear read "
     "y (Q, K, V of heads; MLP input), through the frozen norm; mean |share| by layer."),
    ("Mixing ratio", "Kobayashi et al. 2021: ‖context‖/(‖context‖+‖own‖) of the attention block's "
     "output, decomposed exactly through the frozen norms (pre-norm: the analogous ratio)."),
    ("Logit lens", "The final norm (as the model applies it) and unembedding applied at every point; "
     "KL(final ‖ lens) in nats."),
    ("Composition", "Max K-composition ‖W_OV W_QKᵀ‖/(‖W_OV‖‖W_QK‖) into each layer's heads, with the "
     "score of Gaussian matrices of the same shapes as baseline; in a post-norm or DeepNorm model "
     "W_OV is the write as it reaches the reader, through every norm between (its gain; a LayerNorm "
     "centres too)."),
    ("Conservation", "Worst max-abs error / RMS over real tokens of: the captured stream against the "
     "framework's hidden states, every hook against the replayed program, every norm module against "
     "its frozen-affine description, and the decomposition against the stream."),
]


class Leading:
    """The texts of an iterator, read only as far as any iteration goes; each iteration replays them.

    What ``select_texts`` reads of a corpus for several models: each takes the leading texts
    its tokens fit, so a corpus of any size is read only up to the longest of those prefixes
    (and one text past it). It has no length or truth value, which would read it all: whether
    it is empty is ``next(iter(texts), None) is None``.
    """

    def __init__(self, texts: Iterable[str]) -> None:
        self._source, self._read = iter(texts), []

    def __iter__(self) -> Iterator[str]:
        i = 0
        while True:
            if i == len(self._read):
                try:
                    self._read.append(next(self._source))
                except StopIteration:
                    return
            yield self._read[i]
            i += 1

    @property
    def read(self) -> int:
        """How many texts have been read so far."""
        return len(self._read)


def select_texts(model, texts: Iterable[str], max_tokens: int) -> list[str]:
    """The leading texts whose tokens fit in ``max_tokens``.

    At least one: a first text longer than the budget is cut to its longest prefix that fits
    (special tokens included), so the budget holds whatever the corpus.
    """
    kept, used = [], 0
    for t in texts:
        n = _count(model, t)
        if n > max_tokens - used:
            if not kept:
                kept.append(_prefix(model, t, max_tokens))
            break
        kept.append(t)
        used += n
    if not kept:
        raise EmptyTextError("the corpus has no texts: give --text, --corpus or --builtin")
    return kept


def _count(model, text: str) -> int:
    return len(model.tokenizer(text, add_special_tokens=True)["input_ids"])


def _prefix(model, text: str, max_tokens: int) -> str:
    """The longest prefix of ``text`` of at most ``max_tokens`` tokens (at least one character).

    By characters, in a binary search: a few tokenizations of the text, never a decode.
    """
    lo, hi = 1, len(text)  # _count(text[:lo]) fits or lo is 1; text[:hi + 1] does not
    while lo < hi:
        mid = (lo + hi + 1) // 2
        lo, hi = (mid, hi) if _count(model, text[:mid]) <= max_tokens else (lo, mid - 1)
    return text[:lo]


@dataclass
class ModelSection:
    """Everything the report shows for one model."""

    name: str
    numbers: dict
    figures: dict[str, go.Figure]
    tables: dict[str, pd.DataFrame]


def _layer_curve(values, name: str) -> go.Scatter:
    n = len(values)
    return go.Scatter(x=[i / max(n - 1, 1) for i in range(n)], y=list(values), name=escape(name),
                      mode="lines+markers")


def analyse(model, texts: list[str], label: str | None = None) -> ModelSection:
    """All measures of one model on ``texts`` (batched into one trace).

    ``label`` names its section (default: the model's name; ``labels``).
    """
    label = model.name if label is None else label
    tr = run_trace(model, texts, patterns=True, overflow="chunk")
    n, a = model.anatomy.n_layers, model.anatomy
    growth = analyses.norm_growth(tr)
    surv = analyses.survival(tr)
    mix = analyses.mixing_ratio(tr).summary()
    ws = analyses.write_subspaces(tr, readers=False)
    comp = analyses.composition(model)
    reads = analyses.read_attribution(tr).matrix("layer", absolute=True)
    check = tr.check()
    numbers = {
        "tokens": int(tr.attention_mask.sum()), "rows": int(tr.tokens.shape[0]),
        "n_layers": n, "placement": a.placement, "norm": a.norm_kind,
        "norm_mean": growth.mean.tolist(), "fit_growth_per_layer": growth.fit_growth,
        "fit_r2": growth.fit_r2, "update_attn": growth.update_attn.tolist(),
        "update_mlp": growth.update_mlp.tolist(), "ones_share": growth.ones_share.tolist(),
        "embed_retention": surv.retention[surv.sources.index("embed")].tolist(),
        "mixing_norm_res_ln": mix.norm_res_ln.tolist(),
        "subspace_fractions": {s: ws.named[:, i].tolist() for i, s in enumerate(ws.subspaces)},
        "max_k_composition": comp.max_score("k"), "k_baseline": comp.baseline["k"],
        "conservation_worst": check.worst.relative_error, "conservation_ok": check.ok,
    }
    try:
        numbers["lens_kl"] = analyses.logit_lens(tr).summary().kl.tolist()
    except NotAvailableError as e:
        numbers["lens_kl"] = None
        numbers["lens_note"] = str(e)
    figures = {
        "program": plotting.program_figure(a),
        "reads": plotting.heatmap(reads, title=f"Read attribution by layer: {escape(label)}",
                                  x_title="source", y_title="reader", colorbar="mean |share|"),
        "composition": plotting.composition_figure(comp, "k", "layer", name=label),
    }
    tables = {"conservation": check.to_frame().groupby("check").relative_error.max().to_frame(),
              "anatomy": pd.DataFrame([a.summary()])}
    return ModelSection(label, numbers, figures, tables)


def overlay(curves: Sequence[tuple[str, Mapping]], key: str, title: str, y: str,
            log: bool = False) -> go.Figure:
    """One curve per ``(name, numbers)`` of its ``numbers[key]`` (those that have it), by relative depth.

    ``numbers``: a section's (``ModelSection.numbers``) or a saved scan's (``report_scans``).
    """
    fig = go.Figure([_layer_curve(numbers[key], name) for name, numbers in curves
                     if numbers.get(key) is not None])
    fig.update_layout(title=title, xaxis_title="relative depth", yaxis_title=y,
                      yaxis_type="log" if log else "linear")
    return fig


def comparison_figures(sections: list[ModelSection]) -> dict[str, go.Figure]:
    """Figures that overlay every model, aligned by relative depth."""
    named = [(s.name, s.numbers) for s in sections]
    return {
        "growth": overlay(named, "norm_mean", "Mean stream norm", "‖x‖", log=True),
        "update_attn": overlay(named, "update_attn", "Relative update, attention",
                                "‖write‖/‖x‖", log=True),
        "update_mlp": overlay(named, "update_mlp", "Relative update, MLP", "‖write‖/‖x‖", log=True),
        "retention": overlay(named, "embed_retention", "Retention of the token embedding",
                              "norm now / norm when added"),
        "ones": overlay(named, "ones_share", "Share of the stream along the all-ones direction",
                         "fraction of energy"),
        "mixing": overlay(named, "mixing_norm_res_ln", "Context-mixing ratio (norm-based)",
                           "ratio"),
        "unembed": go.Figure([_layer_curve(next(iter(v for k, v in s.numbers["subspace_fractions"].items()
                                                     if k.startswith("unembed")), []), s.name)
                              for s in sections]).update_layout(
            title="Fraction of each write in the unembedding's top directions", yaxis_title="fraction",
            xaxis_title="relative position among writes"),
        "lens": overlay(named, "lens_kl", "Logit lens: KL(final ‖ lens)", "nats"),
    }


def experiment_figures(seed: int) -> dict[str, go.Figure]:
    """The norm-lab experiments at small sizes (for reports on twins)."""
    from . import experiments as ex

    torch.manual_seed(seed)
    return {"forward": ex.forward_norms_at_init(n_layers=16, d_model=64, seed=seed).figure(),
            "gradients": ex.gradient_norms_at_init(n_layers=8, d_model=32, depths=(4, 8, 16),
                                                   seed=seed).figure()}


def metadata(models, texts: list[str], seconds: float, seed: int) -> dict:
    """Versions, device, dtype, seed, token counts, time taken."""
    import transformers

    from . import __version__

    return {"residual_stream": __version__, "torch": torch.__version__,
            "transformers": transformers.__version__, "plotly": plotly.__version__,
            "python": platform.python_version(), "device": str(models[0].device) if models else None,
            "dtypes": sorted({str(m.dtype) for m in models}), "seed": seed, "texts": len(texts),
            "seconds": round(seconds, 2)}


def labels(models) -> list[str]:
    """A distinct label per model; the report's JSON is keyed by these.

    Its name; with its source where names repeat (two folders called ``ckpt``), then a
    number where that repeats too.
    """
    names = [m.name for m in models]
    out = [n if names.count(n) == 1 else f"{n} ({m.source})" for n, m in zip(names, models, strict=True)]
    return [f"{x} #{out[:i].count(x) + 1}" if out.count(x) > 1 else x for i, x in enumerate(out)]


def build_report(models, texts: Iterable[str], *, max_tokens: int = 1024, seed: int = 0,
                 title: str = "Residual-stream geometry", progress=None,
                 scans: dict | None = None) -> tuple[str, dict]:
    """``(html, data)`` comparing ``models`` on ``texts`` (each cut to ``max_tokens`` tokens).

    ``texts``: a list, or any iterable (a corpus's ``texts()``), read only as far as the models'
    budgets reach (``Leading``). ``scans``: saved scans (``rs.load_scan``) by label, compared in
    a corpus section of their own (``report_scans``); with no ``models``, the report is that
    section alone.
    """
    from .report_html import render
    from .report_scans import scan_numbers, scan_section

    numbers = {label: scan_numbers(r) for label, r in (scans or {}).items()}
    corpus = scan_section(numbers) if numbers else None
    start = time.perf_counter()
    torch.manual_seed(seed)
    sections, used, texts = [], [], Leading(texts)
    for m, label in zip(models, labels(models), strict=True):
        if progress:
            progress(f"analysing {label}")
        chosen = select_texts(m, texts, max_tokens)
        used = chosen if len(chosen) > len(used) else used
        sections.append(analyse(m, chosen, label))
    twins = bool(models) and all(m.anatomy.architecture == "rs-twin" for m in models)
    if twins and progress:
        progress("running the norm-lab experiments")
    experiments = experiment_figures(seed) if twins else {}
    meta = metadata(models, used, time.perf_counter() - start, seed)
    meta["tokens"] = {s.name: s.numbers["tokens"] for s in sections}
    if numbers:
        meta["scans"] = {label: {"model": n["model"], "tokens": n["tokens"]} for label, n in numbers.items()}
    comparisons = comparison_figures(sections) if sections else {}
    page = render(title, sections, comparisons, experiments, meta, used, corpus)
    data = {"metadata": meta, "models": {s.name: s.numbers for s in sections}}
    if numbers:
        data["scans"] = numbers
    return page, data
