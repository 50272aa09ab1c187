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


# -- Docker ---------------------------------------------------------------------------------
#
# Docker tests need an engine. Without one they skip, unless ASYNCSANDBOX_REQUIRE_DOCKER=1
# (CI sets it), which turns the skip into a failure. A wedged daemon (Docker 20.10 can stop
# answering `info`, moby/moby#46661) fails the test at once instead of hanging the run.

DOCKER_INFO_DEADLINE = 20


def docker_problem() -> str | None:
    """None if the Docker daemon answers `info` in time, else what is wrong."""
    import subprocess

    try:
        done = subprocess.run(
            ["docker", "info", "--format", "{{.ServerVersion}}"],
            capture_output=True,
            timeout=DOCKER_INFO_DEADLINE,
            check=False,
        )
    except FileNotFoundError:
        return "the docker CLI is not installed"
    except subprocess.TimeoutExpired:
        return (
            f"the Docker daemon did not answer `docker info` within {DOCKER_INFO_DEADLINE}s: "
            "it is wedged (Docker 20.10: moby/moby#46661); restart it"
        )
    if done.returncode != 0:
        return "no Docker engine answers: " + done.stderr.decode(errors="replace").strip()
    return None


def require_docker() -> None:
    """Skip the calling test without a Docker engine; fail it instead when
    ``ASYNCSANDBOX_REQUIRE_DOCKER=1`` (CI)."""
    import os

    problem = docker_problem()
    if problem is None:
        return
    if os.environ.get("ASYNCSANDBOX_REQUIRE_DOCKER") == "1":
        pytest.fail(f"Docker is required (ASYNCSANDBOX_REQUIRE_DOCKER=1): {problem}")
    pytest.skip(problem)


@pytest.fixture
def docker_engine() -> None:
    require_docker()


def docker_test_image() -> str:
    """The image Docker tests use: $ASYNCSANDBOX_TEST_IMAGE (CI builds one from Debian
    packages), else a public python image that a normal Docker install pulls."""
    import os

    return os.environ.get("ASYNCSANDBOX_TEST_IMAGE", "python:3.12-slim")
