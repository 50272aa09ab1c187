"""Docker: whether an engine answers, the test image, a container's pids limit squeezed (a
real launcher failure), and what the Docker backend's test modules (tests/test_docker_*.py)
share: a backend and a session on the test image, the containers a label finds, and their
two fixtures.

Docker tests need an engine. Without one they skip, unless ASYNCSANDBOX_REQUIRE_DOCKER=1 (CI
sets it), which turns the skip into a failure. A wedged daemon (Docker 20.10 can stop
answering `info`, moby/moby#46661) fails the test at once instead of hanging the run.
"""

from __future__ import annotations

import os
import subprocess
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import anyio
import pytest

from asyncsandbox.abc import Backend

DOCKER_INFO_DEADLINE = 20


def docker_problem() -> str | None:
    """None if the Docker daemon answers `info` in time, else what is wrong."""
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
    problem = docker_problem()
    if problem is None:
        return
    if os.environ.get("ASYNCSANDBOX_REQUIRE_DOCKER") == "1":
        pytest.fail(f"Docker is required (ASYNCSANDBOX_REQUIRE_DOCKER=1): {problem}")
    pytest.skip(problem)


def require_runsc_runtime() -> None:
    """Skip the calling test when the Docker daemon has no ``runsc`` runtime (see
    ``.ci/docker.sh``); fail it instead with ``ASYNCSANDBOX_REQUIRE_GVISOR=1`` (CI)."""
    require_docker()
    done = subprocess.run(
        ["docker", "info", "--format", "{{json .Runtimes}}"],
        capture_output=True,
        timeout=30,
        check=False,
    )
    if b'"runsc"' not in done.stdout:
        problem = "the Docker daemon has no runsc runtime (see .ci/docker.sh)"
        if os.environ.get("ASYNCSANDBOX_REQUIRE_GVISOR") == "1":
            pytest.fail(f"gVisor is required (ASYNCSANDBOX_REQUIRE_GVISOR=1): {problem}")
        pytest.skip(problem)


def docker_test_image() -> str:
    """The image Docker tests use: $ASYNCSANDBOX_TEST_IMAGE (CI builds one from Debian
    packages), else a public python image that a normal Docker install pulls."""
    return os.environ.get("ASYNCSANDBOX_TEST_IMAGE", "python:3.12-slim")


def _pids_current(pid: int) -> int:
    """Tasks in the pids cgroup of host process ``pid`` (cgroup v1 or v2)."""
    for line in Path(f"/proc/{pid}/cgroup").read_text().splitlines():
        hierarchy, controllers, path = line.split(":", 2)
        if "pids" in controllers.split(","):
            return int(Path(f"/sys/fs/cgroup/pids{path}/pids.current").read_text())
        if hierarchy == "0" and not controllers:
            unified = Path(f"/sys/fs/cgroup{path}/pids.current")
            if unified.exists():
                return int(unified.read_text())
    raise RuntimeError(f"no pids cgroup found for process {pid}")


@asynccontextmanager
async def docker_pids_squeezed(container: str, *, room: int = 0) -> AsyncIterator[None]:
    """While inside, the container can start only ``room`` more tasks: its pids limit is
    set to what runs in it now plus ``room`` (``docker update``), then restored.

    A real launcher failure of a Docker sandbox: forks fail with EAGAIN, so the executor
    cannot fork a command's shepherd (``room=0``), or the shepherd cannot fork the command
    (``room=1``); an Engine API exec's first process is still moved into the container
    (cgroups refuse forks, not moves), and its fork of the command fails.
    """
    inspect = await anyio.run_process(
        ["docker", "inspect", "-f", "{{.State.Pid}} {{.HostConfig.PidsLimit}}", container]
    )
    pid, configured = inspect.stdout.decode().split()
    original = configured if configured.lstrip("-").isdigit() and configured != "0" else "-1"
    limit = 1 if room == 0 else _pids_current(int(pid)) + room
    await anyio.run_process(["docker", "update", "--pids-limit", str(limit), container])
    try:
        yield
    finally:
        # Shielded and bounded: the container must get its limit back whatever happened.
        with anyio.CancelScope(shield=True), anyio.fail_after(60):
            await anyio.run_process(["docker", "update", "--pids-limit", original, container])


def docker_backend(**options: Any) -> Backend:
    """A Docker backend on the test image."""
    from asyncsandbox_docker import DockerBackend

    return DockerBackend(default_image=docker_test_image(), **options)
