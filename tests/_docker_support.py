"""What the Docker backend's test modules (tests/test_docker_*.py) share: a session on the
test image, the containers a label finds, and their two fixtures.

Their fixtures are a module's once it binds them by name (``anyio_backend =
docker.docker_anyio_backend``): pytest looks a fixture up from the module of the test that
requests it. Each is declared with the name it is requested by, whatever it is bound as.
"""

from __future__ import annotations

import subprocess
import uuid
from collections.abc import Iterator
from typing import Any

import pytest

from asyncsandbox import SandboxDefaults, Session

from ._support import docker_backend, docker_problem


def docker_session(tag: str, **kwargs: Any) -> Session:
    """A session on :func:`docker_backend`, its sandboxes tagged ``tag`` (unless ``defaults``
    says otherwise), without the sweep at its start."""
    defaults = kwargs.pop("defaults", None) or SandboxDefaults(tags=(tag,))
    return Session(docker_backend(), defaults=defaults, sweep=False, **kwargs)


def docker_containers(label: str) -> list[str]:
    """The ids of the containers (running or not) that carry ``label``."""
    done = subprocess.run(
        ["docker", "ps", "-aq", "--filter", f"label={label}"],
        capture_output=True,
        timeout=30,
        check=True,
    )
    return done.stdout.decode().split()


def unique_tag() -> str:
    """A tag no other test's sandboxes carry: its containers are this test's."""
    return "test-" + uuid.uuid4().hex[:8]


@pytest.fixture(name="anyio_backend")
def docker_anyio_backend() -> str:
    """Docker's tests run on asyncio only: aiodocker is asyncio-based, and the backend says
    so (tests/test_docker_engine.py's test_refuses_trio_with_a_clear_error asks for trio)."""
    return "asyncio"


@pytest.fixture(name="daemon_still_answers", autouse=True)
def docker_daemon_still_answers(docker_engine: None) -> Iterator[None]:
    """Fail fast, with the reason, if a test left the daemon wedged. Only after an engine
    answered before the test (``docker_engine``): without one, the test was skipped and
    there is nothing to check. Autouse: in every test of a module that binds it."""
    yield
    problem = docker_problem()
    if problem is not None:
        pytest.fail(problem)
