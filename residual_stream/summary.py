"""Headline numbers of every analysis for one model and a few texts (README, CLI, reports).

``summarize`` calls each analysis once and keeps a handful of scalars per measure, with
what each means; ``None`` marks a measure the model cannot have (no LM head).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from . import analyses
from .errors import NotAvailableError
from .inputs import Overflow
from .trace import trace as run_trace

DEFAULT_TEXTS = (
    "The capital of France is Paris, and the capital of Italy is Rome.",
    "def fibonacci(n):\n    return n if n < 2 else fibonacci(n - 1) + fibonacci(n - 2)",
    "Residual streams grow with depth in pre-norm transformers, layer after layer.",
)


def _nan_or(fn):
    try:
        return fn()
    except NotAvailableError:
        return None


def summarize(model, texts: Sequence[str] = DEFAULT_TEXTS, *, overflow: Overflow = "error"
              ) -> dict[str, float | int | str | None]:
    """Headline numbers (see the keys) of every analysis of ``model`` on ``texts``.

    ``overflow``: a text over the context is refused (``"error"``) or split into rows (``"chunk"``),
    as ``rs.trace`` takes it.
    """
    tr = run_trace(model, list(texts), patterns=True, overflow=overflow)
    n = model.anatomy.n_layers
    g = analyses.norm_growth(tr)
    s = analyses.survival(tr)
    ra = analyses.read_attribution(tr).matrix("layer")
    comp = analyses.composition(model)
    mix = analyses.mixing_ratio(tr).summary()
    ab = analyses.ablation_check(tr)
    lens = _nan_or(lambda: analyses.logit_lens(tr).summary())
    last = f"L{n - 1}"
    embeds = [c for c in ra.columns if "embed" in c]
    out: dict[str, float | int | str | None] = {
        "conservation_worst_relative_error": tr.check().worst.relative_error,
        "norm_mean_first_block": float(g.mean[1]),
        "norm_mean_last_block": float(g.mean[n]),
        "norm_fit_growth_per_layer": g.fit_growth,
        "norm_fit_r2": g.fit_r2,
        "first_token_norm_ratio": float((g.first_token[1:] / g.mean[1:]).mean()),
        "massive_activations_token_rule": len(g.massive),  # counts
        "massive_activations_point_rule": len(
            analyses.norm_growth(tr, massive_reference="point").massive),
        "ones_share_mean": float(g.ones_share.mean()),
        "update_attn_median": float(g.update_attn.nanmedian()),
        "update_mlp_median": float(g.update_mlp.nanmedian()) if len(g.update_mlp) else None,
        "embed_retention_at_end": float(s.retention[s.sources.index("embed"), n]),
        "embed_share_at_end": float(s.share[s.sources.index("embed"), n]),
        "last_layer_read_share_from_embeddings": float(ra.loc[last, embeds].sum()),
        "last_layer_read_share_from_previous_layer": float(ra.loc[last, f"L{n - 2}"]) if n > 1 else None,
        "max_k_composition": comp.max_score("k"),
        "k_composition_baseline": comp.baseline["k"],
        "mixing_ratio_norm_res_ln_mean": float(mix.norm_res_ln.mean()),
        "mixing_ratio_weight_res_mean": float(mix.weight_res.mean()),
        "ablation_vs_attribution_spearman": ab.spearman,
        "lens_kl_mid_depth": None if lens is None else float(lens.kl[n // 2]),
        "lens_first_point_top1_over_half": None if lens is None else int(  # a stream point
            next((p for p, a in zip(lens.point, lens.top1_agreement, strict=True) if a >= 0.5), n)),
    }
    heads = analyses.head_scores(model)
    top = heads.top("induction", 1).iloc[0]
    out["induction_top_head"] = f"{top['head']} ({top.induction:.2f})"
    out["previous_token_max"] = float(heads.previous_token.max())
    for key in ("loss_first", "loss_repeat"):  # NaN without a next-token LM head
        value = getattr(heads, key)
        out[f"random_tokens_{key}"] = None if math.isnan(value) else value
    dla = _nan_or(lambda: analyses.direct_logit_attribution(tr).top(1))
    out["dla_top_contributor"] = None if dla is None else str(dla.label[0])
    return out
