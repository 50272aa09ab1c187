"""Docker with gVisor: ``DockerBackend(runtime="runsc")`` on the real engine, the fast path
(the agent inside the container) included.

Needs a daemon with the ``runsc`` runtime (``.ci/docker.sh`` configures it, as
``DockerBackend``'s docstring says); skipped without one, failed instead with
``ASYNCSANDBOX_REQUIRE_GVISOR=1`` (CI).
"""

from __future__ import annotations

import os

import pytest
from asyncsandbox_docker import DockerBackend

from asyncsandbox import BackendUnavailable, Resources, SandboxDefaults, Session
from asyncsandbox.testing import CHECKS, Check

from ._support import FORK_UNTIL_REFUSED, docker_test_image, require_runsc_runtime

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
