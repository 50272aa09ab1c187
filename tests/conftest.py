"""Fixtures every test module may use. Helpers shared between modules live in
tests/_support.py."""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest

from ._support import new_process_root, require_docker


@pytest.fixture(params=["asyncio", "trio"])
def anyio_backend(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture
def process_root() -> Iterator[Path]:
    """A private sandbox root for one test (pytest's tmp_path is not reachable by the
    unprivileged sandbox user, so it lives next to the default root)."""
    root = new_process_root()
    yield root
    shutil.rmtree(root, ignore_errors=True)


@pytest.fixture(scope="module")
def module_process_root() -> Iterator[Path]:
    """A private sandbox root shared by one test module's tests (for class- and
    module-scoped sandboxes and servers)."""
    root = new_process_root()
    yield root
    shutil.rmtree(root, ignore_errors=True)


@pytest.fixture
def docker_engine() -> None:
    """Skip without a Docker engine (fail with ``ASYNCSANDBOX_REQUIRE_DOCKER=1``)."""
    require_docker()
