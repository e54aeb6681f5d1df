"""Twins: the untrained builder, the trainer, the CLI, and the bundled trained twins."""

import json
from dataclasses import asdict, replace

import pytest
import torch
from conftest import TEXTS

import residual_stream as rs
from residual_stream.cli import main
from residual_stream.registry import REGISTRY, TWIN_NAMES
from residual_stream.twins.model import TwinConfig
from residual_stream.twins.train import TWIN_RECIPE, Recipe, evaluate, train

VAL_LOSS_ATOL = 1e-3  # nats/byte: the recorded loss is of the shipped fp16 weights
IN_CONTEXT_RATIO = 0.5  # second-occurrence loss must be under half the first
INDUCTION_TWINS = set(TWIN_NAMES)  # every twin formed induction heads under the shared recipe


def test_twin_builder_is_deterministic_and_maps_tokens_to_logits():
    a = rs.twin(norm="layernorm", placement="sandwich", n_layers=2, seed=3)
    b = rs.twin(norm="layernorm", placement="sandwich", n_layers=2, seed=3)
    c = rs.twin(norm="layernorm", placement="sandwich", n_layers=2, seed=4)
    sa, sb, sc = (m.module.state_dict() for m in (a, b, c))
    assert all(torch.equal(sa[k], sb[k]) for k in sa)
    assert not all(torch.equal(sa[k], sc[k]) for k in sa)
    tokens = torch.randint(0, 257, (2, 9))
    assert a.module(tokens).logits.shape == (2, 9, 257)


def test_twins_differ_only_in_normalization():
    pre = rs.twin(norm="rmsnorm", placement="pre", n_layers=2, seed=0).module.state_dict()
    post = rs.twin(norm="layernorm", placement="post", n_layers=2, seed=0).module.state_dict()
    shared = [k for k in pre if "ln_" not in k]
    assert shared and all(torch.equal(pre[k], post[k]) for k in shared)


def test_training_is_deterministic_for_a_seed():
    cfg = TwinConfig(norm="layernorm", placement="post", n_layers=1, d_model=32, n_heads=2,
                     n_ctx=32)
    recipe = Recipe(steps=30, batch=4, warmup=5, lr=3e-3)
    state = torch.get_rng_state()
    first, second = (train(cfg, recipe, progress=False) for _ in range(2))
    assert first.losses == second.losses and not first.diverged
    assert sum(first.losses[-5:]) < sum(first.losses[:5])  # and it learns
    assert torch.equal(torch.get_rng_state(), state)  # the caller's random state is left alone


def test_the_recorded_training_loss_is_the_mean_of_the_last_losses_there_are():
    """By hand: a 3-step run's loss is the mean of its 3 (it was their sum over 50); a
    diverged run's NaN is left out; a run with no finite loss records none (not NaN, which
    is not JSON)."""
    from residual_stream.twins.train import last_losses

    assert last_losses([3.0, 2.0, 1.0]) == pytest.approx(2.0)
    assert last_losses([float(x) for x in range(100)], 50) == pytest.approx(sum(range(50, 100)) / 50)
    assert last_losses([4.0, 2.0, float("nan")]) == pytest.approx(3.0)
    assert last_losses([float("nan")]) is None


def test_cli_trains_a_twin_that_loads(tmp_path, capsys):
    out = tmp_path / "tiny"
    code = main(["train", "--norm", "rmsnorm", "--placement", "pre", "--layers", "1",
                 "--d-model", "32", "--heads", "2", "--d-mlp", "64", "--n-ctx", "32",
                 "--steps", "3", "--batch", "2", "--out", str(out), "--quiet"])
    assert code == 0  # the default warm-up (500) is cut to the 3 steps, not refused
    printed = json.loads(capsys.readouterr().out)
    model = rs.load(out)
    assert model.anatomy.n_layers == 1 and model.anatomy.norm_kind == "rmsnorm"
    assert evaluate(model.module)["val_loss"] == pytest.approx(printed["val_loss"], abs=1e-5)
    assert rs.trace(model, ["hello", "hi there"]).check().ok
    assert list(model.module.probe_ids) == list(range(32, 127))  # its recipe's alphabet
    meta = json.loads((out / "twin.json").read_text())
    for recipe in ([], {"mix": 3}, {"mix": {"alphabet": "printable"}}):  # odd, or older twins': any id
        (out / "twin.json").write_text(json.dumps(meta | {"recipe": recipe}))
        assert rs.load(out).module.probe_ids is None


