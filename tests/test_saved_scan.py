"""A finished scan saved whole (``.pt``) and loaded back without the model (``streaming.saved``).

Reference: the ``ScanResult`` the scan returned: every frame of every statistic, its JSON form
and the figures drawn from it must be equal after the round trip.
"""

from __future__ import annotations

import json

import pytest
import torch

import residual_stream as rs
from residual_stream import plotting
from residual_stream.errors import InputError
from residual_stream.streaming.runner import frames

STATS = ["growth", "survival", "survival:granularity=head", "read_attribution", "subspaces", "lens",
         "lens:every=4", "composition"]


@pytest.fixture(scope="module")
def scanned(tmp_path_factory) -> tuple[rs.Model, object, object]:
    """A post-LayerNorm twin scanned over 700 tokens, its result, and that result loaded back."""
    model = rs.load("twin-post-ln")
    result = rs.scan(model, "builtin", STATS, batch_size=4, seq_len=64, max_tokens=700, progress=False)
    path = result.save(tmp_path_factory.mktemp("saved") / "scan.pt")
    return model, result, rs.load_scan(path)


def test_a_saved_scan_loads_back_equal_in_every_frame_without_the_model(scanned):
    from residual_stream.streaming.state import weights_fingerprint

    model, result, loaded = scanned
    assert (loaded.tokens, loaded.batches, loaded.model_name, loaded.seconds, loaded.resumed_tokens) == \
        (result.tokens, result.batches, result.model_name, result.seconds, result.resumed_tokens) and \
        result.tokens == 700
    assert list(loaded.stats) == STATS
    for name in STATS:
        assert type(loaded.stats[name]) is type(result.stats[name])
        want = frames(result.stats[name])
        assert frames(loaded.stats[name]).keys() == want.keys()
        for key, frame in want.items():
            assert frames(loaded.stats[name])[key].equals(frame), (name, key)
    assert json.dumps(loaded.to_dict()) == json.dumps(result.to_dict())  # NaNs written alike
    assert not hasattr(loaded.accumulators["composition"], "model")  # its scores came from the file
    assert loaded.config["weights"] == weights_fingerprint(model) and loaded.config["seq_len"] == 64
    torch.testing.assert_close(loaded.stats["composition"].head_to_head,
                               result.stats["composition"].head_to_head, rtol=0, atol=0)


def test_the_figures_of_a_loaded_scan_are_the_scanned_ones(scanned):
    model, result, loaded = scanned
    for draw in (lambda s: plotting.norm_growth_figure(s["growth"], name=model.name),
                 lambda s: plotting.update_size_figure(s["growth"], name=model.name),
                 lambda s: plotting.survival_figure(s["survival"], "retention"),
                 lambda s: plotting.lens_depth_figure(s["lens:every=4"], name=model.name)):
        assert draw(loaded.stats).to_json() == draw(result.stats).to_json()


def test_a_loaded_scan_saves_again_as_the_same_json(scanned, tmp_path):
    _, result, loaded = scanned
    again = rs.load_scan(loaded.save(tmp_path / "again.pt"))
    assert json.loads(again.save(tmp_path / "again.json").read_text()) == \
        json.loads(result.save(tmp_path / "first.json").read_text())


def test_files_that_are_no_saved_scan_are_refused_by_name_and_left_as_they_were(scanned, tmp_path):
    model, result, _ = scanned
    state = tmp_path / "state.pt"
    rs.scan(model, ["alpha beta gamma"], ["growth"], state=state, progress=False)
    other = tmp_path / "weights.pt"
    torch.save({"weight": torch.ones(2)}, other)
    garbage = tmp_path / "garbage.pt"
    garbage.write_bytes(b"not a torch file at all")
    newer = tmp_path / "newer.pt"
    torch.save({**torch.load(result.save(tmp_path / "ok.pt"), weights_only=True), "version": 99}, newer)
    damaged = tmp_path / "damaged.pt"
    saved = torch.load(tmp_path / "ok.pt", weights_only=True)
    del saved["stats"]["growth"]["sums"]["n"]
    torch.save(saved, damaged)
    cases = [(result.save(tmp_path / "s.json"), r"s.json is a scan's frames as JSON.*save the scan as .pt"),
             (state, r"state.pt is a scan's resumable state \(--state\), not a saved scan"),
             (other, r"weights.pt is not a saved scan \(a torch file of something else\)"),
             (garbage, r"garbage.pt is not a saved scan, or a damaged one"),
             (newer, r"newer.pt was saved by a newer residual-stream \(scan format 99"),
             (damaged, r"damaged.pt is a damaged saved scan \(KeyError"),
             (tmp_path / "missing.pt", r"no saved scan at .*missing.pt"),
             (tmp_path, r"is a folder")]
    for path, message in cases:
        before = path.read_bytes() if path.is_file() else None
        with pytest.raises(InputError, match=message):
            rs.load_scan(path)
        assert (path.read_bytes() if path.is_file() else None) == before
    assert not list(tmp_path.glob(".*partial"))


def test_cli_scan_writes_a_whole_scan_for_a_pt_name(tmp_path):
    from residual_stream.cli import main

    out = tmp_path / "scan.pt"
    assert main(["scan", "twin-pre-rms", "builtin", "--stats", "growth,lens:every=4", "--max-tokens", "300",
                 "--quiet", "--out", str(out)]) == 0
    loaded = rs.load_scan(out)
    want = rs.scan(rs.load("twin-pre-rms"), "builtin", ["growth", "lens:every=4"], max_tokens=300,
                   progress=False)
    assert loaded.tokens == want.tokens == 300
    for name in ("growth", "lens:every=4"):
        for key, frame in frames(want.stats[name]).items():
            assert frames(loaded.stats[name])[key].equals(frame), (name, key)
