"""Our code stays ruff- and mypy-clean; these run with the rest of the suite, in CI too."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def _run(*args: str) -> None:
    result = subprocess.run([sys.executable, "-m", *args], cwd=ROOT, capture_output=True, text=True, check=False)
    assert result.returncode == 0, result.stdout + result.stderr


def test_ruff_check() -> None:
    _run("ruff", "check", ".")


def test_ruff_format() -> None:
    _run(
        "ruff",
        "format",
        "--check",
        *(d for d in ("cli", "client", "server", "scripts", "tests", "benchmarks") if (ROOT / d).is_dir()),
    )


def test_mypy() -> None:
    _run("mypy")


def _module_imports(path: Path, module: str, is_package: bool) -> set[str]:
    """The modules `module` imports when it is imported: its top-level and class-level imports (not those of its
    functions, nor those under `if TYPE_CHECKING:`), each with the packages that importing it initialises."""
    found: set[str] = set()

    def visit(body: list[ast.stmt]) -> None:
        for node in body:
            if isinstance(node, ast.Import):
                found.update(alias.name for alias in node.names)
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    parts = module.split(".")[: len(module.split(".")) - node.level + (1 if is_package else 0)]
                    base = ".".join([*parts, *([base] if base else [])])
                found.add(base)
                found.update(f"{base}.{alias.name}" for alias in node.names)
            elif isinstance(node, ast.If):
                if not (isinstance(node.test, ast.Name) and node.test.id == "TYPE_CHECKING"):
                    visit(node.body)
                visit(node.orelse)
            elif isinstance(node, ast.Try):
                visit(node.body)
                for handler in node.handlers:
                    visit(handler.body)
                visit(node.orelse)
                visit(node.finalbody)
            elif isinstance(node, (ast.With, ast.ClassDef)):
                visit(node.body)

    visit(ast.parse(path.read_text(), str(path)).body)
    with_packages = set()
    for name in found:
        parts = name.split(".")
        with_packages.update(".".join(parts[:i]) for i in range(1, len(parts) + 1))
    # The packages `module` lies in are already being imported when it runs: importing them again is no cycle.
    own = module.split(".")
    return {n for n in with_packages if own[: len(n.split("."))] != n.split(".")}


def _import_graph() -> dict[str, set[str]]:
    files: dict[str, tuple[Path, bool]] = {}
    for source_root in ("client", "server", "proto"):
        for path in (ROOT / source_root / "summaryd").rglob("*.py"):
            parts = path.relative_to(ROOT / source_root).with_suffix("").parts
            is_package = parts[-1] == "__init__"
            files[".".join(parts[:-1] if is_package else parts)] = (path, is_package)
    return {
        module: _module_imports(path, module, is_package) & files.keys() for module, (path, is_package) in files.items()
    }


def _find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One import cycle of `graph` (its modules in order, the first repeated at the end), or None."""
    done: set[str] = set()
    for start in sorted(graph):
        path: list[str] = []
        on_path: set[str] = set()
        stack = [(start, iter(sorted(graph[start])))]
        if start in done:
            continue
        path.append(start)
        on_path.add(start)
        while stack:
            node, edges = stack[-1]
            following = next(edges, None)
            if following is None:
                stack.pop()
                on_path.discard(path.pop())
                done.add(node)
            elif following in on_path:
                return [*path[path.index(following) :], following]
            elif following not in done:
                path.append(following)
                on_path.add(following)
                stack.append((following, iter(sorted(graph[following]))))
    return None


def test_no_import_cycles() -> None:
    """Imports flow one way (commands, then client and daemon, then the contract): a module that needs to reach
    up registers with the lower one instead. An import cycle works, or not, by the order modules happen to be
    imported in."""
    graph = _import_graph()
    assert "summaryd.client._sender" in graph["summaryd.client.writer"]  # the graph sees the imports
    cycle = _find_cycle(graph)
    assert cycle is None, "import cycle: " + " → ".join(cycle or [])
