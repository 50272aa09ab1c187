"""Docker with gVisor: ``DockerBackend(runtime="runsc")`` on the real engine, the fast path
(the agent inside the container) included.

Needs a daemon with the ``runsc`` runtime (``.ci/docker.sh`` configures it, as
``DockerBackend``'s docstring says); skipped without one, failed instead with
``ASYNCSANDBOX_REQUIRE_GVISOR=1`` (CI).
"""

from __future__ import annotations

import contextlib
import os
import signal

import anyio
import anyio.lowlevel
import pytest
from asyncsandbox_docker import DockerBackend

from asyncsandbox import (
    BackendUnavailable,
    Resources,
    Sandbox,
    SandboxDefaults,
    SandboxDied,
    Session,
    Timeouts,
)
from asyncsandbox.testing import CHECKS, Check

from ._support import (
    FORK_UNTIL_REFUSED,
    docker_test_image,
    require_runsc_runtime,
    unique_marker,
    wedge_gvisor,
)

pytestmark = [pytest.mark.docker, pytest.mark.usefixtures("docker_engine", "runsc_runtime")]
IMAGE = docker_test_image()
LANDLOCK_VERSION = (
    "import ctypes, os\n"
    "libc = ctypes.CDLL(None, use_errno=True)\n"
    "r = libc.syscall(444, None, 0, 1)\n"
    "print(r if r >= 0 else os.strerror(ctypes.get_errno()))\n"
)


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture
def runsc_runtime(docker_engine: None) -> None:
    require_runsc_runtime()


def backend(**options: object) -> DockerBackend:
    return DockerBackend(default_image=IMAGE, runtime="runsc", **options)  # type: ignore[arg-type]


@pytest.mark.slow
@pytest.mark.parametrize("check", CHECKS, ids=lambda c: c.name)
async def test_conformance_on_runsc(check: Check) -> None:
    await check.run(backend, launch_failure=None)


async def test_commands_run_on_gvisors_kernel_through_the_agent() -> None:
    """The fast path's agent runs inside gVisor: the kernel is gVisor's, a call gVisor
    lacks is ENOSYS, and a self-signalled command reports its signal (the agent's
    report; the Engine API path cannot tell it)."""
    async with (
        Session(backend(), defaults=SandboxDefaults(), sweep=False) as s,
        s.sandbox() as sb,
    ):
        assert s.backend.capabilities.reports_signal  # the fast path is on
        version = await sb.exec(["cat", "/proc/version"], check=True)
        landlock = await sb.exec(["python3", "-c", LANDLOCK_VERSION], check=True)
        killed = await sb.exec(["sh", "-c", "kill -TERM $$"])
    assert os.uname().release not in version.stdout_text
    assert landlock.stdout_text.strip() == "Function not implemented"
    assert (killed.returncode, killed.signal) == (143, 15)


async def test_a_daemon_without_the_runtime_says_how_to_configure_it() -> None:
    with pytest.raises(BackendUnavailable, match=r"daemon\.json"):
        async with Session(
            DockerBackend(default_image=IMAGE, runtime="asyncsandbox-no-such-runtime"),
            sweep=False,
        ):
            pass


async def test_the_pids_limit_is_enforced_inside_gvisor() -> None:
    """``pids`` is the user's bound on the sandbox's tasks, held by gVisor's kernel: a fork
    past it fails with EAGAIN and the sandbox goes on. The host's pids cgroup counts
    gVisor's own threads too (about 70 at rest, ~5 per task on ptrace): as the user's
    bound there, runsc could not make its threads and the sandbox ended (SandboxDied)."""
    script = FORK_UNTIL_REFUSED
    defaults = SandboxDefaults(resources=Resources(pids=32))
    async with Session(backend(), defaults=defaults, sweep=False) as s, s.sandbox() as sb:
        result = await sb.exec(["python3", "-c", script], timeout=60)
        after = await sb.exec(["echo", "ok"], check=True)
    assert result.stdout_text.split() == ["stopped", "True", "11"], result
    assert after.stdout_text == "ok\n"


