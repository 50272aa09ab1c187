"""The deepagents sandbox backend (``asyncsandbox_langchain.SandboxBackend``) under
LangChain's own standard suite, ``SandboxIntegrationTests`` from langchain-tests, run
unchanged on the process backend (a deepagents/langchain-tests pair pinned in
pyproject.toml); then what the suite does not check: deepagents' timeout convention, and
infrastructure failures raised apart from a command's results.

The suite's fixture is class-scoped and sync, and its tests are both sync and async
(asyncio only: they use ``asyncio.TaskGroup``): the sandbox lives in a blocking portal's
event loop, which the sync calls block on and the async calls hand over to."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import anyio.from_thread
import pytest
from asyncsandbox_langchain import SandboxBackend
from langchain_tests.integration_tests import SandboxIntegrationTests

from asyncsandbox import LaunchError, SandboxDefaults, SandboxDied, Session
from asyncsandbox.testing import FakeBackend, FakeProcess

# The sandbox image has python3, and the suite runs `python`.
PYTHON = 'mkdir -p /tmp/.bin && ln -sf "$(command -v python3)" /tmp/.bin/python'
PATH = "/tmp/.bin:/usr/local/bin:/usr/bin:/bin"


pytestmark = pytest.mark.filterwarnings(
    # The suite's own class-scoped fixture (sandbox_backend) is an instance method.
    "ignore:Class-scoped fixtures defined as instance methods:pytest.PytestRemovedIn10Warning"
)


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"  # the suite's async tests use asyncio.TaskGroup


async def _started(session: Session) -> SandboxBackend:
    sandbox = await session.sandbox(env={"PATH": PATH}).start()
    await sandbox.exec(["sh", "-c", PYTHON], check=True)
    return SandboxBackend(sandbox)


@pytest.mark.slow  # the full standard suite; the tests below stay in the default run
class TestProcessBackend(SandboxIntegrationTests):
    @pytest.fixture(scope="class")
    @classmethod
    def sandbox(cls, module_process_root: Path) -> Iterator[SandboxBackend]:
        options = {"root": str(module_process_root)}
        with anyio.from_thread.start_blocking_portal() as portal:
            session = Session("process", backend_options=options)
            with portal.wrap_async_context_manager(session):
                yield portal.call(_started, session)


# -- beyond the suite -----------------------------------------------------------------------


async def test_a_timeout_is_deepagents_exit_124_and_the_command_is_killed(
    process_root: Path,
) -> None:
    async with Session("process", backend_options={"root": str(process_root)}) as session:
        backend = SandboxBackend(await session.sandbox().start())
        assert (await backend.aexecute("true")).exit_code == 0  # its executor up
        slow = await backend.aexecute(
            "echo partial; exec flock held sh -c 'touch locked; exec sleep 60'", timeout=5
        )  # (5 s: the output before the kill is asserted; CI's load can delay a first line)
        assert slow.exit_code == 124
        assert slow.output.startswith("partial\n")
        assert "Error: Command timed out after 5 seconds (custom timeout)." in slow.output
        # The sleep held a lock on `held`: it is free, so the sleep was killed.
        assert (await backend.aexecute("test -e locked && flock -n held true")).exit_code == 0


async def _sh(process: FakeProcess) -> int:
    """The fake backend's ``sh -c COMMAND``: succeeds without doing anything."""
    return 0


async def test_infrastructure_failures_raise_and_are_never_results() -> None:
    fake = FakeBackend(commands={"sh": _sh})
    async with Session(fake, sweep=False) as session:
        backend = SandboxBackend(await session.sandbox().start())
        assert (await backend.aexecute("true")).exit_code == 0
        fake.break_launcher(backend.id)
        with pytest.raises(LaunchError):
            await backend.aexecute("true")
        fake.break_launcher(backend.id, None)
        fake.kill(backend.id)
        with pytest.raises(SandboxDied):
            await backend.aexecute("true")
        with pytest.raises(SandboxDied):
            await backend.adownload_files(["/workspace/x"])


def test_sync_calls_from_the_sandboxs_own_loop_are_refused(process_root: Path) -> None:
    async def main() -> None:
        options = {"root": str(process_root)}
        async with Session("process", backend_options=options, defaults=SandboxDefaults()) as s:
            backend = SandboxBackend(await s.sandbox().start())
            with pytest.raises(RuntimeError, match="use the async variant"):
                backend.execute("true")
            assert (await backend.aexecute("echo native")).output == "native\n"

    anyio.run(main)
