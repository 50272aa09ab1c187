"""What the process backend's test modules (tests/test_process_*.py) share: the loop their
real sandboxes run on (a fixture), their sessions on the process backend (its fast path
too), and whether the tests run as root.

The fixture is a test module's once it binds it by name (``anyio_backend =
process.anyio_backend``): pytest looks a fixture up from the test that requests it, so a
module binds it when a test of its own has no loop of its own (a parametrization wins).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path

import pytest

from asyncsandbox import Limits, SandboxDefaults, Session

IS_ROOT = os.geteuid() == 0


# Real sandboxes, on asyncio: the runtime's policy is proven on both loops on the fake
# backend (tests/test_session_*.py), and the process backend on trio by the conformance
# suite (test_conformance.py). A test about one loop says which (its parametrization wins).
@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


def session(
    root: Path,
    *,
    backend_options: Mapping[str, object] | None = None,
    defaults: SandboxDefaults | None = None,
    limits: Limits | None = None,
) -> Session:
    options = {"root": root, **(backend_options or {})}
    return Session(
        "process", backend_options=options, defaults=defaults, limits=limits, sweep=False
    )


def fast_session(root: Path, **options: object) -> Session:
    """A session on the fast path: a resident executor per sandbox."""
    return session(root, backend_options={"isolation": "native", "fast_path": True, **options})
