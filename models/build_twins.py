"""Train every bundled twin with the shared recipe and write models/<name>/ and the cards.

    python models/build_twins.py [--steps N] [--only NAME ...]

Deterministic for the recipe's seed on the CPU. Takes about 9 minutes per twin on one CPU core.
"""

from __future__ import annotations

import argparse
import hashlib
import json
from pathlib import Path

import torch

from residual_stream.twins.data import Mix, describe_corpus
from residual_stream.twins.model import TwinConfig
from residual_stream.twins.train import Recipe, save, train

HERE = Path(__file__).resolve().parent
SHAPE = dict(n_layers=4, d_model=128, n_heads=4, d_mlp=512, n_ctx=128, mlp="gelu",
             positions="learned")
TWINS = {
    "twin-pre-rms": ("rmsnorm", "pre"),
    "twin-pre-ln": ("layernorm", "pre"),
    "twin-post-ln": ("layernorm", "post"),
    "twin-deepnorm": ("layernorm", "deepnorm"),
    "twin-sandwich": ("rmsnorm", "sandwich"),
    "twin-none": ("none", "pre"),
}


def card(name: str, folder: Path) -> str:
    """The model card of one saved twin (Markdown)."""
    meta = json.loads((folder / "twin.json").read_text())
    digest = hashlib.sha256((folder / "model.safetensors").read_bytes()).hexdigest()
    ev, cfg, rec = meta["evaluation"], meta["config"], meta["recipe"]
    return "\n".join([
        f"### {name}",
        "",
        f"- architecture: {cfg['norm']} × {cfg['placement']}, {cfg['n_layers']} layers, "
        f"d_model {cfg['d_model']}, {cfg['n_heads']} heads, d_mlp {cfg['d_mlp']}, "
        f"{cfg['mlp']} MLP, {cfg['positions']} positions, n_ctx {cfg['n_ctx']}, bytes (257 ids)",
        f"- recipe: {rec['steps']} steps × batch {rec['batch']} × {rec['mix']['seq_len']} tokens, "
        f"AdamW lr {rec['lr']} (warm-up {rec['warmup']}, cosine to 10 %), weight decay "
        f"{rec['weight_decay']}, clip {rec['clip']}, seed {rec['seed']}, "
        f"{rec['mix']['synthetic_fraction']:.0%} rows of repeated-segment pairs",
        f"- train loss (last 50 steps): {meta['train_loss_last_50']:.4f} nats/byte; "
        f"validation loss: {ev['val_loss']:.4f} nats/byte",
        f"- in-context check: loss on the first occurrence of a repeated segment "
        f"{ev['first_occurrence_loss']:.3f}, on the second {ev['second_occurrence_loss']:.3f}",
        f"- training time: {meta['seconds']:.0f} s on the CPU",
        f"- sha256 (model.safetensors): `{digest}`",
        "",
    ])


def main() -> None:
    """Train the twins asked for, then rewrite every card."""
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--steps", type=int, default=3000)
    parser.add_argument("--only", nargs="*", default=list(TWINS))
    args = parser.parse_args()
    recipe = Recipe(steps=args.steps, lr=2e-3, warmup=500, mix=Mix(synthetic_fraction=0.5))
    for name in args.only:
        norm, placement = TWINS[name]
        result = train(TwinConfig(norm=norm, placement=placement, **SHAPE), recipe, progress=True)
        if result.diverged:
            print(f"{name}: diverged at step {len(result.losses)}; not saved")
            continue
        save(result, recipe, HERE / name)
        print(name, result.evaluation, f"{result.seconds:.0f} s", flush=True)
    built = [n for n in TWINS if (HERE / n / "twin.json").exists()]
    rows = []
    for n in built:
        ev = json.loads((HERE / n / "twin.json").read_text())["evaluation"]
        rows.append(f"| {n} | {ev['val_loss']:.3f} | {ev['first_occurrence_loss']:.3f} | "
                    f"{ev['second_occurrence_loss']:.3f} |")
    (HERE / "README.md").write_text(README.format(
        corpus=describe_corpus(), table="\n".join(rows),
        cards="\n".join(card(n, HERE / n) for n in built)))


README = """# Bundled checkpoints: the twins

Small byte-level language models that are identical except for normalization: same shape,
same data order, same initial-weight seed, same steps and optimizer (`Recipe` in
`residual_stream/twins/train.py`). Load them with `rs.load("twin-pre-rms")` etc.

Rebuild them all (deterministic on the CPU for the seed): `python models/build_twins.py`.

Data: {corpus}. Each batch mixes text windows with rows of back-to-back pairs of random
printable segments (so induction heads have a reason to form). The validation loss is measured
on a fixed batch of 32 held-out windows (seed 1234) *after* rounding the weights to fp16, as
shipped; `tests/test_twins.py` reproduces it.

In-context check: on rows `[prefix][segment][segment][filler]` of random printable bytes, the
loss on the second occurrence of the segment (after its first byte) against the loss on the
first; an induction head makes the second far lower.

| twin | validation loss (nats/byte) | first occurrence | second occurrence |
|---|---|---|---|
{table}

{cards}"""


if __name__ == "__main__":
    torch.set_num_threads(1)
    main()
