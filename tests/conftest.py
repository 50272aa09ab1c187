from __future__ import annotations

import shutil
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from asyncsandbox._process._backend import default_root


@pytest.fixture(params=["asyncio", "trio"])
def anyio_backend(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture
def process_root() -> Iterator[Path]:
    """A private sandbox root for one test (pytest's tmp_path is not reachable by the
    unprivileged sandbox user, so it lives next to the default root)."""
    root = default_root().parent / "tests" / uuid.uuid4().hex[:10]
    root.parent.mkdir(parents=True, exist_ok=True, mode=0o711)
    yield root
    shutil.rmtree(root, ignore_errors=True)
