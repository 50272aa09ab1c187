"""Commands in Docker sandboxes, on a real engine: the conformance suite on both paths
(the fast path's executor and the Engine API), the executor's trust model and its protocol
with the host, launcher failures as infrastructure errors (issue 18), and an executor that
releases what it holds, idles, and is not taken for stalled behind a slow reader. asyncio
only: aiodocker is asyncio-based (tests/test_docker_engine.py's
test_refuses_trio_with_a_clear_error)."""

from __future__ import annotations

import contextlib
import os
import re
import subprocess
import textwrap
from collections.abc import Awaitable
from contextlib import AbstractAsyncContextManager
from pathlib import Path

import anyio
import anyio.to_thread
import pytest
from asyncsandbox_docker import DockerAttributes, DockerBackend

from asyncsandbox import LaunchError, Sandbox, SandboxDefaults, Session, Timeouts
from asyncsandbox.testing import CHECKS, Check

from . import _docker_support as docker
from ._docker_support import docker_containers, docker_session, unique_tag
from ._support import (
    docker_backend,
    docker_pids_squeezed,
    docker_test_image,
    eventually_async,
    processes_with,
    unique_marker,
)

pytestmark = [pytest.mark.docker, pytest.mark.usefixtures("docker_engine")]
IMAGE = docker_test_image()

# Docker's fixtures (tests/_docker_support.py), this module's by name: its tests run on
# asyncio, and each is followed by a check that the daemon still answers.
anyio_backend = docker.docker_anyio_backend
daemon_still_answers = docker.docker_daemon_still_answers


def blocked_writing(marker: str) -> bool:
    """Whether the host process ``yes MARKER`` is blocked writing to its full pipe."""
    for line in processes_with(marker):
        pid, command = line.split(": ", 1)
        if command.startswith("yes "):
            with contextlib.suppress(OSError):
                return "pipe_write" in Path(f"/proc/{pid}/wchan").read_text()
    return False


def squeeze_pids(sandbox: Sandbox) -> AbstractAsyncContextManager[None]:
    """The launch_failure hook: no fork succeeds in the container (tests/_support/_docker.py)."""
    return docker_pids_squeezed(sandbox.extra(DockerAttributes.container_id))


@pytest.mark.parametrize("check", CHECKS, ids=lambda c: c.name)
@pytest.mark.parametrize("fast_path", [True, False], ids=["executor", "engine-api"])
async def test_conformance(check: Check, fast_path: bool) -> None:
    await check.run(lambda: docker_backend(fast_path=fast_path), launch_failure=squeeze_pids)


LOOPBACK = """
import socket
server = socket.create_server(("localhost", 0))
socket.create_connection(server.getsockname()).sendall(b"through loopback")
print(socket.gethostbyname("localhost"), server.accept()[0].recv(64).decode())
"""


@pytest.mark.parametrize(
    "options",
    [{}, {"fast_path": False}, {"recyclable": True}],
    ids=["executor", "engine-api", "recyclable"],
)
async def test_localhost_resolves_and_its_loopback_answers(options: dict[str, bool]) -> None:
    """As under Docker's network "none", whether Docker set the container's network up
    (its hosts file) or the executor did (networking disabled: no network hook)."""
    async with Session(docker_backend(**options)) as session, session.sandbox() as sandbox:
        result = await sandbox.exec(["python3", "-c", LOOPBACK], check=True)
    assert result.stdout == b"127.0.0.1 through loopback\n"


async def test_commands_cannot_touch_the_executor() -> None:
    """The trust model of the fast path: a command (the sandbox user) can neither signal the
    executor nor reach its file descriptors, so it cannot forge another command's result."""
    probe = textwrap.dedent(
        """
        import os, signal
        pids = [p for p in os.listdir('/proc') if p.isdigit()]
        executor = next(p for p in pids if b'serve' in open(f'/proc/{p}/cmdline', 'rb').read())
        try:
            os.kill(int(executor), signal.SIGKILL)
            print('killed')
        except PermissionError:
            print('kill refused')
        try:
            os.open(f'/proc/{executor}/fd/1', os.O_WRONLY)
            print('opened')
        except PermissionError:
            print('fd refused')
        """
    )
    async with docker_session(unique_tag()) as s, s.sandbox() as sb:
        result = await sb.exec(["python3", "-c", probe])
        assert result.stdout == b"kill refused\nfd refused\n", result.stderr
        assert (await sb.exec(["echo", "still served"])).stdout == b"still served\n"


