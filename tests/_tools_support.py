"""What the agent tools' test modules (tests/test_tools_*.py) share: the loops their tests
run on, a toolbox on a real process sandbox, what a call's result must show (a success, a
failure the model caused), and the editor's arguments."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest

from asyncsandbox import Session
from asyncsandbox.tools import Toolbox, ToolResult


def tools_generate_tests(metafunc: pytest.Metafunc) -> None:
    """The tools modules' ``pytest_generate_tests`` (each binds it by that name)."""
    # Tools on a real sandbox run on asyncio: the toolbox's policy is proven on both loops
    # on the fake backend (the tests of tests/test_tools_toolbox.py that use it), the process
    # backend on trio by the conformance suite (test_conformance.py).
    explicit = any(
        "anyio_backend" in str(m.args[0]) for m in metafunc.definition.iter_markers("parametrize")
    )
    if "process_root" in metafunc.fixturenames and not explicit:
        metafunc.parametrize("anyio_backend", ["asyncio"])


@asynccontextmanager
async def process_toolbox(root: Path, **kwargs: Any) -> AsyncIterator[Toolbox]:
    """A :class:`Toolbox` on a sandbox of the process backend at ``root``."""
    async with (
        Session("process", backend_options={"root": root}, sweep=False) as session,
        session.sandbox() as sandbox,
    ):
        yield Toolbox(sandbox, **kwargs)


def ok(result: ToolResult) -> str:
    """The observation of a call that succeeded (the test fails otherwise)."""
    assert not result.is_error, result.observation
    assert not result.infrastructure_error
    return result.observation


def model_error(result: ToolResult) -> str:
    """A failure the model caused: an error, not an infrastructure one, episode going on."""
    assert result.is_error, result.observation
    assert not result.infrastructure_error, result.observation
    assert result.observation.startswith("Error: ")
    assert result.reward is None
    return result.observation


def edit(command: str, path: str, **arguments: Any) -> dict[str, Any]:
    """The arguments of a ``str_replace_editor`` call."""
    return {"command": command, "path": path, **arguments}
