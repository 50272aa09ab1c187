"""Dependencies point down: the core never imports a plugin, and plugins, examples and
benchmarks use only the public API (never ``asyncsandbox._anything``): if one needs a
private piece, that piece should be public."""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PLUGINS = (
    "asyncsandbox_docker",
    "asyncsandbox_e2b",
    "asyncsandbox_remote",
    "asyncsandbox_ray",
    "asyncsandbox_inspect",
    "asyncsandbox_mcp",
    "asyncsandbox_pydantic_ai",
    "asyncsandbox_langchain",
    "asyncsandbox_openai_agents",
    "asyncsandbox_smolagents",
)


def imports(path: Path) -> Iterator[tuple[int, str]]:
    """(line, dotted name) of every module or name ``path`` imports."""
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield node.lineno, alias.name
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            yield node.lineno, node.module
            for alias in node.names:
                yield node.lineno, f"{node.module}.{alias.name}"


def sources(*folders: str) -> list[Path]:
    return sorted(
        p
        for folder in folders
        for p in (ROOT / folder).rglob("*.py")
        if "swe_tasks" not in p.parts and ".venv" not in p.parts
    )


@pytest.mark.parametrize("folder", ["backends", "integrations", "examples", "bench"])
def test_outside_the_core_only_the_public_api_is_used(folder: str) -> None:
    private = [
        f"{path.relative_to(ROOT)}:{line}: {name}"
        for path in sources(folder)
        for line, name in imports(path)
        if name.startswith("asyncsandbox.") and any(p.startswith("_") for p in name.split(".")[1:])
    ]
    assert private == []


def test_the_core_never_imports_a_plugin() -> None:
    upward = [
        f"{path.relative_to(ROOT)}:{line}: {name}"
        for path in sources("asyncsandbox")
        for line, name in imports(path)
        if name.split(".")[0] in PLUGINS
    ]
    assert upward == []
