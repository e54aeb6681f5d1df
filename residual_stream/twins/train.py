"""Training, evaluating, saving and loading twins. One recipe for every twin.

The recipe (``Recipe``) fixes everything but the norm: data order (a generator seeded with
``seed``), initial weights (same seed), steps, batch, AdamW with linear warm-up then cosine
decay to 10 %, weight decay and gradient clipping. Twins are saved as fp16 safetensors with
a JSON file holding the config, the recipe and the measured losses; the recorded validation
loss is measured *after* the fp16 round trip, so a loaded twin reproduces it.
"""

from __future__ import annotations

import json
import math
import os
import statistics
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

import torch
import torch.nn.functional as F
from safetensors.torch import load_file, save_file
from tqdm.auto import tqdm

from ..errors import CorruptModelFileError, InputError
from ..files import sha256, usual_permissions
from .data import BOS, Mix, repeat_batch, text_batch, train_batch
from .model import TwinConfig, TwinTransformer

EVAL_SEED = 1234


@dataclass(frozen=True)
class Recipe:
    """Everything about training that the twins share."""

    steps: int = 800
    batch: int = 16
    lr: float = 1e-3
    warmup: int = 100
    weight_decay: float = 0.01
    clip: float = 1.0
    seed: int = 0
    mix: Mix = field(default_factory=Mix)

    def __post_init__(self) -> None:
        """Refuse a recipe that cannot train (``InputError``)."""
        if self.steps < 1 or self.batch < 1 or not self.lr > 0 or not 0 <= self.warmup <= self.steps:
            raise InputError(f"training needs steps and batch of at least 1, lr above 0 and "
                             f"warmup of 0 to steps (past them the rate never leaves warm-up), got "
                             f"steps={self.steps}, batch={self.batch}, lr={self.lr}, "
                             f"warmup={self.warmup}")

    def lr_at(self, step: int) -> float:
        """Linear warm-up to ``lr``, then cosine decay to ``lr / 10``."""
        if step < self.warmup:
            return self.lr * (step + 1) / self.warmup
        t = (step - self.warmup) / max(1, self.steps - self.warmup)
        return self.lr * (0.1 + 0.45 * (1 + math.cos(math.pi * t)))


# The recipe the bundled twins were trained with (models/build_twins.py); the CLI's defaults.
TWIN_RECIPE = Recipe(steps=3000, lr=2e-3, warmup=500, mix=Mix(synthetic_fraction=0.5))


@dataclass
class TrainResult:
    """A trained twin and what happened: per-step losses, evaluation, seconds."""

    module: TwinTransformer
    losses: list[float]
    evaluation: dict[str, float]
    seconds: float
    diverged: bool


def next_byte_loss(module: torch.nn.Module, tokens: torch.Tensor,
                   targets: torch.Tensor | None = None) -> torch.Tensor:
    """Mean cross-entropy of predicting each next token (only where ``targets`` is 1, if given)."""
    logits = module(tokens).logits[:, :-1]
    nll = F.cross_entropy(logits.transpose(1, 2), tokens[:, 1:], reduction="none")
    if targets is None:
        return nll.mean()
    keep = targets[:, 1:].to(nll.dtype)
    return (nll * keep).sum() / keep.sum()


@torch.no_grad()
def evaluate(module: TwinTransformer, device: torch.device | str = "cpu") -> dict[str, float]:
    """Validation loss (nats/byte) on a fixed held-out batch, and the in-context check."""
    module.eval()
    g = torch.Generator().manual_seed(EVAL_SEED)
    seq = min(128, module.config.n_ctx)
    val = text_batch("validation", 32, seq, g).to(device)
    rows, start, seg = repeat_batch(32, seq, g)
    logits = module(rows.to(device)).logits.float().cpu()
    nll = F.cross_entropy(logits[:, :-1].transpose(1, 2), rows[:, 1:], reduction="none")
    first = nll[:, start - seg:start - 1].mean()          # predicting seg[1:] the first time
    second = nll[:, start:start + seg - 1].mean()         # and the second time
    return {"val_loss": float(next_byte_loss(module, val)), "first_occurrence_loss": float(first),
            "second_occurrence_loss": float(second)}


