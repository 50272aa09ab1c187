"""A sandbox's life in a session, on the fake backend: started by its context or its first
use (once, however many ask), removed by its stop or the session's close, reached from
another session by attach; a stop while it runs or waits for capacity, and a session closed
under a start still waiting. Every test runs on asyncio and trio."""

from __future__ import annotations

import anyio
import pytest

from asyncsandbox import Limits, SandboxClosed, SandboxNotFound
from asyncsandbox.testing import FakeBackend, FakeWorld

from ._session_support import session


async def test_sandbox_context_manager_starts_and_removes() -> None:
    fake = FakeBackend()
    async with session(fake) as s:
        sb = s.sandbox()
        assert sb.state == "new"
        assert sb.id is None
        async with sb:
            assert sb.state == "running"
            assert fake.world.live == 1
            result = await sb.exec(["echo", "hi"])
            assert result.stdout == b"hi\n"
        assert sb.state == "closed"
        assert sb.id is not None  # kept for logs after stop
        assert fake.world.live == 0


async def test_first_use_starts_and_session_close_removes() -> None:
    fake = FakeBackend()
    async with session(fake) as s:
        sandboxes = [s.sandbox() for _ in range(5)]
        for sb in sandboxes:
            await sb.exec(["true"])
        assert fake.world.live == 5
    assert fake.world.live == 0
    assert all(sb.state == "closed" for sb in sandboxes)


async def test_attach_reaches_a_sandbox_of_another_session_and_leaves_it_to_its_creator() -> None:
    world = FakeWorld()
    async with session(FakeBackend(world=world)) as creator:
        made = creator.sandbox()
        await made.write_file("note", "kept")
        assert made.id is not None
        async with session(FakeBackend(world=world), limits=Limits(max_live=1)) as other:
            attached = await other.attach(made.id)
            assert attached.attached
            assert not made.attached
            assert (attached.id, attached.state) == (made.id, "running")
            assert await attached.read_file("note") == b"kept"
            await other.sandbox().exec(["true"])  # attaching took no live slot here
        assert world.live == 1  # the attaching session's close left it
        assert (await made.exec(["cat", "note"])).stdout == b"kept"
        async with session(FakeBackend(world=world)) as other:
            await (await other.attach(made.id)).stop()  # an explicit stop removes it
            assert world.live == 0
            with pytest.raises(SandboxNotFound):
                await other.attach(made.id)


async def test_concurrent_starts_create_once() -> None:
    fake = FakeBackend(create_delay=0.05)
    async with session(fake) as s:
        sb = s.sandbox()
        async with anyio.create_task_group() as tg:
            for _ in range(10):
                tg.start_soon(sb.exec, ["true"])
        assert fake.world.created == 1


async def test_session_is_single_use_and_sandbox_refuses_after_close() -> None:
    s = session()
    async with s:
        pass
    with pytest.raises(SandboxClosed):
        await s.__aenter__()
    with pytest.raises(SandboxClosed):
        s.sandbox()


async def test_using_a_session_that_is_not_open() -> None:
    s = session()
    sb = s.sandbox()
    with pytest.raises(SandboxClosed, match="not open"):
        await sb.start()


async def test_stop_while_exec_runs_raises_sandbox_closed_in_the_exec() -> None:
    async with session() as s:
        sb = await s.sandbox().start()
        errors: list[BaseException] = []

        async def run() -> None:
            try:
                await sb.exec(["sleep", "30"])
            except SandboxClosed as exc:
                errors.append(exc)

        async with anyio.create_task_group() as tg:
            tg.start_soon(run)
            await anyio.wait_all_tasks_blocked()  # the command runs
            await sb.stop()
        assert len(errors) == 1


async def test_stop_while_waiting_for_capacity_gives_up_at_once() -> None:
    async with session(limits=Limits(max_live=1)) as s:
        await s.sandbox().start()
        waiting = s.sandbox()
        outcome: list[BaseException] = []

        async def start() -> None:
            try:
                await waiting.start()
            except SandboxClosed as exc:
                outcome.append(exc)

        async with anyio.create_task_group() as tg:
            tg.start_soon(start)
            await anyio.wait_all_tasks_blocked()
            assert s.statistics().live.waiting == 1
            await waiting.stop()
        assert len(outcome) == 1
        assert s.statistics().live.waiting == 0


async def test_a_start_waiting_for_capacity_does_not_outlive_the_session() -> None:
    """A start still queued for a slot when the session closes must not create a sandbox
    afterwards (it would never be removed)."""
    fake = FakeBackend()
    outcome: list[BaseException] = []
    s = session(fake, limits=Limits(max_live=1))
    async with anyio.create_task_group() as tg, s:
        await s.sandbox().start()
        waiting = s.sandbox()

        async def start() -> None:
            try:
                await waiting.start()
            except SandboxClosed as exc:
                outcome.append(exc)

        tg.start_soon(start)
        await anyio.wait_all_tasks_blocked()  # queued for the slot
        assert s.statistics().live.waiting == 1
    assert len(outcome) == 1
    assert fake.world.live == 0
