"""Scans of disjoint corpus parts merged into one (``streaming.merging``).

References: one scan over the whole corpus (the parts' texts in order, one text a row, so the
two read the same tokens) for every statistic on all tokens; for a statistic on sampled tokens
(which picks tokens by each text's index in its own part) the parts' own means weighted by
their tokens; and the parts themselves, left as they were.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

import residual_stream as rs
from residual_stream.errors import InputError
from residual_stream.streaming.runner import frames
from residual_stream.streaming.sources import builtin_corpus

TEXTS = builtin_corpus()[:40]
STATS = ["growth", "survival", "read_attribution", "lens", "lens:every=4", "composition"]
KW = dict(batch_size=4, seq_len=64, progress=False)
REL = 1e-5  # float32 forward passes of other batches; float64 sums


@pytest.fixture(scope="module")
def model() -> rs.Model:
    return rs.load("twin-pre-ln")


@pytest.fixture(scope="module")
def parts(model) -> list:
    return [rs.scan(model, TEXTS[:17], STATS, **KW), rs.scan(model, TEXTS[17:30], STATS, **KW),
            rs.scan(model, TEXTS[30:], STATS, **KW)]


def _close(got, want, what) -> None:
    """Two frames: their non-numeric columns equal, their numbers within ``REL``."""
    numbers = want.select_dtypes("number").columns
    assert got.drop(columns=numbers).equals(want.drop(columns=numbers)), what
    np.testing.assert_allclose(got[numbers].to_numpy(float), want[numbers].to_numpy(float), rtol=REL,
                               atol=1e-7, equal_nan=True, err_msg=str(what))


def test_merged_parts_equal_one_scan_of_the_whole_corpus(model, parts):
    whole = rs.scan(model, TEXTS, STATS, **KW)
    before = [p.accumulators["growth"].state_dict()["sums"]["n"].clone() for p in parts]
    configs = [dict(p.config) for p in parts]
    merged = rs.merge_scans(parts)
    assert merged.tokens == whole.tokens == sum(p.tokens for p in parts)
    assert merged.batches == sum(p.batches for p in parts)
    for name in STATS:
        if name == "lens:every=4":
            continue
        for key, frame in frames(whole.stats[name]).items():
            _close(frames(merged.stats[name])[key], frame, (name, key))
    assert [p.accumulators["growth"].sums["n"] for p in parts] == before  # the parts are kept
    assert [p.config for p in parts] == configs and "weights" not in configs[0]  # fingerprints beside
    assert parts[0].fingerprinted()["weights"] == merged.config["weights"]
    assert merged.config["corpus"] == [p.config["corpus"] for p in parts]


def test_a_sampled_statistic_merges_to_the_parts_means_weighted_by_their_tokens(parts):
    """Tokens are sampled by their text's index in their own part, so the merged sample is not
    the whole scan's: it is the union of the parts' samples."""
    merged = rs.merge_scans(parts).stats["lens:every=4"]
    lens = [p.stats["lens:every=4"] for p in parts]
    tokens = sum(frame["tokens"].to_numpy() for frame in lens)
    np.testing.assert_array_equal(merged["tokens"].to_numpy(), tokens)
    texts = sum(frame["texts"].to_numpy() for frame in lens)
    np.testing.assert_array_equal(merged["texts"].to_numpy(), texts)
    for column in ("kl", "top1_agreement"):
        want = sum(frame[column].to_numpy() * frame["tokens"].to_numpy() for frame in lens) / tokens
        np.testing.assert_allclose(merged[column].to_numpy(), want, rtol=1e-6, atol=1e-7)  # float32 means


def test_massive_activations_say_which_part_they_came_from():
    """A massive activation planted on every "Z" (as in test_graphs): each part's top rows, by
    value, with the part's index; the same values as one scan of both."""
    planted = rs.twin(norm="rmsnorm", placement="pre", n_layers=3, d_model=32, n_heads=4, seed=5, n_ctx=64)
    with torch.no_grad():
        planted.module.embed.weight[ord("Z"), 7] = 4000.0
    texts = ["Zebras Zigzag.", "The norm is frozen per token.", "Zz", "ZZZZ zz ZZZZ", "Zero", "Z"]
    kw = dict(batch_size=2, seq_len=32, progress=False)
    a, b = (rs.scan(planted, t, ["growth:top_k=5"], **kw) for t in (texts[:3], texts[3:]))
    merged = rs.merge_scans([a, b]).stats["growth:top_k=5"].massive
    whole = rs.scan(planted, texts, ["growth:top_k=5"], **kw).stats["growth:top_k=5"].massive
    assert len(merged) == len(whole) == 5 and set(merged["scan"]) == {0, 1}
    np.testing.assert_allclose(merged["value"].to_numpy(), whole["value"].to_numpy(), rtol=REL)
    for i, part in enumerate((a, b)):
        mine = merged[merged["scan"] == i].drop(columns="scan").reset_index(drop=True)
        _close(mine, part.stats["growth:top_k=5"].massive.iloc[:len(mine)].reset_index(drop=True), i)
    assert "scan" not in a.stats["growth:top_k=5"].massive.columns
    assert not any("scan" in row for row in a.accumulators["growth:top_k=5"].meta["massive"])  # kept


def test_saved_parts_merge_as_the_scans_do(parts, tmp_path):
    paths = [p.save(tmp_path / f"part-{i}.pt") for i, p in enumerate(parts)]
    from_files, in_memory = rs.merge_scans(paths), rs.merge_scans(parts)
    assert from_files.to_dict() == in_memory.to_dict()