def train(
    config: TwinConfig, recipe: Recipe = Recipe(), *, device: str | torch.device = "cpu",
    progress: bool = True, log: Callable[[str], None] | None = None,
) -> TrainResult:
    """Train a twin from ``config`` with ``recipe``; deterministic for a seed on one device.

    Rows longer than the model's context are cut to ``n_ctx``.
    """
    if recipe.mix.seq_len > config.n_ctx:
        recipe = replace(recipe, mix=replace(recipe.mix, seq_len=config.n_ctx))
    with torch.random.fork_rng(devices=[]):  # the caller's random state is left alone
        torch.manual_seed(recipe.seed)
        module = TwinTransformer(config)
    module = module.to(device).train()
    decay = [p for n, p in module.named_parameters() if p.ndim >= 2]
    other = [p for n, p in module.named_parameters() if p.ndim < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": recipe.weight_decay},
                             {"params": other, "weight_decay": 0.0}], lr=recipe.lr)
    g = torch.Generator().manual_seed(recipe.seed)
    losses: list[float] = []
    start, diverged = time.perf_counter(), False
    bar = tqdm(range(recipe.steps), disable=not progress, desc=f"twin {config.placement}-{config.norm}")
    for step in bar:
        for group in opt.param_groups:
            group["lr"] = recipe.lr_at(step)
        tokens, targets = train_batch(recipe.batch, g, recipe.mix)
        loss = next_byte_loss(module, tokens.to(device), targets.to(device))
        if not torch.isfinite(loss):
            diverged = True
            losses.append(float("nan"))
            break
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(module.parameters(), recipe.clip)
        opt.step()
        losses.append(loss.item())
        if step % 50 == 0 or step == recipe.steps - 1:  # the bar ends on the last step's loss
            bar.set_postfix(loss=f"{loss.item():.3f}")
            if log:
                log(f"step {step} loss {loss.item():.4f} lr {recipe.lr_at(step):.2e}")
    module.eval()
    if not diverged:  # evaluate the weights that will be shipped (fp16 round trip)
        module.load_state_dict({k: v.half().float() for k, v in module.state_dict().items()})
    evaluation = evaluate(module, device) if not diverged else {}
    module.probe_ids = range(*recipe.mix.alphabet)
    return TrainResult(module, losses, evaluation, time.perf_counter() - start, diverged)


def last_losses(losses: list[float], n: int = 50) -> float | None:
    """The mean of the last ``n`` finite training losses (fewer in a short run); None if none."""
    finite = [x for x in losses[-n:] if math.isfinite(x)]
    return statistics.fmean(finite) if finite else None


def save(result: TrainResult, recipe: Recipe, out: Path) -> Path:
    """Write ``model.safetensors`` (fp16) and ``twin.json`` into ``out``; returns the weights path.

    Each file is written beside its place and renamed into it, weights first; ``twin.json``
    records the weights' SHA-256, so a save interrupted between the two renames (new weights,
    the previous twin's JSON) is refused by ``load_twin`` instead of loading mismatched.
    """
    out.mkdir(parents=True, exist_ok=True)
    weights = out / "model.safetensors"
    parts = {weights: out / ".model.safetensors.partial",
             out / "twin.json": out / ".twin.json.partial"}
    state = {k: v.detach().half().contiguous().cpu() for k, v in result.module.state_dict().items()}
    try:
        save_file(state, str(parts[weights]))
        usual_permissions(parts[weights])
        meta = {"config": result.module.config.to_dict(), "recipe": asdict(recipe),
                "evaluation": result.evaluation, "train_loss_last_50": last_losses(result.losses),
                "seconds": result.seconds, "bos": BOS, "weights_sha256": sha256(parts[weights])}
        parts[out / "twin.json"].write_text(json.dumps(meta, indent=1))
        for final, partial in parts.items():
            os.replace(partial, final)
    finally:
        for partial in parts.values():
            partial.unlink(missing_ok=True)
    return weights


def load_twin(folder: Path) -> TwinTransformer:
    """A twin saved by ``save`` (float32, eval mode).

    ``CorruptModelFileError`` when ``twin.json`` records weights other than
    ``model.safetensors`` (twins saved before it recorded them are not checked).
    """
    meta = json.loads((folder / "twin.json").read_text())
    if not isinstance(meta, dict) or not isinstance(meta.get("config"), dict):
        raise CorruptModelFileError(f"{str(folder / 'twin.json')!r} is not a twin's description "
                                    "(a JSON object with its config): train the twin again")
    expected = meta.get("weights_sha256")
    if expected is not None and sha256(folder / "model.safetensors") != expected:
        raise CorruptModelFileError(
            f"the twin in {str(folder)!r} is inconsistent: model.safetensors is not the file its "
            "twin.json describes (a save was interrupted?); train it again into that folder")
    config = TwinConfig(**{k: v for k, v in meta["config"].items() if k != "model_type"})
    module = TwinTransformer(config)
    state = load_file(str(folder / "model.safetensors"))
    module.load_state_dict({k: v.float() for k, v in state.items()})
    recipe = meta.get("recipe")
    mix = recipe.get("mix") if isinstance(recipe, dict) else None
    alphabet = mix.get("alphabet") if isinstance(mix, dict) else None  # twins saved without one: any id
    if isinstance(alphabet, list) and len(alphabet) == 2 and all(isinstance(i, int) for i in alphabet):
        module.probe_ids = range(*alphabet)  # the bytes its repeated segments were drawn from
    return module.eval()
