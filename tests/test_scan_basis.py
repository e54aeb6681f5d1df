"""A basis of one's own for a scan's ``subspaces`` (``subspaces:basis=…``, ``streaming.basis``).

Reference: ``rs.write_subspaces(trace, basis=rows)`` on one trace of every row the scan reads, its
PCs from the scan's first batch (as the scan fixes them), at test_scan's tolerances. The spec names
the rows by a fingerprint, recomputed here by hand (sha256 of the shape and float32 bytes).
"""

from __future__ import annotations

import hashlib
import json

import numpy as np
import pytest
import torch
from safetensors.torch import save_file
from test_scan import REL_ORDER, TEXTS, _close, _whole

import residual_stream as rs
from residual_stream.errors import InputError
from residual_stream.streaming import Corpus, corpus_batches
from residual_stream.streaming.accumulators import SubspaceStats
from residual_stream.trace import trace_batch

FIELDS = ("named", "head_overlap", "read_fraction", "read_strength")
KW = dict(batch_size=3, seq_len=24)


@pytest.fixture(scope="module")
def model() -> rs.Model:
    return rs.twin(norm="rmsnorm", placement="post", n_layers=2, d_model=32, n_heads=4, seed=5, n_ctx=64)


@pytest.fixture(scope="module")
def rows() -> torch.Tensor:
    return torch.randn(3, 32, generator=torch.Generator().manual_seed(7))


def _by_hand(rows: torch.Tensor | dict) -> str:
    """sha256 of each subspace's name, shape and float32 bytes, in order: its first 12 hex digits."""
    named = {"basis": rows} if isinstance(rows, torch.Tensor) else {f"basis:{k}": v for k, v in rows.items()}
    digest = hashlib.sha256()
    for name, r in named.items():
        data = r.to(torch.float32).contiguous().numpy().tobytes()
        digest.update(f"{name}\0{tuple(r.shape)}\0".encode() + data)
    return digest.hexdigest()[:12]


def _reference(model, rows):
    first = next(corpus_batches(model, Corpus(TEXTS), **KW))
    return rs.write_subspaces(_whole(model, TEXTS, **KW), pca_trace=trace_batch(model, first), basis=rows)


def _assert_equal(got, ref, last: str = "basis") -> None:
    assert (got.writes, got.subspaces, got.heads, got.readers) == (ref.writes, ref.subspaces, ref.heads,
                                                                   ref.readers)
    assert got.subspaces[-1] == last
    for field in FIELDS:
        _close(getattr(got, field), getattr(ref, field))


def test_a_scan_measures_a_users_basis_as_write_subspaces_does_on_one_trace(model, rows, tmp_path):
    """Given as a tensor, nested lists or each file format: one fingerprint, and the analysis's
    fractions in the basis over every token (a post-norm model: writes carried through every norm
    to each reader)."""
    spec = f"subspaces:basis={_by_hand(rows)}"
    scanned = rs.scan(model, TEXTS, [SubspaceStats(basis=rows)], progress=False, **KW)
    assert list(scanned.stats) == [spec]
    ref = _reference(model, rows)
    _assert_equal(scanned.stats[spec], ref)
    assert float(ref.named[:, -1].max()) > 0.05  # the basis holds a share worth comparing
    torch.save(rows, tmp_path / "b.pt")
    np.save(tmp_path / "b.npy", rows.numpy())
    save_file({"probe": rows}, tmp_path / "b.safetensors")
    for name in ("b.pt", "b.npy", "b.safetensors"):
        assert SubspaceStats(basis=str(tmp_path / name)).spec == spec
    assert SubspaceStats(basis=rows.numpy().tolist()).spec == spec  # nested lists