def test_parts_that_do_not_add_up_are_refused_by_name(model, parts):
    first, rest = (rs.scan(model, t, ["growth"], **KW) for t in (TEXTS[:10], TEXTS[10:20]))
    shorter = rs.scan(model, TEXTS[10:20], ["growth"], batch_size=4, seq_len=32, progress=False)
    post = rs.scan(rs.load("twin-post-ln"), TEXTS[10:20], ["growth"], **KW)
    assert rs.merge_scans([first, rest]).tokens == first.tokens + rest.tokens
    third = rs.scan(model, TEXTS[20:30], ["growth"], **KW)
    cases = [([first, first], r"scans 0 and 1 read the same corpus .*count its tokens twice"),
             ([first, rest, rest], r"scans 1 and 2 read the same corpus"),  # not only against scan 0
             ([rs.merge_scans([first, rest]), third, rest], r"scans 0 and 2 read the same corpus"),
             ([parts[0], rest], r"scans 0 and 1 measured different statistics"),
             ([first, shorter], r"scans 0 and 1 differ in seq_len \(64, 32\)"),
             ([first, post], r"different models \(twin-pre-ln, twin-post-ln\)"),
             ([], "at least one"), ("scan.pt", "a list of scans"), ([parts[0], {"a": 1}], "scan 1 is a dict")]
    for scans, message in cases:
        with pytest.raises(InputError, match=message):
            rs.merge_scans(scans)


def test_a_calibrated_statistic_is_not_merged_across_calibrations(model):
    """``subspaces`` fixes its PCA on its scan's first batch, so parts of one corpus calibrate
    differently and their energy fractions are of different subspaces: refused, naming it."""
    a, b = (rs.scan(model, texts, ["subspaces", "growth"], **KW) for texts in (TEXTS[:20], TEXTS[20:40]))
    assert not torch.equal(a.accumulators["subspaces"].meta["pca_basis"],
                           b.accumulators["subspaces"].meta["pca_basis"])
    with pytest.raises(InputError, match=r"calibrated 'subspaces' differently \('pca_basis'.*leave "
                                         r"'subspaces' out"):
        rs.merge_scans([a, b])


def test_saved_parts_are_read_one_at_a_time_and_merge_as_given_whole(model, tmp_path, monkeypatch):
    """While part ``i`` is read, the parts read before it (but the first) are gone: a merge of
    thousands of saved parts holds a few at a time. The merge equals that of the parts in memory."""
    import gc
    import weakref

    from residual_stream.streaming import merging

    quarters = [rs.scan(model, TEXTS[i:i + 10], ["growth"], **KW) for i in range(0, 40, 10)]
    paths = [q.save(tmp_path / f"part-{i}.pt") for i, q in enumerate(quarters)]
    alive: list = []

    def load(path):
        gc.collect()
        assert [ref() is None for ref in alive[1:]] == [True] * len(alive[1:]), path  # all but the first
        result = rs.load_scan(path)
        alive.append(weakref.ref(result))
        return result

    monkeypatch.setattr(merging, "load_scan", load)
    merged = rs.merge_scans(paths)
    assert len(alive) == 4
    assert merged.to_dict() == rs.merge_scans(quarters).to_dict()


def test_a_merge_of_merges_lists_every_corpus_once_and_refuses_one_twice(model):
    a, b, c = (rs.scan(model, TEXTS[i:i + 5], ["growth"], **KW) for i in (0, 5, 10))
    twice = rs.merge_scans([rs.merge_scans([a, b]), c])
    assert twice.config["corpus"] == [a.config["corpus"], b.config["corpus"], c.config["corpus"]]
    assert twice.tokens == a.tokens + b.tokens + c.tokens
    with pytest.raises(InputError, match=r"scans 0 and 1 read the same corpus"):
        rs.merge_scans([twice, b])


def test_cli_merges_saved_parts_and_refuses_a_part_given_twice(parts, tmp_path, capsys):
    from residual_stream.cli import main

    paths = [str(p.save(tmp_path / f"part-{i}.pt")) for i, p in enumerate(parts)]
    assert main(["merge", *paths, "--out", str(tmp_path / "all.pt")]) == 0
    assert rs.load_scan(tmp_path / "all.pt").to_dict() == rs.merge_scans(parts).to_dict()
    assert "merged 3 scans" in capsys.readouterr().err
    assert main(["merge", paths[0], paths[0], "--out", str(tmp_path / "twice.json")]) == 1
    assert "read the same corpus" in capsys.readouterr().err and not (tmp_path / "twice.json").exists()
    assert main(["merge", paths[0], "--out", paths[0]]) == 1
    assert "would overwrite it" in capsys.readouterr().err


def test_two_models_of_one_name_and_shape_are_told_apart_by_their_weights(tmp_path):
    """Two twins of one shape and seeds apart share a name (as two fine-tunes in folders called
    ``ckpt`` do): their weights' fingerprints, computed from the live models or kept in the
    saved scans, refuse the merge."""
    a_model, b_model = (rs.twin(norm="rmsnorm", placement="pre", n_layers=1, d_model=16, n_heads=2,
                                n_ctx=32, seed=seed) for seed in (1, 2))
    assert a_model.name == b_model.name
    kw = dict(batch_size=4, seq_len=32, progress=False)
    a, b = rs.scan(a_model, TEXTS[:5], ["growth"], **kw), rs.scan(b_model, TEXTS[5:10], ["growth"], **kw)
    with pytest.raises(InputError, match="scans 0 and 1 differ in weights"):
        rs.merge_scans([a, b])
    paths = [a.save(tmp_path / "a.pt"), b.save(tmp_path / "b.pt")]
    del a_model, b_model, a, b  # no model left to fingerprint: the files' own fingerprints say it
    with pytest.raises(InputError, match="scans 0 and 1 differ in weights"):
        rs.merge_scans(paths)
