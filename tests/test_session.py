"""Runtime policy, tested on the FakeBackend: limits, deadlines, retries, error mapping,
cancellation, background operations. Every test runs on asyncio and trio."""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from typing import Any

import anyio
import anyio.lowlevel
import pytest
import structlog

import asyncsandbox
from asyncsandbox import (
    BackendNotFound,
    BackendTimeout,
    BackendUnavailable,
    CapacityTimeout,
    ExecFailed,
    ExecTimeout,
    InfrastructureError,
    InvalidArgument,
    Limits,
    OperationCancelled,
    RetryPolicy,
    SandboxClosed,
    SandboxDefaults,
    SandboxDied,
    SandboxNotFound,
    Session,
    Timeouts,
    _owner,
)
from asyncsandbox.testing import FakeBackend, FakeProcess, FakeWorld

from ._support import eventually_async


def session(backend: FakeBackend | None = None, **kwargs: Any) -> Session:
    kwargs.setdefault("sweep", False)
    return Session(backend or FakeBackend(), **kwargs)


def warning_timers() -> list[str]:
    """The capacity limiters' warning timers running now (one beside each wait for a slot
    while ``capacity_warning`` is set; each fires once, after the delay, and ends)."""
    names = (task.name or "" for task in anyio.get_running_tasks())
    return [name for name in names if name.endswith("._warn_later")]


async def lifetime_over(world: FakeWorld, sandbox_id: str) -> None:
    """Wait until the clock passes the expiry that ``max_lifetime`` wrote on the sandbox."""
    expires = float(world.sandboxes[sandbox_id].spec.labels[_owner.EXPIRES])
    await eventually_async(lambda: time.time() > expires, what="the lifetime is over")


# -- lifecycle ----------------------------------------------------------------------------


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


# -- limits -------------------------------------------------------------------------------


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


# -- validation: bad input is refused before anything happens ------------------------------


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"argv": "ls -la"}, "sh', '-c'"),
        ({"argv": []}, "non-empty"),
        ({"argv": ["echo", 3]}, "argv\\[1\\] must be a str"),
        ({"argv": ["echo", "a\x00b"]}, "NUL"),
        ({"timeout": -1}, ">= 0"),
        ({"timeout": math.nan}, "NaN"),
        ({"timeout": math.inf}, "finite"),
        ({"timeout": True}, "number of seconds"),
        ({"env": {"A": None}}, "must be a str"),
        ({"env": ["A=1"]}, "mapping"),
        ({"cwd": "a\x00"}, "NUL"),
        ({"stdin": 5}, "stdin must be"),
        ({"check": "yes"}, "check must be a bool"),
        ({"max_output_bytes": 0}, ">= 1"),
    ],
)
async def test_bad_exec_arguments_are_refused_before_starting(
    kwargs: dict[str, Any], message: str
) -> None:
    fake = FakeBackend()
    async with session(fake) as s:
        sb = s.sandbox()
        args = {"argv": ["true"], **kwargs}
        with pytest.raises(InvalidArgument, match=message):
            await sb.exec(**args)
        assert sb.state == "new"
        assert fake.world.created == 0


async def test_bad_file_arguments() -> None:
    async with session() as s, s.sandbox() as sb:
        with pytest.raises(InvalidArgument):
            await sb.write_file("x", 123)  # type: ignore[arg-type]
        with pytest.raises(InvalidArgument, match="permission number"):
            await sb.write_file("x", b"", mode=0o100000)
        with pytest.raises(InvalidArgument, match="longer than"):
            await sb.read_file("a" * 5000)
        with pytest.raises(InvalidArgument, match="does not exist"):
            await sb.upload("/no/such/local/path", "dest")
        with pytest.raises(InvalidArgument, match="max_bytes"):
            await sb.read_file("x", max_bytes=0)


async def test_unknown_sandbox_option_and_network() -> None:
    async with session() as s:
        with pytest.raises(InvalidArgument, match="unknown sandbox option"):
            s.sandbox(imgae="x")
    fake = FakeBackend()
    fake._caps = fake._caps.__class__(isolation="x", network_modes=frozenset({"none"}))
    async with session(fake) as s:
        with pytest.raises(InvalidArgument, match="network='host'"):
            await s.sandbox(network="host").start()