def test_named_bases_are_measured_each_on_its_own_from_a_mapping_or_a_file(model, rows, tmp_path):
    """``{"a": rows[:1], "b": rows[1:]}`` gives the subspaces ``basis:a`` and ``basis:b``, each equal
    to a scan of that basis alone (its ``basis``); a safetensors file of several tensors, or a .pt
    dict, reads as that mapping, one of a single tensor as the basis itself."""
    bases = {"a": rows[:1], "b": rows[1:]}
    spec = f"subspaces:basis={_by_hand(bases)}"
    scanned = rs.scan(model, TEXTS, [SubspaceStats(basis=bases)], progress=False, **KW).stats[spec]
    assert scanned.subspaces[-2:] == ("basis:a", "basis:b")
    _assert_equal(scanned, _reference(model, bases), last="basis:b")
    for name, part in bases.items():
        alone = rs.scan(model, TEXTS, [SubspaceStats(basis=part)], progress=False, **KW).find("subspaces")
        _close(scanned.named[:, scanned.subspaces.index(f"basis:{name}")], alone.named[:, -1], rel=REL_ORDER)
    save_file({k: v.contiguous() for k, v in bases.items()}, tmp_path / "two.safetensors")
    torch.save(bases, tmp_path / "two.pt")
    for name in ("two.safetensors", "two.pt"):
        assert SubspaceStats(basis=str(tmp_path / name)).spec == spec
    assert SubspaceStats(basis={"b": rows[1:], "a": rows[:1]}).spec != spec  # measured in another order
    torch.save({"only": rows}, tmp_path / "one.pt")
    assert SubspaceStats(basis=str(tmp_path / "one.pt")).spec == f"subspaces:basis={_by_hand(rows)}"
    loaded = rs.load_scan(rs.scan(model, TEXTS[:3], [SubspaceStats(basis=bases)], progress=False,
                                  **KW).save(tmp_path / "named.pt"))
    assert torch.equal(loaded.accumulators[spec].meta["basis"]["b"], rows[1:])
    with pytest.raises(InputError, match="'b': basis holds NaN"):
        SubspaceStats(basis={"a": rows[:1], "b": torch.full((1, 32), float("nan"))})
    with pytest.raises(InputError, match="names each basis by a non-empty string"):
        SubspaceStats(basis={})


def test_the_basis_is_kept_saved_resumed_and_merged_by_its_fingerprint(model, rows, tmp_path):
    """A saved scan, an interrupted scan resumed from its state and a merge of parts bring the rows
    back from the spec's fingerprint alone, equal to one scan of every text (the parts calibrated by
    one scan, as parts must be to merge); another basis is another statistic, never mixed in."""
    spec = f"subspaces:basis={_by_hand(rows)}"
    whole = rs.scan(model, TEXTS, [SubspaceStats(basis=rows)], progress=False, **KW)
    loaded = rs.load_scan(whole.save(tmp_path / "whole.pt"))
    assert torch.equal(loaded.accumulators[spec].meta["basis"], rows)
    _assert_same(loaded.stats[spec], whole.stats[spec], rel=0)
    state, path = tmp_path / "s.pt", tmp_path / "rows.pt"
    torch.save(rows, path)

    def stop(key, tokens):
        if key == (0, 1):
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        rs.scan(model, TEXTS, [f"subspaces:basis={path}"], state=state, on_batch=stop, save_every=1,
                progress=False, **KW)
    resumed = rs.scan(model, TEXTS, [spec], state=state, progress=False, **KW)  # the fingerprint alone
    assert resumed.resumed_tokens > 0 and resumed.tokens == whole.tokens
    _assert_same(resumed.stats[spec], whole.stats[spec])
    other = rows.clone()
    other[0, 0] += 1
    with pytest.raises(InputError, match="saved for other arguments"):
        rs.scan(model, TEXTS, [SubspaceStats(basis=other)], state=state, progress=False, **KW)
    half = len(TEXTS) // 2
    calibration = rs.scan(model, TEXTS[:2], [SubspaceStats(basis=rows)], progress=False, **KW)
    parts = [rs.scan(model, texts, [SubspaceStats(basis=rows)], calibration=calibration, progress=False,
                     **KW).save(tmp_path / f"part{i}.pt")
             for i, texts in enumerate((TEXTS[:half], TEXTS[half:]))]
    merged = rs.merge_scans(parts)
    one = rs.scan(model, TEXTS, [SubspaceStats(basis=rows)], calibration=calibration, progress=False, **KW)
    _assert_same(merged.stats[spec], one.stats[spec])
    with pytest.raises(InputError, match="measured different statistics"):
        rs.merge_scans([parts[0], rs.scan(model, TEXTS[half:], [SubspaceStats(basis=other)], progress=False,
                                          **KW)])


