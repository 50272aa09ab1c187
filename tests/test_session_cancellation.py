"""Cancellation, on the fake backend: cancelled execs and starts leave nothing and release
their slots, cleanup runs when the session itself is cancelled, and a stream left early
kills its command. Every test runs on asyncio and trio."""

from __future__ import annotations

import anyio
import anyio.lowlevel
import pytest

from asyncsandbox import ExecFailed, Limits
from asyncsandbox.testing import FakeBackend, FakeProcess

from ._session_support import session


async def test_cancelling_many_execs_removes_everything() -> None:
    fake = FakeBackend()
    async with session(fake) as s:
        with anyio.move_on_after(0.1):
            async with anyio.create_task_group() as tg:
                for _ in range(50):
                    tg.start_soon(s.run, ["sleep", "30"])
        stats = s.statistics()
        assert stats.live.active == 0
        assert stats.execs.active == 0
    assert fake.world.live == 0


async def test_cancelled_start_releases_its_slot() -> None:
    fake = FakeBackend(create_delay=1)
    async with session(fake, limits=Limits(max_live=1)) as s:
        with anyio.move_on_after(0.05):
            await s.sandbox().start()
        assert s.statistics().live.active == 0
        fake.create_delay = 0
        async with s.sandbox() as sb:
            assert (await sb.exec(["true"])).ok


async def test_cleanup_runs_even_when_the_session_is_cancelled() -> None:
    fake = FakeBackend(remove_delay=0.05)
    with anyio.move_on_after(0.1):
        async with session(fake) as s:
            for _ in range(5):
                await s.sandbox().start()
            await anyio.sleep_forever()  # until the deadline cancels the session's body
    assert fake.world.live == 0  # removal was shielded


async def test_exec_stream_leaving_early_kills_the_command() -> None:
    killed = anyio.Event()

    async def chatty(p: FakeProcess) -> int:
        try:
            while True:
                await p.write("stdout", b"line\n")
                await anyio.lowlevel.checkpoint()
        finally:
            killed.set()

    async with session(FakeBackend(commands={"chatty": chatty})) as s, s.sandbox() as sb:
        async with sb.exec_stream(["chatty"]) as run:
            async for chunk in run:
                assert chunk.data == b"line\n"
                break
        with anyio.fail_after(2):
            await killed.wait()


async def test_exec_stream_errors_come_from_wait() -> None:
    async with session() as s, s.sandbox() as sb, sb.exec_stream(["false"], check=True) as run:
        with pytest.raises(ExecFailed):
            await run.wait()


async def test_exec_stream_body_error_is_not_wrapped_in_a_group() -> None:
    class Boom(Exception):
        pass

    async with session() as s, s.sandbox() as sb:
        with pytest.raises(Boom):
            async with sb.exec_stream(["sleep", "10"]):
                raise Boom
