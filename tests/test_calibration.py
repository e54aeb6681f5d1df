"""A scan calibrated by another scan (``streaming.calibration``), so that parts of a corpus merge.

References: one scan over the whole corpus with the same calibration (the parts' texts in
order, one text a row, so the two read the same tokens); a scan calibrated by itself against
the same scan calibrated from its own first batch; and the accumulators and files of a refused
scan, left as they were.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

import residual_stream as rs
from residual_stream.errors import InputError
from residual_stream.streaming.calibration import calibration_source
from residual_stream.streaming.runner import frames
from residual_stream.streaming.sources import builtin_corpus
from residual_stream.streaming.specs import make_accumulators

TEXTS = builtin_corpus()[:40]
KW = dict(batch_size=4, seq_len=64, progress=False)
REL = 1e-5  # float32 forward passes of other batches; float64 sums
STATS = ["subspaces", "growth"]


@pytest.fixture(scope="module")
def model() -> rs.Model:
    return rs.load("twin-pre-ln")


@pytest.fixture(scope="module")
def calibration(model):
    """A short scan of other texts: one batch of 4 × 64, where the basis is fixed."""
    return rs.scan(model, TEXTS[30:], ["subspaces"], max_tokens=256, **KW)


def _basis(result) -> torch.Tensor:
    return result.accumulators["subspaces"].meta["pca_basis"]


def _assert_frames_close(got, want, rtol: float) -> None:
    for key, frame in frames(want).items():
        other = frames(got)[key]
        numbers = frame.select_dtypes("number").columns
        assert other.drop(columns=numbers).equals(frame.drop(columns=numbers)), key
        np.testing.assert_allclose(other[numbers].to_numpy(float), frame[numbers].to_numpy(float),
                                   rtol=rtol, atol=1e-7 if rtol else 0, equal_nan=True, err_msg=key)


def test_parts_scanned_with_one_calibration_merge_to_the_whole_scan(model, calibration, tmp_path):
    """Each part takes the calibration's basis, not its own first batch's, so the parts merge, and
    the merge equals one scan of the whole corpus with that calibration; one part is calibrated
    from the saved file, as a job of an array would be."""
    saved = calibration.save(tmp_path / "calibration.pt")
    a = rs.scan(model, TEXTS[:20], STATS, calibration=calibration, **KW)
    b = rs.scan(model, TEXTS[20:], STATS, calibration=saved, **KW)
    whole = rs.scan(model, TEXTS, STATS, calibration=calibration, **KW)
    for part in (a, b, whole):
        assert torch.equal(_basis(part), _basis(calibration))
    assert not torch.equal(_basis(rs.scan(model, TEXTS[:20], ["subspaces"], **KW)), _basis(a))
    merged = rs.merge_scans([a, b])
    assert merged.tokens == whole.tokens
    for name in STATS:
        _assert_frames_close(merged.stats[name], whole.stats[name], REL)


def test_a_scan_calibrated_by_itself_equals_its_plain_scan(model):
    """Its own basis given back: the same sums, to the bit, without the calibration pass."""
    plain = rs.scan(model, TEXTS[:12], ["subspaces"], **KW)
    again = rs.scan(model, TEXTS[:12], ["subspaces"], calibration=plain, **KW)
    assert torch.equal(_basis(again), _basis(plain))
    _assert_frames_close(again.stats["subspaces"], plain.stats["subspaces"], 0)


def test_a_calibration_that_cannot_serve_is_refused_and_the_state_kept(model, calibration, tmp_path):
    growth_only = rs.scan(model, TEXTS[:4], ["growth"], **KW)
    other_model = rs.scan(rs.load("twin-post-ln"), TEXTS[:4], ["subspaces"], **KW)
    damaged = rs.load_scan(calibration.save(tmp_path / "damaged.pt"))
    damaged.accumulators["subspaces"].meta["pca_basis"] = _basis(calibration)[:-1]
    (tmp_path / "scan.json").write_text("{}")
    cases = [(["growth"], calibration, r"none of the statistics \['growth'\] calibrates"),
             (STATS, growth_only, r"holds no 'subspaces' \(it holds \['growth'\]\)"),
             (["subspaces:pca_k=4"], calibration, r"holds no 'subspaces:pca_k=4'"),
             (STATS, other_model, r"calibration scan is of twin-post-ln .*this scan of twin-pre-ln"),
             (STATS, damaged, r"not a finite basis of a 128-wide stream"),
             (STATS, tmp_path / "scan.json", "frames as JSON")]
    assert model.anatomy.d_model == 128
    for stats, source, message in cases:
        with pytest.raises(InputError, match=message):
            rs.scan(model, TEXTS[:4], stats, calibration=source, **KW)
    with pytest.raises(InputError, match="not a value of type int"):  # rs.scan's annotation, in tests
        calibration_source(3, make_accumulators(STATS))

    state = tmp_path / "state.pt"
    rs.scan(model, TEXTS[:8], ["subspaces"], state=state, **KW)
    before = state.read_bytes()
    with pytest.raises(InputError, match=r"resumed state's 'subspaces' was calibrated otherwise"):
        rs.scan(model, TEXTS[:8], ["subspaces"], state=state, calibration=calibration, **KW)
    assert state.read_bytes() == before
    resumed = rs.scan(model, TEXTS[:8], ["subspaces"], state=state, calibration=rs.load_scan(
        rs.scan(model, TEXTS[:8], ["subspaces"], **KW).save(tmp_path / "own.pt")), **KW)
    assert resumed.resumed_tokens == resumed.tokens > 0  # its own basis: resumed, nothing left


def test_cli_parts_calibrated_by_one_file_merge(model, calibration, tmp_path, capsys):
    from residual_stream.cli import main

    cal = str(calibration.save(tmp_path / "calibration.pt"))
    for i, texts in enumerate((TEXTS[:20], TEXTS[20:])):
        (tmp_path / f"part-{i}.txt").write_text("\n".join(texts) + "\n", encoding="utf-8")
        assert main(["scan", "twin-pre-ln", str(tmp_path / f"part-{i}.txt"), "--stats", "subspaces",
                     "--batch-size", "4", "--seq-len", "64", "--calibration", cal, "--quiet",
                     "--out", str(tmp_path / f"part-{i}.pt")]) == 0
    parts = [str(tmp_path / f"part-{i}.pt") for i in range(2)]
    assert main(["merge", *parts, "--out", str(tmp_path / "all.pt")]) == 0
    (tmp_path / "whole.txt").write_text("\n".join(TEXTS) + "\n", encoding="utf-8")  # the same lines
    whole = rs.scan(model, tmp_path / "whole.txt", ["subspaces"], calibration=calibration, **KW)
    _assert_frames_close(rs.load_scan(tmp_path / "all.pt").stats["subspaces"], whole.stats["subspaces"],
                         REL)
    capsys.readouterr()
    assert main(["scan", "twin-pre-ln", "builtin", "--stats", "growth", "--calibration", cal,
                 "--out", str(tmp_path / "g.json")]) == 1
    assert "none of the statistics ['growth'] calibrates" in capsys.readouterr().err
    assert main(["scan", "twin-pre-ln", "builtin", "--stats", "subspaces", "--calibration", cal,
                 "--out", cal]) == 1
    assert "would overwrite it" in capsys.readouterr().err
    assert not (tmp_path / "g.json").exists()
