"""Background operations, on the fake backend: submit, wait and as_completed; an
operation's error stays in its handle, cancelling it kills its command, and the session's
close cancels it. Every async test runs on asyncio and trio."""

from __future__ import annotations

import anyio
import anyio.lowlevel
import pytest

import asyncsandbox
from asyncsandbox import ExecFailed, InvalidArgument, OperationCancelled, SandboxClosed
from asyncsandbox.testing import FakeBackend

from ._session_support import session


async def test_submit_wait_and_as_completed() -> None:
    async with session() as s:
        # Far apart: a loaded CI started the last sandbox 0.1 s after the first, and runs of
        # 0.15 s and 0.08 s then ended in the other order.
        ops = [s.submit(s.run(["sleep", str(d)]), name=f"sleep-{d}") for d in (1.0, 0.01, 0.4)]
        done, pending = await asyncsandbox.wait(ops, num_returns=1)
        assert [op.name for op in done] == ["sleep-0.01"]
        assert len(pending) == 2
        order = [op.name async for op in asyncsandbox.as_completed(pending)]
        assert order == ["sleep-0.4", "sleep-1.0"]
        assert all([(await op).ok for op in ops])


async def test_operation_errors_stay_in_the_handle() -> None:
    async with session() as s:
        bad = s.submit(s.run(["false"], check=True))
        good = s.submit(s.run(["true"]))
        done, _ = await asyncsandbox.wait([bad, good])
        assert len(done) == 2
        assert isinstance(bad.exception(), ExecFailed)
        with pytest.raises(ExecFailed):
            await bad
        assert (await good).ok


async def test_cancelled_operation_kills_its_command() -> None:
    fake = FakeBackend()
    async with session(fake) as s:
        op = s.submit(s.run(["sleep", "30"]))
        await anyio.wait_all_tasks_blocked()  # the command runs
        assert fake.world.live == 1
        op.cancel()
        with pytest.raises(OperationCancelled):
            await op
        assert op.cancelled()
        assert fake.world.live == 0


async def test_session_close_cancels_operations() -> None:
    fake = FakeBackend()
    async with session(fake) as s:
        op = s.submit(s.run(["sleep", "30"]))
        await anyio.wait_all_tasks_blocked()  # the command runs
    assert op.cancelled()
    assert fake.world.live == 0
    with pytest.raises(SandboxClosed):
        s.submit(anyio.lowlevel.checkpoint())


async def test_wait_timeout_and_validation() -> None:
    async with session() as s:
        op = s.submit(anyio.sleep_forever())
        done, pending = await asyncsandbox.wait([op], timeout=0.01)
        assert done == []
        assert pending == [op]
        with pytest.raises(TimeoutError):
            async for _ in asyncsandbox.as_completed([op], timeout=0.01):
                pass
        not_an_operation = anyio.lowlevel.checkpoint()
        with pytest.raises(InvalidArgument, match="Operation handles"):
            await asyncsandbox.wait([not_an_operation])  # type: ignore[list-item]
        not_an_operation.close()
        with pytest.raises(InvalidArgument, match="a list of operations"):
            asyncsandbox.wait(op)  # type: ignore[arg-type, unused-coroutine]
        op.cancel()


def test_wait_and_as_completed_reject_sync_handles_when_called() -> None:
    """Called without await on the blocking facade's handles, they raise at once instead
    of returning a coroutine that never runs."""
    from asyncsandbox.sync import SyncSession

    with SyncSession(FakeBackend(), sweep=False) as s:
        handle = s.sandbox().exec(["true"])
        for function in (asyncsandbox.wait, asyncsandbox.as_completed):
            with pytest.raises(InvalidArgument) as info:
                function([handle])  # type: ignore[list-item]
            name = function.__name__
            assert f"for Handles of asyncsandbox.sync use asyncsandbox.sync.{name}()" in str(
                info.value
            )
        assert handle.result().returncode == 0
