"""residual-stream: mechanistic interpretability of the transformer residual stream.

import residual_stream as rs
model = rs.load("smollm2-135m")
trace = rs.trace(model, ["The capital of France is", "Residual streams grow"])
parts = trace.decompose(12)          # exact, labelled sum of contributions
trace.check()                        # conservation against the model's own hidden states
scan = rs.scan(model, "builtin", stats=["growth", "lens"])   # corpus statistics, streamed
scan.save("scan.pt"); rs.load_scan("scan.pt")                 # whole, without the model
"""

from . import errors
from .analyses import (
    ablation_check,
    attribution_patching,
    attribution_patching_writes,
    composition,
    direct_logit_attribution,
    head_scores,
    logit_lens,
    mixing_ratio,
    norm_growth,
    patch_stream,
    path_patch,
    read_attribution,
    survival,
    write_subspaces,
)
from .anatomy import Anatomy
from .architectures import supported_architectures
from .decomposition import Contributions
from .loading import Model, load
from .registry import list_models
from .streaming import Corpus, load_scan, merge_scans, scan
from .trace import Trace, trace

__all__ = [
    "Anatomy", "Contributions", "Corpus", "Model", "Trace", "ablation_check", "attribution_patching",
    "attribution_patching_writes", "composition", "direct_logit_attribution", "errors", "head_scores",
    "list_models", "load", "load_scan", "logit_lens", "merge_scans",
    "mixing_ratio", "norm_growth", "patch_stream", "path_patch", "read_attribution", "scan",
    "supported_architectures",
    "survival", "trace", "twin", "write_subspaces",
]


def twin(**kwargs):
    """An untrained twin built in code; see ``residual_stream.twins.twin`` for the arguments."""
    from .twins import twin as build

    return build(**kwargs)
__version__ = "0.1.0"