# Wedged: a command's timeout (and a cancellation) ends it within the cleanup deadline.
WEDGE_TIMEOUT = 3.0  # the command's own: long enough to start on a busy machine
WEDGE_CLEANUP = 3.0
WEDGE_SLACK = 4.0  # a daemon round trip or two, on top of the contract's deadline


@pytest.mark.slow  # it waits out deadlines
@pytest.mark.timeout(180)
async def test_a_wedged_gvisor_container_ends_the_exec_within_the_cleanup_deadline() -> None:
    """The container's gVisor kernel and file server stop answering (SIGSTOP, from the
    host) while a command runs (or before it): its timeout, and a cancellation, still end the exec
    within the timeout plus ``Timeouts.cleanup``, as :class:`SandboxDied` (the executor
    did not confirm the kill: the command's end is unknown, and the sandbox cannot go on).

    What the backend cannot do: end the wedged gVisor sandbox. The daemon's removal asks
    runsc to kill it (``runsc kill``, run by containerd's shim), which asks the wedged
    sandbox and waits without a deadline (``docker rm -f`` still hung after 90 s here), and
    the daemon may be another host's; so the container is left to the sweep
    (``docker.sandbox.left_for_sweep``), and the session's exit does not wait for it. The
    test ends the wedge (SIGKILL) and removes the containers itself."""
    command = ["sh", "-c", f"echo started; exec sleep {unique_marker()}"]
    deadline = WEDGE_TIMEOUT + WEDGE_CLEANUP + WEDGE_SLACK
    stopped: list[int] = []
    containers: list[str] = []

    async def container_of(sb: Sandbox) -> None:
        assert sb.id is not None
        inspect = await anyio.run_process(["docker", "inspect", "--format", "{{.Id}}", sb.id])
        containers.append(inspect.stdout.decode().strip())

    async def run_wedged(sb: Sandbox, timeout: float) -> None:
        await container_of(sb)
        async with sb.exec_stream(command, timeout=timeout) as run:
            assert (await run.__anext__()).text == "started\n"
            stopped.extend(wedge_gvisor(containers[-1]))
            await run.wait()

    try:
        timeouts = Timeouts(cleanup=WEDGE_CLEANUP)
        async with Session(backend(), timeouts=timeouts, sweep=False) as s:
            async with s.sandbox() as sb:
                await sb.exec(["true"], check=True)
                with anyio.fail_after(deadline):
                    with pytest.raises(SandboxDied):
                        await run_wedged(sb, WEDGE_TIMEOUT)
                    await anyio.lowlevel.checkpoint()  # past the deadline: TimeoutError
                with pytest.raises(SandboxDied):
                    await sb.exec(["true"])
            async with s.sandbox() as sb:
                await sb.exec(["true"], check=True)
                # (Wedged before the command: an exec_stream left by a cancellation drops
                # the error, so a plain exec, whose start nothing outside can see.)
                await container_of(sb)
                stopped.extend(wedge_gvisor(containers[-1]))
                with anyio.fail_after(deadline):
                    with pytest.raises(SandboxDied), anyio.move_on_after(WEDGE_TIMEOUT):
                        await sb.exec(command)
                    await anyio.lowlevel.checkpoint()
        assert len(stopped) == 4
    finally:
        for pid in stopped:  # the wedge ends: the daemon can remove the containers
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        if containers:
            with anyio.fail_after(60), anyio.CancelScope(shield=True):
                await anyio.run_process(["docker", "rm", "-f", *containers], check=False)


async def test_a_command_killed_as_it_starts_is_never_lost() -> None:
    """A KILL that reaches the agent right behind its START (a command cancelled as it
    starts) ends the command at once. The shepherd keeps SIGTERM blocked and waits for it
    with sigwaitinfo: run by a handler, a kill that came before the handler was installed,
    or just before the shepherd's blocking wait, was acted on only once the command ended
    by itself; the command ran on, its exec 'lost' (CI; failed 7 of ~64 runs under load)."""
    async with Session(backend(), sweep=False) as s, s.sandbox() as sb:
        await sb.exec(["true"])
        for attempt in range(60):
            with anyio.move_on_after((attempt % 15) * 0.002):
                await sb.exec(["sleep", "30"])
        assert (await sb.exec(["echo", "alive"])).stdout == b"alive\n"
