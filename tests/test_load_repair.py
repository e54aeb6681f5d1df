"""Loads that went wrong for reasons other than the model's files, and cached copies that repair.

* A damaged float copy of a GGUF file (a NaN, a tensor of the wrong shape, a tensor gone) is the
  package's own cache, keyed by the GGUF's hash: it is made again from the GGUF, and the load
  succeeds; it failed every later load with "re-download or reinstall it", which cannot help.
* A ``device_map`` that leaves a module unplaced, an empty one, or an ``offload_folder`` that is a
  file were "could not load the model …: Re-download or reinstall it": an ``InputError`` now, naming
  the argument.
* Disk offload of a checkpoint lacking weights the stream never reads (BERT's pooler) loaded, and
  the first pass failed with accelerate's bare ``KeyError``.

References: the first load's trace and the GGUF's own tensors (dequantized by transformers), the
same checkpoint loaded onto the CPU, and BERT's documented initialization (normal of
``initializer_range``, zero biases).
"""

from __future__ import annotations

import pytest
import torch
from safetensors.torch import load_file, save_file
from test_loading import minilm_tokenizer_files

import residual_stream as rs
from residual_stream import registry
from residual_stream.devices import parameter
from residual_stream.errors import CorruptModelFileError, InputError
from residual_stream.files import sha256

TEXTS = ["hello world", "The stream is read and written by every layer."]
DOWN = "model.layers.0.mlp.down_proj.weight"


@pytest.fixture
def gguf(tmp_path, monkeypatch):
    """A GGUF file (its magic and bytes; the dequantizer stands in for transformers' reader, which
    takes seconds) of a tiny Llama, its float copy as first made, and the trace of its first load.

    The stand-in returns a tiny Llama built afresh (its state dict: the reference), with a NaN in
    ``model.norm.weight`` for a file named ``nan.gguf``.
    """
    from test_devices import _byte_tokenizer
    from tiny_hf import build

    from residual_stream import gguf_cache

    def dequantized(path):
        model = build("llama")
        if path.name == "nan.gguf":
            with torch.no_grad():
                model.model.norm.weight[0] = float("nan")
        return model, _byte_tokenizer(), ()

    monkeypatch.setattr(gguf_cache, "from_gguf", dequantized)
    monkeypatch.setenv("RESIDUAL_STREAM_CACHE", str(tmp_path / "cache"))
    path = tmp_path / "one.gguf"
    path.write_bytes(b"GGUF" + bytes(range(256)))
    first = rs.trace(rs.load(path, progress=False), TEXTS)
    (copy,) = (tmp_path / "cache" / "gguf").iterdir()
    return path, copy, first, build("llama").state_dict()


def _damage(copy, damage):
    """``damage`` done to the tensors of the float copy ``copy``: its weights file."""
    tensors = load_file(copy / "model.safetensors")
    damage(tensors)
    save_file(tensors, copy / "model.safetensors", metadata={"format": "pt"})
    return copy / "model.safetensors"


def _nan(tensors):
    tensors[DOWN] = tensors[DOWN].clone()
    tensors[DOWN][3, 5] = float("nan")


def _narrower(tensors):
    tensors[DOWN] = tensors[DOWN][:, :-1].clone()


def _gone(tensors):
    del tensors[DOWN]


@pytest.mark.parametrize("damage", [_nan, _narrower, _gone], ids=["nan", "shape", "missing"])
def test_a_damaged_gguf_copy_is_made_again_and_loads(gguf, capsys, damage):
    """Each damage failed every later load (NaN: "weights of 'one.gguf' contain NaN … re-download";
    shape: "could not load the model in '<cache>' … RuntimeError"); a tensor gone was made again."""
    path, copy, first, built = gguf
    weights = _damage(copy, damage)
    capsys.readouterr()
    again = rs.trace(rs.load(path, progress=False), TEXTS)
    assert "the cached copy does not load" in capsys.readouterr().err
    torch.testing.assert_close(again.stream(1), first.stream(1), rtol=0, atol=0)
    assert torch.equal(load_file(weights)[DOWN], built[DOWN])
    rs.load(path, progress=False)  # made once: the next load reads it as it is
    assert "does not load" not in capsys.readouterr().err


def test_a_gguf_with_nan_is_named_not_its_damaged_copy(gguf):
    """A copy holding NaN where its GGUF does too (a copy this package's checks did not make) is made
    again, and the GGUF is refused by its own name, leaving no copy behind."""
    path, copy, _, _ = gguf
    bad = path.with_name("nan.gguf")
    bad.write_bytes(path.read_bytes() + b"!")
    _damage(copy, _nan)
    planted = copy.rename(copy.parent / sha256(bad)[:24])
    with pytest.raises(CorruptModelFileError, match="weights of '.*nan.gguf' contain NaN .*model.norm.weight"
                       ) as err:
        rs.load(bad, progress=False)
    assert "cache" not in str(err.value)
    assert not planted.exists() and list(planted.parent.iterdir()) == []


