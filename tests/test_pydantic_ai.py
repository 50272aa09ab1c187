"""The pydantic-ai workspace backend (``asyncsandbox_pydantic_ai.SandboxWorkspace``) under
pydantic-ai's own conformance suite, ``WorkspaceBackendSuite`` from the installed wheel,
run unchanged with every optional fixture provided (fresh backends, attach by ref,
destruction), on the process and Docker backends; then what the suite does not cover:
how each of our failures maps onto pydantic-ai's errors."""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path

import pytest
from asyncsandbox_pydantic_ai import PROVIDER, SandboxWorkspace
from pydantic_ai.workspaces import (
    Workspace,
    WorkspaceBackend,
    WorkspaceRef,
    WorkspaceTimeoutError,
    WorkspaceUnavailableError,
)
from pydantic_ai.workspaces.conformance import WorkspaceBackendSuite

from asyncsandbox import InfrastructureError, LaunchError, SandboxDefaults, Session
from asyncsandbox.testing import FakeBackend

from ._support import docker_test_image


async def destroy(backend: WorkspaceBackend) -> None:
    """Remove the sandbox behind ``backend`` as its owner does: its Session's stop."""
    assert isinstance(backend, SandboxWorkspace)
    await (await backend.sandbox()).stop()


class _Suite(WorkspaceBackendSuite):
    @pytest.fixture
    def backend(self, session: Session) -> WorkspaceBackend:
        return SandboxWorkspace(session)

    @pytest.fixture
    def fresh_backend(self, session: Session) -> Callable[[], WorkspaceBackend]:
        return lambda: SandboxWorkspace(session)

    @pytest.fixture
    def attach_backend(self, session: Session) -> Callable[[WorkspaceRef], WorkspaceBackend]:
        return lambda ref: SandboxWorkspace(session, ref=ref)

    @pytest.fixture
    def destroy_environment(self) -> Callable[[WorkspaceBackend], Awaitable[None]]:
        return destroy

    @pytest.mark.xfail(
        strict=True,
        reason=(
            "ours, by design: a command owns what it leaves behind, and its background "
            "processes, setsid daemons included, are killed when it ends (README: the verdict "
            "rule); pydantic-ai's contract keeps a detached process alive for a later run"
        ),
    )
    # One fixture more than the suite's (pytest passes fixtures by name): the loop.
    async def test_a_backend_attached_by_ref_reaches_a_detached_process(  # type: ignore[override]
        self,
        backend: WorkspaceBackend,
        attach_backend: Callable[[WorkspaceRef], WorkspaceBackend] | None,
        has_real_posix_shell: bool,
        anyio_backend: str,
    ) -> None:
        # It fails by waiting out the suite's 60 s hang guard: shown once, on the process
        # backend on asyncio (the kill itself is the conformance check exit_kills_background,
        # run on every backend and loop).
        if anyio_backend != "asyncio" or not isinstance(self, TestProcessBackend):
            pytest.xfail("shown on the process backend on asyncio (it waits 60 s)")
        await super().test_a_backend_attached_by_ref_reaches_a_detached_process(
            backend, attach_backend, has_real_posix_shell
        )


# The conformance suite is full-size (and its strict xfail waits out the suite's 60 s for a
# detached process, per backend and loop): slow. The error tests below stay in the default run.
@pytest.mark.slow
class TestProcessBackend(_Suite):
    @pytest.fixture
    async def session(self, process_root: Path) -> AsyncIterator[Session]:
        async with Session("process", backend_options={"root": str(process_root)}) as session:
            yield session


@pytest.mark.slow
@pytest.mark.docker
class TestDockerBackend(_Suite):
    @pytest.fixture
    def anyio_backend(self) -> str:
        return "asyncio"  # the docker backend runs on asyncio only

    @pytest.fixture
    async def session(self, docker_engine: None) -> AsyncIterator[Session]:
        defaults = SandboxDefaults(image=docker_test_image())
        async with Session("docker", defaults=defaults) as session:
            yield session


# -- errors ---------------------------------------------------------------------------------


@pytest.fixture
async def session(process_root: Path) -> AsyncIterator[Session]:
    async with Session("process", backend_options={"root": str(process_root)}) as session:
        yield session


async def test_the_ref_names_the_sandbox_and_reaches_it_from_another_session(
    session: Session, process_root: Path
) -> None:
    backend = SandboxWorkspace(session)
    assert backend.ref is None  # no I/O when built
    await Workspace(backend).write_text("kept.txt", "kept")
    sandbox = await backend.sandbox()
    assert backend.ref == WorkspaceRef(provider=PROVIDER, id=sandbox.id or "")
    options = {"root": str(process_root)}
    async with Session("process", backend_options=options, sweep=False) as other:
        attached = SandboxWorkspace(other, ref=backend.ref)
        assert await Workspace(attached).read_text("kept.txt") == "kept"
    # The attaching session closed; the sandbox is its creator's and lives on.
    assert (await backend.run(["cat", "kept.txt"])).stdout == "kept"
    with pytest.raises(ValueError, match="provider"):
        SandboxWorkspace(session, ref=WorkspaceRef(provider="local", id="/tmp"))


async def test_a_timeout_is_workspace_timeout_error_with_the_partial_output(
    session: Session,
) -> None:
    backend = SandboxWorkspace(session)
    await backend.run(["true"])  # the sandbox and its executor up: the timeout is the command's
    with pytest.raises(WorkspaceTimeoutError) as timed_out:
        # (5 s: the output before the kill is asserted; CI's load can delay a first line: at
        # 2 s, and with the sandbox's start inside the timeout, it once came too late)
        await backend.run("echo partial; sleep 60", shell=True, timeout=5)
    assert isinstance(timed_out.value, TimeoutError)
    assert timed_out.value.stdout == "partial\n"
    assert (await backend.run(["echo", "alive"])).stdout == "alive\n"  # the sandbox lives


async def test_a_removed_sandbox_is_unavailable_for_commands_and_files(
    session: Session,
) -> None:
    backend = SandboxWorkspace(session)
    await backend.run(["true"])
    assert backend.ref is not None
    assert await session.delete(ids=[backend.ref.id]) == [backend.ref.id]
    with pytest.raises(WorkspaceUnavailableError):
        await backend.run(["true"])
    with pytest.raises(WorkspaceUnavailableError):
        await backend.read_bytes("/workspace/anything")
    with pytest.raises(WorkspaceUnavailableError):
        await SandboxWorkspace(session, ref=backend.ref).working_dir()


async def test_infrastructure_failures_stay_ours_and_a_dead_sandbox_is_unavailable() -> None:
    """A command that could not be launched is not the environment's death: our typed
    infrastructure error propagates (for a durable engine to retry), never a command's
    result. A sandbox that died is ``WorkspaceUnavailableError``."""
    fake = FakeBackend()
    async with Session(fake, sweep=False) as session:
        backend = SandboxWorkspace(session)
        await backend.run(["true"])
        assert backend.ref is not None
        fake.break_launcher(backend.ref.id)
        with pytest.raises(LaunchError) as failed:
            await backend.run(["true"])
        assert isinstance(failed.value, InfrastructureError)
        fake.break_launcher(backend.ref.id, None)
        assert (await backend.run(["echo", "back"])).stdout == "back\n"
        fake.kill(backend.ref.id)
        with pytest.raises(WorkspaceUnavailableError):
            await backend.run(["true"])