def test_unknown_and_missing_backends_say_what_to_do() -> None:
    with pytest.raises(BackendNotFound, match=r"unknown backend 'nope'.*process"):
        asyncsandbox._registry.resolve_backend("nope")
    with pytest.raises(InvalidArgument):
        Session(42)  # type: ignore[arg-type]
    with pytest.raises(InvalidArgument, match="Limits"):
        Session(limits=SandboxDefaults())  # type: ignore[arg-type]


async def test_backend_that_is_not_installed(monkeypatch: pytest.MonkeyPatch) -> None:
    """A built-in name whose distribution is missing says what to install."""
    builtin = dict(asyncsandbox._registry._BUILTIN)
    builtin["ghost"] = ("asyncsandbox_ghost:GhostBackend", "asyncsandbox[ghost]")
    monkeypatch.setattr(asyncsandbox._registry, "_BUILTIN", builtin)
    with pytest.raises(BackendNotFound, match=r"pip install 'asyncsandbox\[ghost\]'"):
        async with Session("ghost"):
            pass


async def test_backend_that_does_not_support_this_async_library(anyio_backend: str) -> None:
    fake = FakeBackend(async_libraries=frozenset({"curio"}))
    with pytest.raises(InvalidArgument, match=f"does not run on {anyio_backend}"):
        async with session(fake):
            pass


# -- cancellation -------------------------------------------------------------------------


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


# -- operations ---------------------------------------------------------------------------


async def test_submit_wait_and_as_completed() -> None:
    async with session() as s:
        ops = [s.submit(s.run(["sleep", str(d)]), name=f"sleep-{d}") for d in (0.15, 0.01, 0.08)]
        done, pending = await asyncsandbox.wait(ops, num_returns=1)
        assert [op.name for op in done] == ["sleep-0.01"]
        assert len(pending) == 2
        order = [op.name async for op in asyncsandbox.as_completed(pending)]
        assert order == ["sleep-0.08", "sleep-0.15"]
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


# -- listing and garbage collection -------------------------------------------------------


async def test_gc_removes_sandboxes_of_dead_owners_and_expired_ones() -> None:
    world = FakeWorld()
    async with session(FakeBackend(world=world), defaults=SandboxDefaults(tags=("gc",))) as s:
        alive = await s.sandbox().start()
        dead = await s.sandbox().start()
        expired = await s.sandbox(max_lifetime=0.01).start()
        for sandbox, labels in ((dead, {_owner.OWNER: "vm-x/boot/1/2"}),):
            assert sandbox.id is not None
            world.sandboxes[sandbox.id].spec.labels.update(labels)
        # A dead owner on *this* host: a pid that does not exist.
        assert dead.id is not None
        host, boot = _owner._this_host()
        world.sandboxes[dead.id].spec.labels[_owner.OWNER] = f"{host}/{boot}/999999999/1"
        assert expired.id is not None
        await lifetime_over(world, expired.id)
        report = await s.gc(dry_run=True)
        assert {i.id: r for i, r in report} == {
            dead.id: "owner process is gone",
            expired.id: "max lifetime exceeded",
        }
        assert len(world.sandboxes) == 3
        await s.gc()
        assert set(world.sandboxes) == {alive.id}


async def test_session_start_sweeps_by_default() -> None:
    world = FakeWorld()
    async with session(FakeBackend(world=world)) as s:
        sb = await s.sandbox(max_lifetime=0.01).start()
        assert sb.id is not None
        world.sandboxes[sb.id].spec.labels[_owner.OWNER] = "elsewhere/boot/1/1"
        s._sandboxes.clear()  # forget it, as a crashed owner would
        s._runtime.live.release()
        await lifetime_over(world, sb.id)
    async with Session(FakeBackend(world=world)):
        pass
    assert world.live == 0


async def test_delete_requires_a_selector() -> None:
    async with session() as s:
        with pytest.raises(InvalidArgument, match="refusing"):
            await s.delete()
        with pytest.raises(InvalidArgument, match="single string"):
            await s.delete(ids="abc")
        with pytest.raises(InvalidArgument, match="status"):
            await s.list(status="sleeping")


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


# -- warm pool ------------------------------------------------------------------------------


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
