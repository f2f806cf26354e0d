"""What `pip install .` ships: every package of the source roots, each from its own directory.

The source roots map onto the namespace `summaryd` package by package (`pyproject.toml`), so a new subpackage
that is not listed there works in an editable install and from a checkout, but is missing from a wheel.
"""

from __future__ import annotations

import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SOURCE_ROOTS = ("cli", "client", "server", "proto")


def test_every_package_of_the_source_roots_is_installed() -> None:
    setuptools = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    found = {}
    for source_root in SOURCE_ROOTS:
        for init in (ROOT / source_root).rglob("__init__.py"):
            package = init.parent.relative_to(ROOT / source_root)
            found[".".join(package.parts)] = (Path(source_root) / package).as_posix()
    assert "summaryd.client._sender" in found
    assert sorted(setuptools["packages"]) == sorted(found)
    assert setuptools["package-dir"] == found
