"""The Docker backend at its edges, on a real engine: the program that uses it (its output
is its own; trio is refused with a clear error: aiodocker is asyncio-based, so every other
test runs on asyncio), what it is given (a removed option, images it cannot use), the
daemon restarting under it, and aiodocker's private API it relies on."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
import uuid
from collections.abc import Iterator

import anyio
import anyio.to_thread
import pytest
from asyncsandbox_docker import DockerBackend

from asyncsandbox import InfrastructureError, InvalidArgument, SandboxDefaults, Session

from . import _docker_support as docker
from ._docker_support import docker_containers, docker_session, unique_tag
from ._support import (
    docker_backend,
    docker_problem,
    docker_test_image,
    eventually_async,
    running,
    unique_marker,
)

pytestmark = [pytest.mark.docker, pytest.mark.usefixtures("docker_engine")]
IMAGE = docker_test_image()

# Docker's fixtures (tests/_docker_support.py), this module's by name: its tests run on
# asyncio, and each is followed by a check that the daemon still answers.
anyio_backend = docker.docker_anyio_backend
daemon_still_answers = docker.docker_daemon_still_answers


def test_prints_nothing_until_logging_is_configured() -> None:
    """A program using the Docker backend writes its own output only: the backend's debug
    events (``docker.connected`` on every Session) were printed on stdout."""
    program = textwrap.dedent(
        """
        import sys, anyio
        from asyncsandbox import Session
        from asyncsandbox_docker import DockerBackend
        async def main():
            async with Session(DockerBackend(default_image=sys.argv[1]), sweep=False) as s:
                result = await s.run(["echo", "only this"])
            sys.stdout.buffer.write(result.stdout)
        anyio.run(main)
        """
    )
    done = subprocess.run(
        [sys.executable, "-c", program, IMAGE], capture_output=True, timeout=120, check=False
    )
    assert done.returncode == 0, done.stderr.decode()
    assert done.stdout == b"only this\n"
    assert done.stderr == b""


@pytest.mark.parametrize("anyio_backend", ["trio"])
async def test_refuses_trio_with_a_clear_error() -> None:
    with pytest.raises(InvalidArgument, match=r"does not run on trio.*asyncio.*'process'"):
        async with Session(docker_backend(), sweep=False):
            pass


def test_call_deadline_is_gone_with_a_clear_error() -> None:
    """Engine API calls are bounded by Timeouts.operation: the old knob says so."""
    with pytest.raises(InvalidArgument, match=r"Timeouts\(operation=5\)"):
        DockerBackend(call_deadline=5)


async def test_image_errors_are_clear() -> None:
    async with Session(docker_backend(pull="never"), sweep=False) as s:
        with pytest.raises(InvalidArgument, match="not present locally"):
            await s.sandbox(image="asyncsandbox-no-such-image:1").start()


@pytest.fixture
def image_without_python() -> Iterator[str]:
    name = "asyncsandbox-test-nopython:" + uuid.uuid4().hex[:6]
    container = (
        subprocess.run(
            ["docker", "create", "--entrypoint", "sh", IMAGE, "-c", "rm -f /usr/bin/python3*"],
            capture_output=True,
            check=True,
            timeout=60,
        )
        .stdout.decode()
        .strip()
    )
    try:
        subprocess.run(
            ["docker", "start", "-a", container], check=True, timeout=60, capture_output=True
        )
        subprocess.run(
            ["docker", "commit", container, name], check=True, timeout=60, capture_output=True
        )
    finally:
        subprocess.run(
            ["docker", "rm", "-f", container], timeout=60, capture_output=True, check=False
        )
    yield name
    subprocess.run(["docker", "rmi", "-f", name], timeout=60, capture_output=True, check=False)


@pytest.mark.parametrize("fast_path", [True, False], ids=["executor", "engine-api"])
async def test_image_without_python_is_a_clear_error(
    image_without_python: str, fast_path: bool
) -> None:
    tag = unique_tag()
    defaults = SandboxDefaults(tags=(tag,))
    async with Session(docker_backend(fast_path=fast_path), defaults=defaults, sweep=False) as s:
        with pytest.raises(InvalidArgument, match="has no python3"):
            async with s.sandbox(image=image_without_python) as sb:
                await sb.exec(["true"])
    assert docker_containers(f"asyncsandbox.tag.{tag}") == []


# -- the daemon restarting under us -----------------------------------------------------------


def dockerd_pid() -> int | None:
    done = subprocess.run(["pgrep", "-x", "dockerd"], capture_output=True, check=False)
    pids = done.stdout.split()
    return int(pids[0]) if len(pids) == 1 else None


restartable = pytest.mark.skipif(
    os.environ.get("ASYNCSANDBOX_TEST_DOCKER_RESTART") != "1",
    reason="restarts the Docker daemon: set ASYNCSANDBOX_TEST_DOCKER_RESTART=1 (CI does)",
)


@pytest.mark.slow  # and alone: it takes the daemon from every other user of it
@restartable
async def test_daemon_restart_mid_run_fails_in_flight_work_with_typed_errors() -> None:
    pid = dockerd_pid()
    assert pid is not None, "needs exactly one dockerd, started by hand (as CI does)"
    cmdline = await anyio.Path(f"/proc/{pid}/cmdline").read_bytes()
    command = [arg.decode() for arg in cmdline.split(b"\0") if arg]
    tag = unique_tag()
    errors: list[BaseException] = []

    marker = unique_marker()

    async def long_exec(sb: object) -> None:
        try:
            await sb.exec(["sleep", marker], timeout=90)  # type: ignore[attr-defined]
        except InfrastructureError as exc:
            errors.append(exc)

    started = time.monotonic()
    async with docker_session(tag) as s:
        sandboxes = [await s.sandbox().start() for _ in range(4)]
        async with anyio.create_task_group() as tg:
            for sb in sandboxes:
                tg.start_soon(long_exec, sb)
            await eventually_async(
                lambda: running("sleep", marker) == 4, within=60, what="in flight"
            )
            os.kill(pid, signal.SIGTERM)  # a graceful restart, as `systemctl restart docker`
            await eventually_async(lambda: dockerd_pid() is None, within=60, what="it stopped")
            # Detached (through sh) so that it outlives this test like the original did.
            await anyio.run_process(["sh", "-c", 'nohup "$@" >/dev/null 2>&1 &', "sh", *command])

            async def answers() -> bool:
                return await anyio.to_thread.run_sync(docker_problem) is None

            await eventually_async(answers, within=60, what="the daemon answers again")
        assert len(errors) == 4, errors  # every in-flight exec ended with an infrastructure error
        assert time.monotonic() - started < 90  # within the execs' own timeout: nothing hung
    assert docker_containers(f"asyncsandbox.tag.{tag}") == []


def test_the_private_aiodocker_api_we_use_is_still_there() -> None:
    """The engine's few uses of aiodocker's (and aiohttp's) private API, listed in one place
    (``_engine.PRIVATE_API``), exist in the installed versions with the keyword arguments we
    pass: an upgrade that drops or renames one fails here, not in a sandbox."""
    import inspect

    from asyncsandbox_docker import _engine

    for owner, name, keywords in _engine.PRIVATE_API:
        where = f"{owner.__module__}.{owner.__qualname__}.{name}"
        member = getattr(owner, name, None)
        if member is None:  # an instance attribute: its class's __init__ sets it
            assert name in owner.__init__.__code__.co_names, f"{where} is gone"
            continue
        parameters = inspect.signature(member).parameters
        missing = [k for k in keywords if k not in parameters]
        assert not missing, f"{where} no longer takes {missing}"