def test_cli_train_defaults_are_the_apis(tmp_path, capsys):
    """``--d-mlp`` left out is 4 × ``--d-model``, as ``rs.twin`` and ``TwinConfig`` make it
    (the CLI gave 512 whatever the width); every ``TwinConfig`` MLP is offered (ReLU was not)."""
    out = tmp_path / "relu"
    assert main(["train", "--norm", "layernorm", "--placement", "post", "--layers", "1",
                 "--d-model", "32", "--heads", "2", "--mlp", "relu", "--n-ctx", "32",
                 "--steps", "2", "--batch", "2", "--out", str(out), "--quiet"]) == 0
    capsys.readouterr()
    config = json.loads((out / "twin.json").read_text())["config"]
    api = rs.twin(norm="layernorm", placement="post", n_layers=1, d_model=32, n_heads=2, n_ctx=32)
    assert config["d_mlp"] == api.module.config.d_mlp == 4 * 32 and config["mlp"] == "relu"


def test_a_save_interrupted_between_its_files_is_refused_not_loaded_mismatched(tmp_path,
                                                                            monkeypatch):
    """Retraining into a twin's folder stopped after the new weights replaced the old ones
    (the old twin.json still there): the folder is refused by name, and no partial file is
    left; an untouched save loads with its own weights."""
    import os

    from residual_stream.errors import CorruptModelFileError
    from residual_stream.twins import train as training

    cfg = TwinConfig(norm="rmsnorm", placement="pre", n_layers=1, d_model=32, n_heads=2, n_ctx=32)
    recipe = Recipe(steps=2, batch=2, warmup=1)
    first, second = (train(cfg, replace(recipe, seed=seed), progress=False) for seed in (0, 1))
    out = tmp_path / "twin"
    training.save(first, recipe, out)
    assert sorted(p.name for p in out.iterdir()) == ["model.safetensors", "twin.json"]
    modes = {p.stat().st_mode & 0o777 for p in out.iterdir()}
    assert len(modes) == 1, modes  # the weights as readable as the JSON (safetensors: 0600)
    loaded = rs.load(out).module.state_dict()
    assert all(torch.equal(v, first.module.state_dict()[k].half().float()) for k, v in loaded.items())

    renames = []

    def stop_before_the_json(src, dst):
        if str(dst).endswith("twin.json"):
            raise KeyboardInterrupt
        renames.append(dst)
        os.rename(src, dst)

    monkeypatch.setattr(training.os, "replace", stop_before_the_json)
    with pytest.raises(KeyboardInterrupt):
        training.save(second, recipe, out)
    assert [p.name for p in renames] == ["model.safetensors"]
    assert sorted(p.name for p in out.iterdir()) == ["model.safetensors", "twin.json"]
    with pytest.raises(CorruptModelFileError, match="inconsistent.*train it again"):
        rs.load(out)


@pytest.mark.parametrize(("options", "message"), [
    (dict(norm="LayerNorm"), "norm must be one of \\['layernorm', 'rmsnorm', 'none'\\], not 'LayerNorm'"),
    (dict(positions="rope"), "positions must be one of \\['learned', 'rotary'\\]"),
    (dict(mlp="relu2"), "mlp must be one of"), (dict(init="kaiming"), "init must be one of"),
    (dict(placement="middle"), "placement must be one of"),
    (dict(layers=2), "rs.twin has no option layers: choose from \\['attn_only'"),
])
def test_a_twin_choice_that_is_none_of_its_values_is_refused(options, message):
    """``norm="LayerNorm"`` built a twin with no norm at all, named as if it had one;
    ``positions="rope"`` one with no positions; ``mlp="relu2"`` a GELU MLP. (The tests' type
    checker refuses a wrong ``Literal`` at the call, so the check a user meets is run on a
    config given the value after it is made.)"""
    from residual_stream.errors import InputError

    with pytest.raises(InputError, match=message):
        if "layers" in options:
            rs.twin(**options)
        cfg = TwinConfig()
        for name, value in options.items():
            setattr(cfg, name, value)
        cfg.__post_init__()
    assert TwinConfig().__post_init__() is None  # the defaults are choices


