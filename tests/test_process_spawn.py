"""The processes the process backend starts and the pipes to them
(asyncsandbox/_process/_spawn.py), on every mechanism: a command outlives the thread that
started it, a file error is judged on all its script said, a pipe closed under its reader
leaves its number alone, and an exit status reaped by someone else is an error."""

from __future__ import annotations

import os
import signal
from pathlib import Path

import anyio
import pytest

from asyncsandbox import FileErrorReason, InfrastructureError, SandboxFileError, Session
from asyncsandbox._process._spawn import Pipe

from . import _process_support as process
from ._process_support import session
from ._support import PROCESS_MECHANISMS, mechanism_unavailable, process_options

# The process family's fixture (tests/_process_support.py), this module's by name.
anyio_backend = process.anyio_backend


@pytest.mark.parametrize("anyio_backend", ["trio"])
@pytest.mark.parametrize("mechanism", PROCESS_MECHANISMS)
async def test_a_command_outlives_the_thread_that_started_it(
    mechanism: str, process_root: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A launcher dies with the thread that forked it (PR_SET_PDEATHSIG, bwrap's
    --die-with-parent). trio forks its subprocesses in a worker thread that exits after ten
    idle seconds (0.2 s here): every command running longer was SIGKILLed (status 137)."""
    if reason := mechanism_unavailable(mechanism):
        pytest.skip(reason)
    import trio

    monkeypatch.setattr(trio._core._thread_cache, "IDLE_TIMEOUT", 0.2)
    async with (
        session(process_root, backend_options=process_options(mechanism)) as s,
        s.sandbox() as sb,
    ):
        result = await sb.exec(["sh", "-c", "sleep 1.5; echo done"], timeout=30)
        assert (result.returncode, result.stdout) == (0, b"done\n")
        result = await sb.exec(["echo", "again"], timeout=30)
        assert (result.returncode, result.stdout) == (0, b"again\n")


@pytest.mark.parametrize("mechanism", PROCESS_MECHANISMS)
async def test_a_file_error_is_judged_on_all_it_said(mechanism: str, process_root: Path) -> None:
    """A file operation's script says why it failed on stderr, then exits; its reason was
    taken from whatever stderr had been read when the exit was seen (nothing, at times:
    PERMISSION became OTHER; busy event loops made it likelier, hence several sandboxes)."""
    if reason := mechanism_unavailable(mechanism):
        pytest.skip(reason)
    reasons: list[FileErrorReason] = []

    async def refused_writes(s: Session) -> None:
        async with s.sandbox() as sb:
            await sb.write_file("locked/f", b"x")
            await sb.exec(["chmod", "a-w", "locked/f", "locked"])
            for _ in range(40):
                with pytest.raises(SandboxFileError) as caught:
                    await sb.write_file("locked/f", b"y")
                reasons.append(caught.value.reason)

    async with (
        session(process_root, backend_options=process_options(mechanism)) as s,
        anyio.create_task_group() as tg,
    ):
        for _ in range(6):
            tg.start_soon(refused_writes, s)
    assert set(reasons) == {FileErrorReason.PERMISSION}


async def test_a_pipe_closed_under_its_reader_leaves_its_number_alone() -> None:
    """Closing a pipe that a task waits on, then waiting on a new descriptor that took its
    number: the new wait must still wake. On anyio's asyncio backend the first waiter,
    resuming late, unregistered the new descriptor's wait (a new executor's stderr was
    waited on forever: 1,000 sandboxes through max_live=64 hung at random)."""
    first_r, first_w = os.pipe()
    first = Pipe(first_r)
    async with anyio.create_task_group() as tg:
        tg.start_soon(first.receive)
        await anyio.wait_all_tasks_blocked()  # the reader waits
        first.close()
        second_r, second_w = os.pipe()
        second = Pipe(second_r)

        async def write_once_waited_on() -> None:
            # Once the first reader has resumed (late: after the second wait began, below)
            # and the second one waits.
            await anyio.wait_all_tasks_blocked()
            os.write(second_w, b"x")

        tg.start_soon(write_once_waited_on)
        with anyio.fail_after(5):
            assert await second.receive() == b"x"
    second.close()
    for fd in (first_w, second_w):
        os.close(fd)


@pytest.mark.parametrize("mechanism", PROCESS_MECHANISMS)
async def test_an_exit_status_reaped_by_someone_else_is_an_error_never_a_zero(
    mechanism: str, process_root: Path
) -> None:
    """With SIGCHLD ignored (some libraries do it to avoid zombies) the kernel reaps our
    launchers itself and their exit status is gone: ``Popen.poll`` then says 0, and a
    failing command passed. The executor's commands report through its socket and keep
    their status; a launcher's is an InfrastructureError."""
    if reason := mechanism_unavailable(mechanism):
        pytest.skip(reason)
    async with (
        session(process_root, backend_options=process_options(mechanism)) as s,
        s.sandbox() as sb,
    ):
        await sb.exec(["true"])  # the executor (if any) started while SIGCHLD is default
        previous = signal.signal(signal.SIGCHLD, signal.SIG_IGN)
        try:
            if mechanism in ("executor", "gvisor"):
                assert (await sb.exec(["sh", "-c", "exit 3"])).returncode == 3
            else:
                with pytest.raises(InfrastructureError, match="exit status is lost"):
                    await sb.exec(["sh", "-c", "exit 3"])
        finally:
            signal.signal(signal.SIGCHLD, previous)
        assert (await sb.exec(["sh", "-c", "exit 3"])).returncode == 3
