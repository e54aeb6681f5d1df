"""A real browser (Debian's chromium, headless, driven by Playwright) against the app served by
the command ``make app`` uses. Clicks through every page on the default model, checks visible
content and that the browser logged no console errors, and saves screenshots to artifacts/.

Needs /usr/bin/chromium (``.ci/run`` installs it). Without it the test is skipped, except
when ``REQUIRE_BROWSER=1`` (set by CI), where it fails.
"""

import gzip
import json
import os
import shutil
import socket
import struct
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

import residual_stream as rs

ROOT = Path(__file__).resolve().parent.parent
ARTIFACTS = ROOT / "artifacts"
CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
PAGES = [("Overview", "Stream program"), ("Writes", "split into orthogonal subspaces"),
         ("Flow", "Read-write graph"), ("Compare", "relative depth"),
         ("Norm lab", "Forward norm at initialization"), ("Models", "Stream program")]
pytestmark = [pytest.mark.slow, pytest.mark.browser]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def app_tmp(tmp_path_factory) -> Path:
    """The served app's temporary folder (``TMPDIR``), where it stores uploaded corpora."""
    return tmp_path_factory.mktemp("app-tmp")


@pytest.fixture(scope="module")
def server(app_tmp):
    if not Path(CHROMIUM).exists():
        if os.environ.get("REQUIRE_BROWSER") == "1":
            pytest.fail("chromium is required (REQUIRE_BROWSER=1) but /usr/bin/chromium is missing")
        pytest.skip("no chromium: apt-get install -y chromium")
    port = free_port()
    cli = Path(sys.executable).parent / "residual-stream"
    proc = subprocess.Popen([str(cli), "app", "--host", "127.0.0.1", "--port", str(port)],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, cwd=ROOT,
                            env={**os.environ, "TMPDIR": str(app_tmp)})
    url = f"http://127.0.0.1:{port}"
    deadline = time.time() + 60
    while time.time() < deadline:
        try:
            if urllib.request.urlopen(f"{url}/_stcore/health", timeout=1).read() == b"ok":
                break
        except OSError:
            time.sleep(0.5)
    else:
        proc.kill()
        pytest.fail("the app did not start: " + proc.stdout.read().decode()[-2000:])
    yield url
    proc.terminate()
    proc.wait(timeout=10)


