"""Packaging beyond ``pyproject.toml``: the repository's ``app/`` folder ships in the wheel.

The app lives at the top of the repository (``make app`` serves it from a checkout); a wheel
carries a copy as ``residual_stream/_app`` so that ``residual-stream app`` works from a plain
``pip install`` too. Everything else about the package is in ``pyproject.toml``.
"""

from setuptools import find_namespace_packages, setup

APP_PACKAGES = ["residual_stream._app", "residual_stream._app.views"]

setup(packages=find_namespace_packages(include=["residual_stream*"]) + APP_PACKAGES,
      package_dir={"residual_stream._app": "app"})