async def test_signals_are_reported_on_the_fast_path() -> None:
    async with docker_session(unique_tag()) as s, s.sandbox() as sb:
        killed = await sb.exec(["sh", "-c", "kill -9 $$"])
        exited = await sb.exec(["sh", "-c", "exit 137"])
    assert (killed.returncode, killed.signal) == (137, 9)
    assert (exited.returncode, exited.signal) == (137, None)


BURN = "import time\nt = time.process_time()\nwhile time.process_time() - t < 0.3: pass"


async def test_a_commands_cpu_time_on_the_fast_path() -> None:
    """The shepherd's ``wait4`` of the command: its CPU seconds and its waited children's."""
    async with docker_session(unique_tag()) as s, s.sandbox() as sb:
        busy = await sb.exec(["python3", "-c", BURN])
        idle = await sb.exec(["sleep", "0.2"])
    assert busy.cpu_time == pytest.approx(0.4, abs=0.1), busy
    assert idle.cpu_time == pytest.approx(0.05, abs=0.05), idle


# -- launcher failures are infrastructure errors (issue 18) -----------------------------------


async def launch_error(call: Awaitable[object]) -> LaunchError:
    """The LaunchError that ``call`` raises (the test fails with what it gave instead)."""
    try:
        result = await call
    except LaunchError as exc:
        return exc
    pytest.fail(f"a command that could not start gave a result: {result}")


@pytest.mark.parametrize(
    ("fast_path", "room"),
    [(True, 0), (True, 1), (False, 0)],
    ids=["executor-cannot-fork-a-shepherd", "shepherd-cannot-fork-the-command", "engine-api"],
)
async def test_a_command_that_cannot_be_launched_raises_launch_error(
    fast_path: bool, room: int
) -> None:
    """When our side cannot start a command (here every fork in the container fails), exec
    raises LaunchError, retryable: the command never ran. It returned exit status 137 (the
    shepherd died before the command: "killed"), or 1 (the Engine API shepherd's
    traceback), or hung 10 s and declared the sandbox lost. The sandbox works again once
    forks do."""
    tag = unique_tag()
    defaults = SandboxDefaults(tags=(tag,))
    async with (
        Session(docker_backend(fast_path=fast_path), defaults=defaults, sweep=False) as s,
        s.sandbox() as sb,
    ):
        assert (await sb.exec(["true"])).returncode == 0
        container = sb.extra(DockerAttributes.container_id)
        async with docker_pids_squeezed(container, room=room):
            for stdin in (None, b"some input"):
                error = await launch_error(sb.exec(["echo", "never"], stdin=stdin, timeout=60))
                assert error.retryable
                # On the Engine API path, Docker itself may fail to start the shepherd, or the
                # shepherd its stdin thread.
                expected = "Resource temporarily unavailable|can't start new thread|OCI runtime"
                assert re.search(expected, str(error)), error
        again = await sb.exec(["echo", "launched again"], timeout=60)
        assert again.stdout == b"launched again\n"
        assert s.statistics().execs_failed == 2
    assert docker_containers(f"asyncsandbox.tag.{tag}") == []


async def test_engine_api_results_cannot_be_forged_into_errors() -> None:
    """On the Engine API path, output that looks like Docker's own start failures and the
    launcher's exit status are a command's own outcome, not an infrastructure error (they
    were taken for a dead sandbox, and for an image without python3)."""
    async with (
        Session(docker_backend(fast_path=False), sweep=False) as s,
        s.sandbox() as sb,
    ):
        for code, text in (
            (126, "OCI runtime exec failed: exec failed: unable to start container process"),
            (127, 'exec: "python3": executable file not found in $PATH'),
            (125, "a command may exit 125 too"),
        ):
            result = await sb.exec(["sh", "-c", f"echo '{text}'; exit {code}"])
            assert (result.returncode, result.stdout) == (code, text.encode() + b"\n")
        assert (await sb.exec(["echo", "alive"])).stdout == b"alive\n"