def test_click_through_every_page(server, app_tmp, tmp_path):
    from playwright.sync_api import sync_playwright

    ARTIFACTS.mkdir(exist_ok=True)
    errors: list[str] = []
    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=CHROMIUM, headless=True, args=[
            "--no-sandbox", "--disable-gpu", "--disable-background-networking"])
        page = browser.new_page(viewport={"width": 1400, "height": 1000})
        page.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
        page.on("pageerror", lambda e: errors.append(str(e)))
        page.on("requestfailed", lambda r: errors.append(f"request failed: {r.url}"))
        page.goto(server)
        def shows(title: str, content: str, plot: bool, step: str) -> None:
            try:
                page.get_by_role("heading", name=title).first.wait_for(timeout=180_000)
                page.get_by_text(content).first.wait_for(timeout=180_000)
                if plot:
                    page.locator(".js-plotly-plot").first.wait_for(timeout=180_000)
            except Exception as error:  # keep evidence: what the page showed instead
                page.screenshot(path=str(ARTIFACTS / f"failure-{step}.png"), full_page=True)
                shown = page.locator("[data-testid='stAlert']").all_inner_texts() + [
                    t[-2500:] for t in page.locator("[data-testid='stException']").all_inner_texts()]
                raise AssertionError(f"{step}: page {title!r} did not show {content!r}; "
                                     f"alerts: {shown}") from error

        for title, content in PAGES:
            page.get_by_role("link", name=title).first.click()
            shows(title, content, title != "Models", title.lower().replace(" ", "-"))
            page.wait_for_timeout(500)
            page.screenshot(path=str(ARTIFACTS / f"app-{title.lower().replace(' ', '-')}.png"),
                            full_page=True)
        # a figure's PNG, drawn by plotly.js in the browser at PNG_SCALE × its size on the page
        page.get_by_role("link", name="Overview").first.click()
        shows("Overview", "Stream program", True, "overview-png")
        figure = page.locator(".stPlotlyChart").nth(1)  # the stream norm by depth
        figure.locator(".js-plotly-plot").wait_for(timeout=60_000)
        figure.hover()
        with page.expect_download(timeout=60_000) as download:
            figure.locator("[data-title='Download plot as a PNG']").click()
        png, box = Path(download.value.path()).read_bytes(), figure.locator(".js-plotly-plot").bounding_box()
        assert download.value.suggested_filename == "growth.png" and png[:8] == b"\x89PNG\r\n\x1a\n"
        width, height = struct.unpack(">II", png[16:24])  # the IHDR chunk
        assert (width, height) == (round(3 * box["width"]), round(3 * box["height"])), (width, height, box)
        # the corpus page scans when asked, and draws what it measured
        page.get_by_role("link", name="Corpus").first.click()
        shows("Corpus", "press Scan", False, "corpus")
        page.get_by_role("button", name="Scan").click()
        shows("Corpus", "tokens of the built-in corpus in", True, "corpus-scanned")  # done
        page.screenshot(path=str(ARTIFACTS / "app-corpus.png"), full_page=True)
        # the scan whole, made when its button is pressed, loads back with the caption's tokens
        with page.expect_download(timeout=120_000) as download:
            page.get_by_role("button", name="Scan (whole, .pt)").click()
        saved = rs.load_scan(download.value.path())
        caption = page.get_by_text("tokens of the built-in corpus in").first.inner_text()
        assert f"over {saved.tokens:,} tokens" in caption and "growth" in saved.stats, caption
        # a corpus file of one's own, uploaded through the browser (its accept filter and
        # Streamlit's check of the name's suffix), is scanned as rs.scan scans the same file
        notes = tmp_path / "notes.jsonl.gz"
        lines = (json.dumps({"text": f"Upload note {i}: every head reads the stream."}) for i in range(9))
        notes.write_bytes(gzip.compress("\n".join(lines).encode()))
        page.get_by_text("files you upload").first.click()
        uploader = page.locator("[data-testid='stFileUploader']").filter(has_text="Corpus file")
        uploader.locator("input[type='file']").set_input_files(str(notes))
        page.get_by_text("notes.jsonl.gz").first.wait_for(timeout=60_000)
        page.get_by_role("button", name="Scan", exact=True).click()
        shows("Corpus", "tokens of the uploaded notes.jsonl.gz in", True, "corpus-uploaded")
        caption = page.get_by_text("tokens of the uploaded notes.jsonl.gz in").first.inner_text()
        want = rs.scan(rs.load("smollm2-135m", progress=False), str(notes), "growth", batch_size=8,
                       seq_len=128, progress=False).tokens
        assert f"over {want:,} tokens" in caption, caption
        assert [f.name for f in app_tmp.rglob("*") if f.is_file()] == ["notes.jsonl.gz"]
        # user text with markup is shown as text, never executed; the page is drawn whole
        # before the text goes in (a rerun still drawing it may drop what is typed)
        page.get_by_role("link", name="Overview").first.click()
        shows("Overview", "Stream program", True, "overview-before-text")
        box = page.locator("[data-testid='stSidebar'] textarea").first
        box.fill("<script>window.__pwned = 1</script> <b>bold?</b>")
        box.press("Control+Enter")
        shows("Overview", "Stream program", True, "overview-after-text")
        page.wait_for_timeout(2000)
        assert "<b>bold?</b>" in box.input_value()  # the text went in: kept through the rerun
        assert page.evaluate("window.__pwned") is None
        browser.close()
    assert not errors, errors
