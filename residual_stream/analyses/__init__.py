"""Analyses: pure functions from a trace (or a model) to frozen, labelled results.

Every statistic over tokens ignores padding. Each result has ``to_frame()`` (a long pandas
frame) and a figure builder in ``residual_stream.plotting``.
"""

from .ablation import AblationCheck, ablation_check
from .attribution import WritePatching, attribution_patching, attribution_patching_writes
from .composition import Composition, attention_read_maps, composition
from .flow import ReadAttribution, Survival, read_attribution, survival
from .growth import NormGrowth, norm_growth
from .heads import HeadScores, head_scores
from .lens import DirectLogitAttribution, LogitLens, direct_logit_attribution, logit_lens
from .mixing import MixingRatio, mixing_ratio
from .patching import StreamPatching, patch_stream
from .paths import PathPatching, path_patch
from .subspaces import Subspace, WriteSubspaces, orthogonal_split, write_subspaces

__all__ = [
    "AblationCheck", "Composition", "DirectLogitAttribution", "HeadScores", "LogitLens", "MixingRatio",
    "attention_read_maps", "attribution_patching", "attribution_patching_writes", "head_scores",
    "WritePatching",
    "NormGrowth", "ReadAttribution", "Subspace", "Survival", "WriteSubspaces", "ablation_check",
    "composition", "direct_logit_attribution", "logit_lens", "mixing_ratio", "norm_growth",
    "orthogonal_split", "PathPatching", "path_patch", "patch_stream", "read_attribution", "StreamPatching",
    "survival", "write_subspaces",
]
