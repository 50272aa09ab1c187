"""What the remote backend's test modules (tests/test_remote_*.py) share: the real servers
their tests run against, as fixtures, and the helpers that talk to them.

Every server here is ``asyncsandbox serve`` started as a subprocess on a free port (the
server runs on asyncio; the clients run on asyncio and trio): :class:`tests._support.Server`.

The fixtures are a test module's once it binds them by name (``process_server =
remote.process_server``): pytest looks a fixture up from the test that requests it, so a
module binds those its tests request and those they request in turn (``server_dir``, the
servers' directory). A module-scoped one starts once per module that binds it.
"""

from __future__ import annotations

import re
import uuid
from collections.abc import Callable, Iterator
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import httpx
import pytest
from asyncsandbox_remote import _wire as wire

from ._support import (
    Server,
    docker_test_image,
    require_docker,
    serving,
    unique_marker,
)

# -- servers ------------------------------------------------------------------------------


# Real servers, clients on asyncio: the runtime's policy is proven on both loops on the
# fake backend (tests/test_session_*.py), and the remote client on trio by the conformance suite
# through a process server (tests/test_remote_client.py). A test about one loop says which
# (its parametrization wins).
@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture(scope="module")
def server_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("remote")


@pytest.fixture(scope="module")
def process_server(server_dir: Path) -> Iterator[Server]:
    """One server on the process backend for the tests that need no special settings."""
    with serving(server_dir / "main") as server:
        yield server


@pytest.fixture
def make_server(server_dir: Path) -> Iterator[Callable[..., Server]]:
    """Servers with special settings, stopped (and their roots removed) after the test."""
    with ExitStack() as stack:

        def make(*args: str) -> Server:
            return stack.enter_context(serving(server_dir / uuid.uuid4().hex[:6], *args))

        yield make


@pytest.fixture(scope="module")
def docker_server(server_dir: Path) -> Iterator[Server]:
    """A server on the Docker backend (skipped without an engine, like docker_engine)."""
    require_docker()
    server = Server(
        server_dir / "docker",
        "--backend-option",
        f"default_image={docker_test_image()}",
        backend="docker",
    )
    try:
        yield server
    finally:
        server.stop()


# -- talking to a server ------------------------------------------------------------------


def create_sandbox(client: httpx.Client, **body: Any) -> str:
    """The id of a sandbox created with ``body`` (201, or the test fails)."""
    response = client.post("/v1/sandboxes", json=body)
    assert response.status_code == 201, response.text
    return str(response.json()["id"])


def heartbeat_command(path: str, marker: str = "") -> list[str]:
    """A command that writes "started", then appends to ``path`` every 50 ms for ever; its
    shell carries ``marker`` on its command line (seen from the host: it runs on this
    machine), and it alone writes, so once that shell is gone nothing writes any more."""
    loop = f"echo started; while true; do echo x >> {path}; sleep 0.05; done"
    return ["sh", "-c", loop, marker or unique_marker()]


def expect_started(line: str) -> None:
    """``line`` of an exec stream is the output frame of :func:`heartbeat_command`'s "started"."""
    frame = wire.decode_frame(line.encode())
    assert isinstance(frame, wire.OutputFrame), line
    assert frame.data == b"started\n"


def answered(server: Server, operation: str) -> dict[str, int]:
    """How many requests of ``operation`` the server answered, by status (its /metrics)."""
    with server.client(None) as client:
        text = client.get("/metrics").text
    labels = rf'operation="{operation}",method="\w+",status="(\d+)"'
    pattern = rf"asyncsandbox_remote_requests_total\{{{labels}\}} (\d+)"
    return {status: int(count) for status, count in re.findall(pattern, text)}
