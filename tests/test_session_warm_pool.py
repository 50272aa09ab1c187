"""The warm pool, on the fake backend: it hands over ready sandboxes and refills, never
shares one, replaces old ones, and checks its settings. Every async test runs on asyncio
and trio."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from asyncsandbox import InvalidArgument, Session
from asyncsandbox.testing import FakeBackend

from ._session_support import session
from ._support import eventually_async


async def wait_for(predicate: Callable[[], bool]) -> None:
    await eventually_async(predicate, within=5)


async def test_warm_pool_hands_over_and_refills() -> None:
    from asyncsandbox import WarmPool

    fake = FakeBackend(create_delay=0.02)
    async with session(fake, warm_pool=WarmPool(size=4)) as s:
        await wait_for(lambda: s.statistics().pool_ready == 4)
        pooled = set(fake.world.sandboxes)
        async with s.sandbox() as sb:  # the default spec: served from the pool
            assert sb.id in pooled
            assert (await sb.exec(["echo", "pooled"])).stdout == b"pooled\n"
            async with s.sandbox(tags=["other"]) as other:  # another spec: created as usual
                assert other.id not in pooled
                await other.exec(["true"])
        stats = s.statistics()
        assert stats.pool_hits == 1
        await wait_for(lambda: s.statistics().pool_ready == 4)  # refilled
        assert stats.live.peak_active <= 6
    assert fake.world.live == 0  # the session removed the pool too


async def test_warm_pool_sandboxes_are_never_shared() -> None:
    from asyncsandbox import WarmPool

    async with session(warm_pool=WarmPool(size=2)) as s:
        await wait_for(lambda: s.statistics().pool_ready == 2)
        first = await s.sandbox().start()
        await first.write_file("secret", b"episode 1")
        await first.stop()
        await wait_for(lambda: s.statistics().pool_ready == 2)
        seen = set()
        for _ in range(4):
            async with s.sandbox() as sb:
                assert sb.id != first.id
                assert sb.id not in seen
                seen.add(sb.id)
                with pytest.raises(Exception, match="not found"):
                    await sb.read_file("secret")


async def test_warm_pool_replaces_old_sandboxes() -> None:
    from asyncsandbox import WarmPool

    fake = FakeBackend()
    async with session(fake, warm_pool=WarmPool(size=2, max_age=0.05)):
        await wait_for(lambda: fake.world.created >= 6)  # three generations at least
        await wait_for(lambda: fake.world.live <= 2 + 2)
    assert fake.world.live == 0


def test_warm_pool_validation() -> None:
    from asyncsandbox import WarmPool

    with pytest.raises(InvalidArgument, match="size"):
        WarmPool(size=0)
    with pytest.raises(InvalidArgument, match="shorter than"):
        Session(FakeBackend(), warm_pool=WarmPool(size=1, max_age=7200))
