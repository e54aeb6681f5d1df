"""Figure builders: each turns one analysis result into a ``plotly.graph_objects.Figure``.

They compute nothing of their own beyond arranging the result for display. Token labels are
escaped and de-duplicated in one place (``labels.token_labels``), so text like ``<script>``
shows as text.
"""

from .bars import contribution_bars, patching_bars, subspace_bars
from .graph import read_write_graph
from .growth import lens_depth_figure, norm_growth_figure, update_size_figure
from .heatmap import (
    composition_figure,
    heatmap,
    lens_figure,
    patching_figure,
    path_patching_figure,
    survival_figure,
)
from .labels import token_labels
from .program import program_figure

__all__ = [
    "composition_figure", "contribution_bars", "heatmap", "lens_depth_figure", "lens_figure",
    "norm_growth_figure", "patching_bars", "patching_figure", "path_patching_figure", "program_figure",
    "read_write_graph", "subspace_bars", "survival_figure", "token_labels", "update_size_figure",
]