def _assert_same(a, b, rel: float = REL_ORDER) -> None:
    """Equal results: to ``rel`` (the same float32 values summed in another order), NaN where NaN."""
    assert a.subspaces == b.subspaces
    for field in FIELDS:
        _close(getattr(a, field), getattr(b, field), rel=rel)


@pytest.mark.parametrize("basis, match", [
    (torch.zeros(2, 32), "NaN, inf or only zeros"),
    (torch.full((2, 32), float("nan")), "NaN, inf or only zeros"),
    (torch.ones(32), r"not a tensor of shape \(32,\)"),
    ("no-such.pt", "no basis file at no-such.pt"),
    ("probe.txt", "is not one of .pt, .pth, .npy, .safetensors"),
    ({"a": 1}, r"'a': basis is rows of directions \[k, d_model\], not a tensor of shape \(\)"),
    (object(), "not a object"),
])
def test_a_basis_that_cannot_serve_is_refused_when_the_statistic_is_made(basis, match):
    with pytest.raises(InputError, match=match):
        SubspaceStats(basis=basis)


def test_a_basis_of_another_width_a_damaged_file_or_a_bare_fingerprint_is_refused(model, tmp_path):
    wide = torch.randn(2, 48)
    with pytest.raises(InputError, match=r"d_model=32.*\(2, 48\).*stream is 32 wide"):
        rs.scan(model, TEXTS, [SubspaceStats(basis=wide)], progress=False, **KW)
    (tmp_path / "bad.pt").write_bytes(b"not a torch file")
    with pytest.raises(InputError, match="bad.pt cannot be read"):
        SubspaceStats(basis=str(tmp_path / "bad.pt"))
    save_file({"a": wide, "b": torch.ones(48)}, tmp_path / "two.safetensors")
    with pytest.raises(InputError, match=r"two.safetensors: 'b': basis is rows of directions \[k, d_model\], "
                                         r"not a tensor of shape \(48,\)"):
        SubspaceStats(basis=str(tmp_path / "two.safetensors"))
    with pytest.raises(InputError, match="names a basis by its fingerprint.*no saved state holds"):
        rs.scan(model, TEXTS, ["subspaces:basis=0123456789ab"], progress=False, **KW)


def test_the_cli_scans_a_basis_file(tmp_path):
    """``--stats subspaces:basis=FILE``: keyed in the JSON by the rows' fingerprint, its fractions in
    the basis those of the same scan in Python (the CLI's defaults: batches of 8 of 128 tokens)."""
    from residual_stream.cli import main

    m = rs.load("twin-pre-rms")
    rows = torch.randn(2, m.anatomy.d_model, generator=torch.Generator().manual_seed(1))
    np.save(tmp_path / "probe.npy", rows.numpy())
    out = tmp_path / "scan.json"
    assert main(["scan", "twin-pre-rms", "builtin", "--stats", f"subspaces:basis={tmp_path / 'probe.npy'}",
                 "--max-tokens", "300", "--out", str(out), "--quiet"]) == 0
    stats = json.loads(out.read_text())["stats"]
    assert list(stats) == [f"subspaces:basis={_by_hand(rows)}"]
    got = [r for r in stats[f"subspaces:basis={_by_hand(rows)}"]["values"] if r["target"] == "basis"]
    same = rs.scan(m, "builtin", [SubspaceStats(basis=rows)], max_tokens=300, batch_size=8, seq_len=128,
                   progress=False).stats[f"subspaces:basis={_by_hand(rows)}"].to_frame()
    want = same[same["target"] == "basis"].to_dict("records")
    assert len(got) == len(want) > 0
    for g, w in zip(got, want, strict=True):
        assert (g["write"], g["measure"]) == (w["write"], w["measure"])
        assert g["value"] == pytest.approx(w["value"], rel=1e-6, nan_ok=True)