def executor_fds(container_id: str) -> tuple[int, float]:
    """Open fds and CPU seconds of a container's executor (the child of Docker's init)."""
    init = subprocess.run(
        ["docker", "inspect", "--format", "{{.State.Pid}}", container_id],
        capture_output=True, text=True, check=True, timeout=30,
    ).stdout.strip()  # fmt: skip
    proc = Path("/proc")
    children = (proc / init / "task" / init / "children").read_text().split()
    executor = next(p for p in children if b"serve" in (proc / p / "cmdline").read_bytes())
    ticks = (proc / executor / "stat").read_text().rsplit(")", 1)[1].split()[11:13]
    cpu = sum(map(int, ticks)) / os.sysconf("SC_CLK_TCK")
    return len(os.listdir(proc / executor / "fd")), cpu


async def test_executor_releases_every_job_and_idles() -> None:
    """Concurrent commands with output (whose status and output pipes reach EOF in any
    order) leave the executor with no fd behind, and an idle executor uses no CPU."""
    async with docker_session(unique_tag()) as s, s.sandbox() as sb:
        container = sb.extra(DockerAttributes.container_id)
        baseline, _ = await anyio.to_thread.run_sync(executor_fds, container)
        async with anyio.create_task_group() as tg:
            for _ in range(8):

                async def worker() -> None:
                    for _ in range(10):
                        result = await sb.exec(["python3", "-c", "print(sum(range(1000)))"])
                        assert result.stdout == b"499500\n"

                tg.start_soon(worker)
        fds, cpu = await anyio.to_thread.run_sync(executor_fds, container)
        await anyio.sleep(1.0)  # the window in which an idle executor must use no CPU
        _, later = await anyio.to_thread.run_sync(executor_fds, container)
    assert fds == baseline
    assert later - cpu < 0.1, "the idle executor keeps polling"


async def test_a_slow_reader_is_not_a_stalled_executor() -> None:
    """A file operation gives up on an executor silent for a call deadline; frames held up
    behind a command whose output nobody reads for longer than that are not silence."""
    tag = unique_tag()
    s = Session(
        DockerBackend(default_image=IMAGE),
        defaults=SandboxDefaults(tags=(tag,)),
        timeouts=Timeouts(operation=2),
        sweep=False,
    )
    marker = unique_marker()
    async with s, s.sandbox() as sb:
        await sb.write_file("f", b"content")
        async with sb.exec_stream(["yes", marker], timeout=60) as flood:
            # Nobody reads the flood: the executor's frames queue up until it stops reading
            # the command's output (backpressure), and `yes` blocks on its full pipe.
            await eventually_async(lambda: blocked_writing(marker), within=30, what="the flood")
            async with anyio.create_task_group() as tg:
                read: list[bytes] = []

                async def reader() -> None:
                    read.append(await sb.read_file("f"))

                tg.start_soon(reader)
                # The read's answer waits behind the flood, past the call deadline (2 s),
                # which must not take the executor for stalled: a deadline that must not
                # fire is shown by waiting past it.
                await anyio.sleep(5)
                # (On a loaded machine the flood may not have filled every buffer yet and
                # the read come back already: then the deadline had nothing to misjudge.)
                async for _ in flood:
                    if read:
                        break
            assert read == [b"content"]
        assert (await sb.exec(["true"])).returncode == 0


# The host side's names for the frames and files of the in-container agent, each of which
# must mean what the agent means by it.
_AGENT_PROTOCOL = (
    *("FRAME", "START", "STDIN", "STDIN_EOF", "KILL"),  # host -> executor
    *("READY", "STDOUT", "STDERR", "EXIT", "FAILED"),  # executor -> host
)


def test_the_executor_client_speaks_the_agents_protocol() -> None:
    """The frame layout and kinds of ``_executor.py`` (the host) and ``_agent_executor.py``
    (the container) agree, as do the Engine API path's shepherd paths and status with the
    agent's (``_agent.py``): each side is imported, nothing restated, so changing one side
    alone fails here."""
    from asyncsandbox_docker import _agent, _agent_executor, _api_path, _executor

    for name in _AGENT_PROTOCOL:
        host, agent = getattr(_executor, name), getattr(_agent_executor, name)
        if name == "FRAME":
            host, agent = host.format, agent.format
        assert host == agent, f"{name}: the host says {host!r}, the agent {agent!r}"
    kinds = [getattr(_agent_executor, name) for name in _AGENT_PROTOCOL[1:]]
    assert len(set(kinds)) == len(kinds), "two frame kinds share a number"
    for name in ("RUN_DIR", "LAUNCH_FAILED"):
        assert getattr(_api_path, name) == getattr(_agent, name), name