def test_too_little_memory_is_said_and_the_copy_is_kept(gguf, monkeypatch, capsys):
    """A load that runs out of memory was "could not load the model … Re-download or reinstall it";
    for a GGUF's copy, a memory error must not be taken for damage (the copy stays as it was)."""
    import transformers

    path, copy, _, _ = gguf
    before = (copy / "model.safetensors").read_bytes()

    def no_memory(*args, **kwargs):
        raise MemoryError

    monkeypatch.setattr(transformers.LlamaForCausalLM, "from_pretrained", no_memory)
    capsys.readouterr()
    with pytest.raises(InputError, match="not enough memory to load the model in .*device_map='auto'") as err:
        rs.load(path, progress=False)
    assert "reinstall" not in str(err.value) and "does not load" not in capsys.readouterr().err
    assert (copy / "model.safetensors").read_bytes() == before


@pytest.fixture(scope="module")
def minilm_folder():
    return registry.REGISTRY["minilm-l6"].location()


@pytest.mark.parametrize(("device_map", "message"), [
    ({"embeddings": "cpu", "encoder": "disk"}, "gives no device for pooler.dense.weight, pooler.dense.bias: "
                                               "map every module of the model once"),
    ({}, "device_map is an empty dict, which places no module: map every module.*device_map='auto'"),
])
def test_a_device_map_that_leaves_modules_unplaced_is_an_input_error(minilm_folder, tmp_path, device_map,
                                                                     message):
    """Were "could not load the model … (ValueError / KeyError ''). Re-download or reinstall it"."""
    with pytest.raises(InputError, match=message) as err:
        rs.load(minilm_folder, device_map=device_map, offload_folder=tmp_path / "offload")
    assert not isinstance(err.value, CorruptModelFileError) and "reinstall" not in str(err.value)


@pytest.mark.parametrize(("where", "message"), [
    ("notes.txt", "offload_folder '.*notes.txt' is a file: give the path of a folder"),
    ("notes.txt/offload", "offload_folder '.*notes.txt/offload' cannot be made or written"),
])
def test_an_offload_folder_that_cannot_be_a_folder_is_an_input_error(minilm_folder, tmp_path, where,
                                                                     message):
    """A file given as the folder was "FileExistsError … Re-download or reinstall it"; the file stays."""
    (tmp_path / "notes.txt").write_text("mine")
    with pytest.raises(InputError, match=message) as err:
        rs.load(minilm_folder, device_map={"embeddings": "disk", "encoder": "cpu", "pooler": "cpu"},
                offload_folder=tmp_path / where)
    assert "reinstall" not in str(err.value)
    assert (tmp_path / "notes.txt").read_text() == "mine" and sorted(p.name for p in tmp_path.iterdir()) == [
        "notes.txt"]


@pytest.fixture(scope="module")
def bert_without_pooler(tmp_path_factory):
    """A tiny BERT folder saved without its pooler, which ``BertModel`` has (and initializes)."""
    import transformers as tf

    folder = tmp_path_factory.mktemp("bert-no-pooler")
    torch.manual_seed(0)
    tf.BertModel(tf.BertConfig(vocab_size=30522, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                               intermediate_size=64), add_pooling_layer=False).save_pretrained(folder)
    minilm_tokenizer_files(folder)
    return folder


POOLER_ON_DISK = {"embeddings": "cpu", "encoder": "cpu", "pooler": "disk"}


@pytest.mark.parametrize("device_map", [{"": "disk"}, POOLER_ON_DISK], ids=["all-on-disk", "pooler-on-disk"])
def test_disk_offload_of_a_checkpoint_lacking_unused_weights_traces(bert_without_pooler, tmp_path,
                                                                    device_map):
    """The pooler (never read by the stream) was left out of accelerate's map: the first trace failed with
    KeyError 'pooler.dense.weight'. Reference: the same checkpoint loaded onto the CPU."""
    whole = rs.load(bert_without_pooler, device="cpu", dtype="float32")
    split = rs.load(bert_without_pooler, dtype="float32", device_map=device_map, offload_folder=tmp_path)
    dense = split.module.pooler.dense
    assert dense.weight.device.type == "meta"  # offloaded, read from the map on each pass
    got, want = rs.trace(split, TEXTS), rs.trace(whole, TEXTS)
    for point in range(whole.anatomy.n_layers + 1):
        torch.testing.assert_close(got.stream(point), want.stream(point), rtol=0, atol=1e-6)
    weight, bias = parameter(dense, "weight"), parameter(dense, "bias")
    # BERT's initialization: normal(0, initializer_range) weights, zero biases
    assert torch.equal(bias, torch.zeros(32))
    std = split.module.config.initializer_range
    assert weight.shape == (32, 32) and 0.7 * std < float(weight.std()) < 1.3 * std


