"""residual-stream: mechanistic interpretability of the transformer residual stream.

import residual_stream as rs
model = rs.load("smollm2-135m")
trace = rs.trace(model, ["The capital of France is", "Residual streams grow"])
parts = trace.decompose(12)          # exact, labelled sum of contributions
trace.check()                        # conservation against the model's own hidden states
"""

from . import errors
from .anatomy import Anatomy
from .architectures import supported_architectures
from .decomposition import Contributions
from .loading import Model, load
from .registry import list_models
from .trace import Trace, trace

__all__ = [
    "Anatomy", "Contributions", "Model", "Trace", "errors", "list_models", "load",
    "supported_architectures", "trace",
]
__version__ = "0.1.0"
