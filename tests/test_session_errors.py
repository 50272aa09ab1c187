"""How the runtime meets failures, on the fake backend: deadlines and retries (of a
backend's retryable errors, never of commands), and errors mapped to the tree users catch
(a backend's bug, a dead sandbox, a nonzero exit, a command's timeout). Every test runs on
asyncio and trio."""

from __future__ import annotations

import anyio
import pytest
import structlog

from asyncsandbox import (
    BackendTimeout,
    BackendUnavailable,
    ExecFailed,
    ExecTimeout,
    InfrastructureError,
    RetryPolicy,
    SandboxDied,
    Timeouts,
)
from asyncsandbox.testing import FakeBackend, FakeProcess

from ._session_support import session

# -- deadlines and retries ----------------------------------------------------------------


async def test_create_deadline_raises_backend_timeout_and_leaves_nothing() -> None:
    fake = FakeBackend(create_delay=10)
    async with session(fake, timeouts=Timeouts(create=0.05)) as s:
        with pytest.raises(BackendTimeout) as info:
            await s.sandbox().start()
        assert isinstance(info.value, TimeoutError)
        assert s.statistics().live.active == 0
        assert s.statistics().start_failures == 1
    assert fake.world.live == 0


async def test_retryable_create_errors_are_retried() -> None:
    fake = FakeBackend(create_failures=2)
    retries = RetryPolicy(attempts=3, backoff=0.001)
    with structlog.testing.capture_logs() as logs:
        async with session(fake, retries=retries) as s, s.sandbox() as sb:
            assert (await sb.exec(["true"])).ok
    assert [e["event"] for e in logs].count("backend.retry") == 2


async def test_retries_give_up_after_the_policy() -> None:
    fake = FakeBackend(create_failures=5)
    async with session(fake, retries=RetryPolicy(attempts=2, backoff=0.001)) as s:
        with pytest.raises(BackendUnavailable):
            await s.sandbox().start()
    assert fake.create_failures == 3  # two attempts were made


async def test_commands_are_never_retried() -> None:
    calls = 0

    async def flaky(p: FakeProcess) -> int:
        nonlocal calls
        calls += 1
        raise BackendUnavailable("transport dropped", retryable=True)

    fake = FakeBackend(commands={"flaky": flaky})
    async with session(fake) as s, s.sandbox() as sb:
        with pytest.raises(BackendUnavailable):
            await sb.exec(["flaky"])
    assert calls == 1


# -- error mapping ------------------------------------------------------------------------


async def test_unexpected_backend_errors_become_infrastructure_errors() -> None:
    async def buggy(p: FakeProcess) -> int:
        raise KeyError("bug in backend")

    async with session(FakeBackend(commands={"buggy": buggy})) as s, s.sandbox() as sb:
        with pytest.raises(InfrastructureError) as info:
            await sb.exec(["buggy"])
    assert isinstance(info.value.__cause__, KeyError)


async def test_a_dead_sandbox_stays_dead_and_can_still_be_stopped() -> None:
    fake = FakeBackend()
    async with session(fake) as s:
        sb = await s.sandbox().start()
        assert sb.id is not None
        fake.kill(sb.id, "OOM")
        with pytest.raises(SandboxDied, match="OOM"):
            await sb.exec(["true"])
        with pytest.raises(SandboxDied):
            await sb.read_file("x")
        await sb.stop()
    assert fake.world.live == 0


async def test_nonzero_exit_is_data_and_check_raises() -> None:
    async with session() as s, s.sandbox() as sb:
        result = await sb.exec(["false"])
        assert result.returncode == 1
        assert not result.ok
        with pytest.raises(ExecFailed) as info:
            await sb.exec(["false"], check=True)
        assert info.value.result.returncode == 1


async def test_timeout_raises_with_partial_output_and_counts() -> None:
    async def slow(p: FakeProcess) -> int:
        await p.write("stdout", b"partial")
        await anyio.sleep_forever()  # until its timeout kills it
        return 0

    async with session(FakeBackend(commands={"slow": slow})) as s, s.sandbox() as sb:
        with pytest.raises(ExecTimeout) as info:
            await sb.exec(["slow"], timeout=0.05)
        assert info.value.result.stdout == b"partial"
        assert info.value.result.timed_out
        assert info.value.result.returncode == 137
        assert s.statistics().execs_timed_out == 1