def test_a_twin_json_that_is_no_description_is_refused_by_name(tmp_path):
    """A twin.json holding ``[]`` raised ``AttributeError: 'list' object has no attribute 'get'``."""
    from residual_stream.errors import CorruptModelFileError
    from residual_stream.twins import train as training

    cfg = TwinConfig(norm="rmsnorm", placement="pre", n_layers=1, d_model=32, n_heads=2, n_ctx=32)
    training.save(train(cfg, Recipe(steps=1, batch=2, warmup=1), progress=False), Recipe(), tmp_path)
    for text in ("[]", '{"config": 3}'):
        (tmp_path / "twin.json").write_text(text)
        with pytest.raises(CorruptModelFileError, match="twin.json' is not a twin's description"):
            rs.load(tmp_path)


@pytest.mark.parametrize("name", list(TWIN_NAMES))
def test_bundled_twin_loads_reproduces_its_loss_and_conserves(name):
    if REGISTRY[name].location() is None:
        pytest.fail(f"{name} is missing from models/: run python models/build_twins.py")
    model = rs.load(name)
    meta = json.loads((REGISTRY[name].location() / "twin.json").read_text())
    norm, placement = TWIN_NAMES[name]
    assert (model.anatomy.norm_kind if norm != "none" else "none", model.anatomy.placement) == (
        norm, placement)
    # trained with the recipe `residual-stream train` defaults to (the twins' shared recipe)
    assert meta["recipe"] == json.loads(json.dumps(asdict(TWIN_RECIPE)))
    ev = evaluate(model.module)
    assert ev["val_loss"] == pytest.approx(meta["evaluation"]["val_loss"], abs=VAL_LOSS_ATOL)
    report = rs.trace(model, TEXTS).check()
    assert report.ok, str(report)
    # the in-context check of the card is reproduced, and the repeat is far cheaper
    assert ev["second_occurrence_loss"] == pytest.approx(
        meta["evaluation"]["second_occurrence_loss"], abs=VAL_LOSS_ATOL)
    if name in INDUCTION_TWINS:
        assert ev["second_occurrence_loss"] < IN_CONTEXT_RATIO * ev["first_occurrence_loss"], ev


@pytest.mark.parametrize("args,message", [
    (["--layers", "0"], r"at least 1 of each of n_layers.*\{'n_layers': 0\}"),
    (["--heads", "3"], "d_model 128 is not divisible by n_heads 3: choose heads that divide it"),
    (["--steps", "0"], "training needs steps and batch of at least 1.*steps=0"),
    (["--lr", "0"], "lr above 0"),
    (["--steps", "50", "--warmup", "100"], "warmup of 0 to steps .past them the rate never leaves"),
    (["--synthetic-fraction", "2"], "synthetic_fraction is a fraction of the rows, 0 to 1; got 2"),
    (["--synthetic-fraction", "-1"], "0 to 1; got -1"),
    (["--positions", "rotary", "--d-model", "30", "--heads", "2"],
     "rotary positions turn pairs of a head's 15 dimensions"),
])
def test_cli_train_refuses_numbers_no_twin_can_have(args, message, tmp_path, capsys):
    out = tmp_path / "twin"
    import re

    assert main(["train", "--norm", "rmsnorm", "--placement", "pre", "--d-model", "128",
                 "--out", str(out), "--quiet", *args]) == 1
    err = capsys.readouterr().err
    assert re.search(message, err) and err.count("\n") == 1, err
    assert not out.exists()


def test_a_model_with_no_layers_is_refused_by_name():
    import transformers as tf

    from residual_stream.errors import UnsupportedArchitectureError
    from residual_stream.inputs import ByteTokenizer

    empty = tf.LlamaForCausalLM(tf.LlamaConfig(vocab_size=257, hidden_size=32, num_hidden_layers=0,
                                               num_attention_heads=2, intermediate_size=64))
    with pytest.raises(UnsupportedArchitectureError, match="llama model with no layers.*1 or more"):
        rs.load(empty, tokenizer=ByteTokenizer())
