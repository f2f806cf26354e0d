"""The installed summaryd's version, read once from the package metadata (the one place it is written)."""

from __future__ import annotations

import importlib.metadata


def _installed_version() -> str:
    try:
        return importlib.metadata.version("summaryd")
    except importlib.metadata.PackageNotFoundError:  # imported from a source tree that was never installed
        return "0+unknown"


VERSION = _installed_version()
