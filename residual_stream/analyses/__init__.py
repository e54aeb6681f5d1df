"""Analyses: pure functions from a trace (or a model) to frozen, labelled results.

Every statistic over tokens ignores padding. Each result has ``to_frame()`` (a long pandas
frame) and a figure builder in ``residual_stream.plotting``.
"""

from .composition import Composition, composition
from .flow import ReadAttribution, Survival, read_attribution, survival
from .growth import NormGrowth, norm_growth
from .lens import DirectLogitAttribution, LogitLens, direct_logit_attribution, logit_lens
from .subspaces import Subspace, WriteSubspaces, write_subspaces

__all__ = [
    "Composition", "DirectLogitAttribution", "LogitLens", "NormGrowth", "ReadAttribution",
    "Subspace", "Survival", "WriteSubspaces", "composition", "direct_logit_attribution",
    "logit_lens", "norm_growth", "read_attribution", "survival", "write_subspaces",
]
