"""The published claims about normalization, as experiments on twins.

Each function returns a frozen result with ``to_frame()`` and ``figure()``:

1. ``forward_norms_at_init``: Xiong et al. 2020, Lemma 2 (post-LN keeps the input to each
   LayerNorm at a constant scale; the pre-LN stream grows linearly with depth).
2. ``gradient_norms_at_init``: Xiong et al. 2020, Theorem 1 (the last layer's FFN gradient
   shrinks as layers are added in pre-LN, not in post-LN; across one model's layers pre-LN's
   fall more steeply towards the output than post-LN's). At these sizes post-LN's do not
   rise towards the output as in the paper's Fig. 3; they fall less.
3. ``warmup_sensitivity``: short trainings of post-LN and pre-LN, with and without warm-up,
   at two learning rates.
4. ``deepnorm_update``: Wang et al. 2022: the model update ``‖F(x, θ_t) − F(x, θ_0)‖`` over
   the first steps for a deep post-LN model against DeepNorm; ``deepnorm_constants`` gives α, β.
5. ``layernorm_vs_rmsnorm``: the invariances of both norms, checked numerically, and their
   speed (eager and ``torch.compile``; CPU, and GPU when there is one). Reported, not asserted.
"""

from .deepnorm import DeepNormUpdate, deepnorm_constants, deepnorm_update
from .init import ForwardNorms, GradientNorms, forward_norms_at_init, gradient_norms_at_init
from .norms import NormComparison, layernorm_vs_rmsnorm
from .warmup import WarmupSensitivity, warmup_sensitivity

__all__ = [
    "DeepNormUpdate", "ForwardNorms", "GradientNorms", "NormComparison", "WarmupSensitivity",
    "deepnorm_constants", "deepnorm_update", "forward_norms_at_init", "gradient_norms_at_init",
    "layernorm_vs_rmsnorm", "warmup_sensitivity",
]
