"""The session's limits, on the fake backend: max_live, max_execs and the lifecycle limit
never exceeded, waiters served first come first served, capacity timeouts that leak no
slot, the warning a long wait logs, and a repr that shows them. Every test runs on asyncio
and trio."""

from __future__ import annotations

import anyio
import pytest
import structlog

from asyncsandbox import CapacityTimeout, InfrastructureError, InvalidArgument, Limits
from asyncsandbox.testing import FakeBackend

from ._session_support import session
from ._support import eventually_async


def warning_timers() -> list[str]:
    """The capacity limiters' warning timers running now (one beside each wait for a slot
    while ``capacity_warning`` is set; each fires once, after the delay, and ends)."""
    names = (task.name or "" for task in anyio.get_running_tasks())
    return [name for name in names if name.endswith("._warn_later")]


async def test_max_live_is_never_exceeded() -> None:
    fake = FakeBackend(create_delay=0.001, remove_delay=0.001)
    async with session(fake, limits=Limits(max_live=8, max_lifecycle=4)) as s:
        async with anyio.create_task_group() as tg:
            for _ in range(200):
                tg.start_soon(s.run, ["sleep", "0.002"])
        stats = s.statistics()
    assert stats.live.peak_active == 8
    assert fake.world.peak_live <= 8
    assert stats.lifecycle.peak_active <= 4
    assert stats.sandboxes_started == stats.sandboxes_removed == 200
    assert stats.live.wait_seconds_total > 0


async def test_waiting_is_first_come_first_served() -> None:
    order: list[int] = []
    release = anyio.Event()
    async with session(limits=Limits(max_live=1)) as s:

        async def run(i: int) -> None:
            async with s.sandbox():
                order.append(i)
                await release.wait()

        async with anyio.create_task_group() as tg:
            for i in range(10):
                tg.start_soon(run, i)
                await anyio.wait_all_tasks_blocked()  # arrive in order: queued before the next
            assert order == [0]
            release.set()
    assert order == list(range(10))


async def test_exec_limit_counts_and_bounds() -> None:
    async with session(limits=Limits(max_execs=3)) as s:
        sb = await s.sandbox().start()
        async with anyio.create_task_group() as tg:
            for _ in range(12):
                tg.start_soon(sb.exec, ["sleep", "0.01"])
        stats = s.statistics().execs
    assert stats.peak_active == 3
    assert stats.acquired == 12
    assert stats.active == stats.waiting == 0


async def test_capacity_timeout_raises_and_leaks_no_slot() -> None:
    async with session(limits=Limits(max_live=1, capacity_timeout=0.05)) as s:
        holder = await s.sandbox().start()
        with pytest.raises(CapacityTimeout) as info:
            await s.sandbox().start()
        assert isinstance(info.value, TimeoutError)
        assert isinstance(info.value, InfrastructureError)
        await holder.stop()
        async with s.sandbox() as sb:  # the slot is free again
            await sb.exec(["true"])
        assert s.statistics().live.active == 0


async def test_a_long_wait_for_capacity_is_logged_with_its_likely_cause() -> None:
    """The seeds' pattern, `session.sandbox().exec(...)` without a stop, fills max_live:
    the next start waits, and after `capacity_warning` seconds a warning says why."""
    with structlog.testing.capture_logs() as logs:
        async with session(limits=Limits(max_live=2, capacity_warning=0.2)) as s:
            for _ in range(2):
                await s.sandbox().exec(["true"])  # never stopped
            async with anyio.create_task_group() as tg:
                for _ in range(3):
                    tg.start_soon(s.run, ["true"])
                await eventually_async(lambda: s.statistics().live.waiting == 3)
                # Each waiter's timer has fired: still one warning.
                await eventually_async(lambda: not warning_timers(), what="the timers fired")
                assert s.statistics().live.waiting == 3
                tg.cancel_scope.cancel()
            assert s.statistics().live.active == 2  # the cancelled waits took no slot
    warnings = [e for e in logs if e["event"] == "session.capacity.waiting"]
    assert len(warnings) == 1
    warning = warnings[0]
    assert warning["log_level"] == "warning"
    assert (warning["limit"], warning["active"], warning["max"]) == ("live", 2, 2)
    assert warning["waited_seconds"] >= 0.2
    assert "2/2 in use, 3 waiting" in warning["message"]
    assert "never stopped" in warning["message"]
    assert "2 of the 2 live sandboxes run no command right now" in warning["message"]


async def test_capacity_warning_off_and_fifo_kept_with_it() -> None:
    with structlog.testing.capture_logs() as logs:
        async with (
            session(limits=Limits(max_live=1, capacity_warning=None)) as s,
            s.sandbox(),
        ):
            with anyio.move_on_after(0.3):
                await s.sandbox().start()
    assert not [e for e in logs if e["event"] == "session.capacity.waiting"]
    order: list[int] = []
    release = anyio.Event()
    async with session(limits=Limits(max_live=1, capacity_warning=0.01)) as s:

        async def run(i: int) -> None:
            async with s.sandbox():
                order.append(i)
                await release.wait()

        async with anyio.create_task_group() as tg:
            for i in range(6):
                tg.start_soon(run, i)
                await anyio.wait_all_tasks_blocked()  # arrive in order: queued before the next
            # Held past the warning delay: every waiter's timer fires while it waits.
            await eventually_async(lambda: not warning_timers(), what="the timers fired")
            assert order == [0]
            release.set()
    assert order == list(range(6))
    with pytest.raises(InvalidArgument):
        Limits(capacity_warning=-1)


async def test_capacity_timeout_with_a_warning_timer_leaks_no_slot() -> None:
    async with session(limits=Limits(max_live=1, capacity_timeout=0.1, capacity_warning=0.05)) as s:
        holder = await s.sandbox().start()
        with pytest.raises(CapacityTimeout):
            await s.sandbox().start()
        await holder.stop()
        assert s.statistics().live.active == 0
        async with s.sandbox() as sb:
            await sb.exec(["true"])


async def test_repr_shows_limits() -> None:
    async with session(limits=Limits(max_live=4)) as s:
        await s.sandbox().start()
        assert "live: 1/4 active, 0 waiting" in repr(s)