def test_running_out_of_memory_moving_the_model_to_its_device_is_said(minilm_folder, monkeypatch):
    """The last step of a load, moving the model to its device, raised a raw ``OutOfMemoryError``;
    now the load's memory advice, after the parts moved so far are moved back to the CPU (on a
    GPU: its memory given back). The move is made to fail as a full GPU would."""
    calls, real = [], torch.nn.Module.to

    def to(self, *args, **kwargs):
        calls.append(args[0] if args else kwargs.get("device"))
        if isinstance(calls[-1], torch.device):  # the load's move (a torch.device), not the move back
            raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")
        return real(self, *args, **kwargs)

    monkeypatch.setattr(torch.nn.Module, "to", to)
    with pytest.raises(InputError, match=r"not enough memory to load the model in .*\(OutOfMemoryError\): "
                                         r"load it in a smaller dtype \('bfloat16'\)") as err:
        rs.load(minilm_folder, progress=False)
    assert calls[-2:] == [torch.device("cpu"), "cpu"]  # the failed move, then the move back
    assert isinstance(err.value.__cause__, torch.OutOfMemoryError)


def test_a_device_map_key_naming_no_module_is_refused_before_loading(minilm_folder, tmp_path, monkeypatch):
    """``encoder.layers.0`` (BERT's blocks are ``encoder.layer``) beside a catch-all ``""`` was
    ignored by accelerate: the block went to the catch-all's device without a word. Now it is
    refused before a weight is read; a map of real names loads and traces as the plain load does."""
    import transformers

    reads = []
    real = transformers.BertModel.from_pretrained.__func__
    monkeypatch.setattr(transformers.BertModel, "from_pretrained",
                        classmethod(lambda cls, *a, **k: reads.append(1) or real(cls, *a, **k)))
    with pytest.raises(InputError, match=r"device_map names 'encoder.layers.0', which is no module of "
                                         r"BertModel \(its modules: embeddings, encoder, pooler, and the "
                                         r"modules inside them\): map every module") as err:
        rs.load(minilm_folder, device_map={"": "cpu", "encoder.layers.0": "cpu"}, progress=False)
    assert reads == [] and not isinstance(err.value, CorruptModelFileError)
    with pytest.raises(InputError, match=r"names 'embedding', 'pooler.dense.weights', which are no module"):
        rs.load(minilm_folder, device_map={"embedding": "cpu", "encoder": "cpu",
                                           "pooler.dense.weights": "cpu", "pooler": "cpu"}, progress=False)
    named = rs.load(minilm_folder, device_map={"": "cpu", "encoder.layer.0": "cpu",
                                               "pooler.dense.weight": "cpu"}, progress=False)
    assert reads == [1]  # the spy sees a load that reads weights
    plain = rs.load(minilm_folder, progress=False)
    torch.testing.assert_close(rs.trace(named, "a map of real names").stream(6),
                               rs.trace(plain, "a map of real names").stream(6), rtol=0, atol=0)


def test_nested_entries_are_found_by_their_prefixes_in_a_large_map():
    """Each key's enclosing modules are looked up, not every pair: a map of 20,000 entries (a large
    model's, by parameter) is checked at once. Reference: the pair that nests, planted last."""
    from residual_stream.devices import check_device_map

    device_map = {f"model.layers.{i}.mlp.w{j}": "cpu" for i in range(2000) for j in range(10)}
    check_device_map(device_map)  # none nests: passes
    with pytest.raises(InputError, match="maps 'model.layers.1999.mlp.w0' to 'cpu' inside "
                                         r"'model.layers.1999' \('disk'\)"):
        check_device_map({**device_map, "model.layers.1999": "disk"})


@pytest.mark.parametrize("device_map", [{"": "cpu", "encoder.layer.0.attention": "disk"},
                                        {"": "disk", "encoder.layer.0": "disk"},
                                        {"embeddings": "cpu", "encoder": "disk", "encoder.layer.1": "cpu",
                                         "pooler": "cpu"}])
def test_disk_on_an_entry_inside_another_is_refused_before_loading(minilm_folder, tmp_path, device_map):
    """The first failed to load as "could not load … weight is on the meta device … Re-download";
    the second loaded weights no trace could read (NotAvailableError at the first pass). Both are
    refused before anything is read or written. The same nesting without disk loads (see
    ``test_a_device_map_key_naming_no_module_is_refused_before_loading``)."""
    inner = next(k for k in device_map if k and "." in k)
    with pytest.raises(InputError, match=rf"device_map maps '{inner}' to '(disk|cpu)' inside '[a-z]*' "
                                         r"\('(cpu|disk)'\): accelerate cannot place a part of a module"):
        rs.load(minilm_folder, device_map=device_map, offload_folder=tmp_path / "offload", progress=False)
    assert not (tmp_path / "offload").exists()
