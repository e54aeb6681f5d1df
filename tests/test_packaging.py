"""The wheel: it carries the app, and ``residual-stream app`` serves that copy from a plain install.

The wheel is built from a copy of this checkout's files as git sees them (tracked, or new and not
ignored: no stale ``build/`` folder), without build isolation (nothing is downloaded), and
installed with ``pip --target`` into a temporary folder, which a subprocess puts first on its
path, so it imports the installed package and not this checkout.
"""

import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def installed(tmp_path_factory) -> tuple[Path, Path]:
    """(the wheel, the folder it is installed in)."""
    tmp = tmp_path_factory.mktemp("wheel")
    source, build = tmp / "source", tmp / "installed"
    for name in _git_files():
        (source / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(ROOT / name, source / name)
    pip = [sys.executable, "-m", "pip", "--disable-pip-version-check", "-q"]
    subprocess.run(pip + ["wheel", "--no-deps", "--no-build-isolation", "-w", str(tmp / "dist"), str(source)],
                   check=True, cwd=tmp)
    (wheel,) = (tmp / "dist").glob("residual_stream-*.whl")
    subprocess.run(pip + ["install", "--no-deps", "--no-compile", "--target", str(build), str(wheel)],
                   check=True, cwd=tmp)
    return wheel, build


def _git_files(*paths: str) -> list[str]:
    """The files git tracks or sees (new and not ignored) under ``paths``, as in the working tree."""
    listed = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard",
                             "--", *paths], cwd=ROOT, capture_output=True, check=True)
    return [n for n in listed.stdout.decode().split("\0") if n and (ROOT / n).is_file()]


def _tracked_app_files() -> dict[str, bytes]:
    return {name[len("app/"):]: (ROOT / name).read_bytes() for name in _git_files("app")}


def test_the_wheel_carries_every_app_file_and_the_built_in_corpus(installed):
    wheel, _ = installed
    files = _tracked_app_files()
    assert "main.py" in files and "views/overview.py" in files
    with zipfile.ZipFile(wheel) as z:
        names = set(z.namelist())
        shipped = {n[len("residual_stream/_app/"):]: z.read(n) for n in names
                   if n.startswith("residual_stream/_app/") and n.endswith(".py")}
        assert shipped == files
        assert "residual_stream/data/builtin_corpus.txt" in names
        assert not [n for n in names if n.startswith(("tests/", "app/", "benchmarks/", "models/"))]


def test_an_installed_wheel_runs_its_own_copy_of_the_app(installed, tmp_path):
    """The CLI finds the installed copy; the copy renders the Overview page without an exception."""
    _, build = installed
    script = (
        "import residual_stream, residual_stream.cli as cli\n"
        "from streamlit.testing.v1 import AppTest\n"
        "print(residual_stream.__file__)\n"
        "print(cli.app_path())\n"
        "at = AppTest.from_file(str(cli.app_path()), default_timeout=300)\n"
        "at.run()\n"
        "assert not at.exception, at.exception\n"
        "print(at.title[0].value)\n"
    )
    env = dict(os.environ, PYTHONPATH=str(build), HF_HUB_OFFLINE="1")
    out = subprocess.run([sys.executable, "-c", script], cwd=tmp_path, env=env,
                         capture_output=True, text=True)
    assert out.returncode == 0, out.stderr[-3000:]
    package, app, title = out.stdout.split("\n")[-4:-1]
    assert Path(package).is_relative_to(build) and Path(app) == build / "residual_stream" / "_app" / "main.py"
    assert title == "Overview"
