"""What the code interpreter's test modules (tests/test_interpreter_*.py) share: the
backends their tests run ``Sandbox.run_code`` on, as fixtures, and the helpers that open
sandboxes there and read what a call gave.

Every semantic of the interpreter is tested on every backend: the process backend, Docker,
and the remote backend through a real server (its runs are in the slow suite: the
interpreter is the process backend's behind it, and the wire's own run_code tests,
streaming and interrupts, are in tests/test_remote_transfers.py).

The fixtures are a test module's once it binds them by name (``target =
interpreter.target``): pytest looks a fixture up from the test that requests it, so a
module binds those its tests request and those they request in turn (``remote_server``,
which ``target`` asks for by name). A module-scoped one starts once per module that binds
it.
"""

from __future__ import annotations

import functools
import os
import uuid
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest
from asyncsandbox_remote import RemoteBackend

from asyncsandbox import Execution, Sandbox, SandboxDefaults, Session
from asyncsandbox.abc import Backend

from ._support import ALICE, Server, docker_test_image, require_docker, serving

IS_ROOT = os.geteuid() == 0
ROOTFS = os.environ.get("ASYNCSANDBOX_TEST_ROOTFS")


class Target:
    """Where a test's sandboxes run: a backend, made anew for each session."""

    def __init__(self, kind: str, make: Callable[..., Backend]) -> None:
        self.kind = kind
        self.make = make


@pytest.fixture(scope="module")
def remote_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    """A real server (``asyncsandbox serve``, the process backend) on loopback."""
    with serving(tmp_path_factory.mktemp("interpreter-remote")) as server:
        yield server


@pytest.fixture(params=["process", "docker", pytest.param("remote", marks=pytest.mark.slow)])
def target(request: pytest.FixtureRequest, anyio_backend: str, process_root: Path) -> Target:
    """The backend a test runs on (Docker: on asyncio only, as the backend says)."""
    kind = str(request.param)
    if kind == "docker":
        if anyio_backend != "asyncio":
            pytest.skip("the Docker backend runs on asyncio only")
        require_docker()
        from asyncsandbox_docker import DockerBackend

        return Target(kind, functools.partial(DockerBackend, default_image=docker_test_image()))
    if kind == "remote":
        if anyio_backend != "asyncio":
            # The interpreter's logic runs on both loops on the process backend, and the
            # remote client on both loops in tests/test_remote_client.py's conformance: its
            # trio run here would repeat both.
            pytest.skip("the remote backend's interpreter: asyncio (see the comment)")
        server: Server = request.getfixturevalue("remote_server")
        return Target(kind, lambda **options: RemoteBackend(server.url, ALICE, **options))
    from asyncsandbox._process import ProcessBackend

    return Target(kind, functools.partial(ProcessBackend, root=process_root))


def session(
    target: Target, *, backend_options: dict[str, Any] | None = None, **kwargs: Any
) -> Session:
    defaults = kwargs.pop("defaults", None) or SandboxDefaults(tags=("test-interpreter",))
    return Session(target.make(**(backend_options or {})), defaults=defaults, sweep=False, **kwargs)


@asynccontextmanager
async def sandbox(target: Target, **overrides: Any) -> AsyncIterator[Sandbox]:
    async with session(target) as s, s.sandbox(**overrides) as sb:
        yield sb


def marker() -> str:
    """A unique number to mark the processes of one test (``sleep MARKER``)."""
    return f"{int(uuid.uuid4().int % 10**8) + 10**8}.5"


def stdout(execution: Execution) -> str:
    return "".join(execution.logs.stdout)


def stderr(execution: Execution) -> str:
    return "".join(execution.logs.stderr)
