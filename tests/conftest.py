from __future__ import annotations

import shutil
import uuid
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import anyio
import pytest

from asyncsandbox import Sandbox
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


# -- the process backend's ways to run a command --------------------------------------------

PROCESS_MECHANISMS = ("bwrap", "native", "executor")
"""``bwrap`` and ``native``: a launcher per command. ``executor``: the native launcher's
resident executor (the fast path), where commands run in namespaces of their own inside
long-lived ones. Tests of the process backend's isolation run on each one the machine has."""


def process_options(mechanism: str) -> dict[str, Any]:
    """The process backend's options that select ``mechanism``."""
    if mechanism == "executor":
        return {"isolation": "native", "fast_path": True}
    return {"isolation": mechanism, "fast_path": False}


def mechanism_unavailable(mechanism: str) -> str | None:
    """Why ``mechanism`` does not run here (a skip reason), or None."""
    import os
    import shutil

    forced = os.environ.get("ASYNCSANDBOX_PROCESS_ISOLATION")
    if forced and forced != process_options(mechanism)["isolation"]:
        return f"ASYNCSANDBOX_PROCESS_ISOLATION={forced} forces another mechanism"
    if mechanism == "bwrap" and shutil.which("bwrap") is None:
        return "bubblewrap is not installed"
    return None


# -- the process backend's launcher, broken for real ---------------------------------------


@asynccontextmanager
async def process_launcher_broken(sandbox_dir: Path) -> AsyncIterator[None]:
    """While inside, the process sandbox at ``sandbox_dir`` (on the host) cannot be set up:
    its ``/tmp`` is taken away on the host, so every mechanism fails to bind it into the
    sandbox's view (bubblewrap: "Can't find source path"; the native launcher: its mount
    fails) and the command never runs. Put back on exit."""
    tmp = anyio.Path(sandbox_dir, "fs", "tmp")
    aside = anyio.Path(sandbox_dir, "fs", "tmp.broken")
    await tmp.rename(aside)
    try:
        yield
    finally:
        with anyio.CancelScope(shield=True):
            await aside.rename(tmp)


def kill_process_sandbox_processes(sandbox_id: str) -> int:
    """SIGKILL every process of a process sandbox, through its cgroup (root only: that is
    where the backend has cgroups); return how many were signalled."""
    import os
    import signal

    killed = 0
    # os.walk, not Path.glob("**"): cgroups come and go under the walk (the sandbox's own,
    # once its processes are dead), and a glob fails on a directory that vanished.
    for directory, subdirectories, _ in os.walk("/sys/fs/cgroup"):
        path = Path(directory)
        if path.name != sandbox_id or path.parent.name != "asyncsandbox":
            continue
        subdirectories.clear()
        try:
            pids = (path / "cgroup.procs").read_text().split()
        except FileNotFoundError:
            continue
        for pid in pids:
            try:
                os.kill(int(pid), signal.SIGKILL)
                killed += 1
            except ProcessLookupError:
                pass
    return killed


@asynccontextmanager
async def process_launch_failure(sandbox: Sandbox) -> AsyncIterator[None]:
    """The conformance suite's launch_failure hook for a local process sandbox: its
    launcher broken (above), and its resident executor, if it has one, stopped, so that
    the next command needs a new one, which cannot be set up."""
    from asyncsandbox._process import ProcessAttributes

    async with process_launcher_broken(sandbox.extra(ProcessAttributes.root)):
        handle: Any = sandbox._handle
        await handle.stop_executor()
        yield


@pytest.fixture(scope="module")
def module_process_root() -> Iterator[Path]:
    """A private sandbox root shared by one test module's tests (for class- and
    module-scoped sandboxes and servers)."""
    root = default_root().parent / "tests" / uuid.uuid4().hex[:10]
    root.parent.mkdir(parents=True, exist_ok=True, mode=0o711)
    yield root
    shutil.rmtree(root, ignore_errors=True)
