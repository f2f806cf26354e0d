"""Imports flow one way: the command line on top, then the client and the daemon (neither imports the other),
then the contract. Read from the source with `ast`, every import counted: at module level, inside functions
(the lazy ones) and under `TYPE_CHECKING`."""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SERVER = ROOT / "server" / "summaryd" / "server"
CLI = ROOT / "cli" / "summaryd" / "cli"


def _imports(package: Path, name: str) -> Iterator[tuple[str, str]]:
    """(file, imported module) for every import in the package at `package`, whose import name is `name`."""
    for path in sorted(package.rglob("*.py")):
        module = ".".join((name, *path.relative_to(package).with_suffix("").parts))
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                for alias in node.names:
                    yield path.name, alias.name
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    parent = module.rsplit(".", node.level)[0]
                    base = f"{parent}.{base}" if base else parent
                # `from summaryd.client import _replay` imports a module too.
                yield path.name, base
                for alias in node.names:
                    yield path.name, f"{base}.{alias.name}"


def _within(module: str, package: str) -> bool:
    return module == package or module.startswith(package + ".")


def test_the_daemon_imports_neither_the_client_nor_the_command_line() -> None:
    # `python -m summaryd.server` (its __main__) is a program kept for those who run the CLI that way: nothing
    # imports it, and it hands over to `summaryd.cli` at once.
    climbing = [
        (file, module)
        for file, module in _imports(SERVER, "summaryd.server")
        if file != "__main__.py" and (_within(module, "summaryd.client") or _within(module, "summaryd.cli"))
    ]
    assert climbing == []


def test_the_command_line_uses_only_public_modules_of_the_client_and_the_daemon() -> None:
    private = [
        (file, module)
        for file, module in _imports(CLI, "summaryd.cli")
        if (_within(module, "summaryd.client") or _within(module, "summaryd.server"))
        and any(part.startswith("_") for part in module.split("."))
    ]
    assert private == []
    used = {module for _, module in _imports(CLI, "summaryd.cli")}
    assert "summaryd.client.commands" in used  # the client's face for the commands: what this test guards


def test_test_modules_import_nothing_from_each_other() -> None:
    """What tests share (fixtures, launchers, readers, helpers) lives in conftest.py and the support modules
    beside it, so that a test module can be run, moved or deleted alone."""
    tests = Path(__file__).resolve().parent
    modules = {path.stem for path in tests.glob("test_*.py")}
    crossing = [
        (path.name, module)
        for path in sorted(tests.glob("*.py"))
        for node in ast.walk(ast.parse(path.read_text(), str(path)))
        if isinstance(node, ast.Import | ast.ImportFrom)
        for module in ([a.name for a in node.names] if isinstance(node, ast.Import) else [node.module or ""])
        if module.split(".")[0] in modules
    ]
    assert crossing == []
