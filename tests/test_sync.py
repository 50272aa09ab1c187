"""The blocking facade (asyncsandbox.sync): handles, parallel collection, threads, misuse
from async code, cancellation and cleanup. Tests are sync: each drives its own event loop
thread (asyncio unless a test says trio)."""

from __future__ import annotations

import asyncio
import gc
import inspect
import re
import subprocess
import sys
import textwrap
import threading
import time
import uuid
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import anyio
import anyio.to_thread
import pytest
import trio

from asyncsandbox import (
    ExecFailed,
    ExecResult,
    ExecTimeout,
    FileErrorReason,
    InvalidArgument,
    Limits,
    OperationCancelled,
    Sandbox as AsyncSandbox,
    SandboxClosed,
    SandboxDefaults,
    SandboxDied,
    SandboxError,
    SandboxFileError,
    Session as AsyncSession,
    sync as sync_module,
)
from asyncsandbox.sync import (
    Handle,
    RunningEventLoopError,
    SyncSession,
    as_completed,
    wait,
)
from asyncsandbox.testing import FakeBackend, FakeProcess, probe

from ._support import eventually, processes_with, sandbox_dirs, unique_marker, until_printed


def process_session(root: Path, **kwargs: Any) -> SyncSession:
    return SyncSession("process", backend_options={"root": root}, sweep=False, **kwargs)


def fake_session(fake: FakeBackend | None = None, **kwargs: Any) -> SyncSession:
    return SyncSession(fake or FakeBackend(), sweep=False, **kwargs)


# -- public surface -------------------------------------------------------------------------


def test_public_surface_is_exported_and_documented() -> None:
    assert isinstance(sync_module.__all__, tuple)
    for name in sync_module.__all__:
        obj = getattr(sync_module, name)
        assert inspect.getdoc(obj), name
    defined = {
        name
        for name, obj in vars(sync_module).items()
        if not name.startswith("_")
        and (inspect.isclass(obj) or inspect.isfunction(obj))
        and obj.__module__ == sync_module.__name__
    }
    assert defined == set(sync_module.__all__)
    for cls in (SyncSession, sync_module.SyncSandbox, Handle):
        for name, member in vars(cls).items():
            if not name.startswith("_") and callable(member):
                assert inspect.getdoc(member), f"{cls.__name__}.{name}"


# -- lifecycle ------------------------------------------------------------------------------


def test_creating_starts_nothing_and_close_is_idempotent() -> None:
    threads = threading.active_count()
    session = fake_session()
    assert threading.active_count() == threads  # lazy: no event loop thread yet
    assert not session.closed
    session.close()
    session.close()
    assert session.closed
    with pytest.raises(SandboxClosed):
        session.sandbox()


def test_arguments_are_checked_at_construction() -> None:
    with pytest.raises(InvalidArgument):
        SyncSession(FakeBackend(), async_library="curio")  # type: ignore[arg-type]
    with pytest.raises(InvalidArgument):
        SyncSession(FakeBackend(), limits=3)  # type: ignore[arg-type]


def test_close_removes_sandboxes_and_cancels_pending_handles(process_root: Path) -> None:
    session = process_session(process_root)
    sandboxes = [session.sandbox() for _ in range(3)]
    for sb in sandboxes:
        assert sb.exec(["true"]).result().returncode == 0
    marker = f"sync-close-{uuid.uuid4().hex[:8]}"
    pending = sandboxes[0].exec(["sh", "-c", f"sleep 600 # {marker}"])
    eventually(lambda: bool(processes_with(marker)))
    assert len(sandbox_dirs(process_root)) == 3
    session.close()
    assert sandbox_dirs(process_root) == []
    assert all(sb.state == "closed" for sb in sandboxes)
    assert pending.cancelled()
    with pytest.raises(OperationCancelled):
        pending.result()
    assert processes_with(marker) == []
    session.close()  # twice is fine
    with pytest.raises(SandboxClosed):
        sandboxes[1].exec(["true"])


def test_context_managers(process_root: Path) -> None:
    with process_session(process_root) as session:
        with session.sandbox() as sb:
            assert sb.state == "running"
            sb.write_file("hello.txt", "hi\n").result()
            assert sb.read_file("hello.txt").result() == b"hi\n"
            assert sb.info().result().id == sb.id
            assert len(sandbox_dirs(process_root)) == 1
        assert sb.state == "closed"
        assert sandbox_dirs(process_root) == []
        result = session.run(["sh", "-c", "echo from run"], timeout=30).result()
        assert result.stdout == b"from run\n"
        # run()'s sandbox is recyclable: reset and kept for the next run(), not removed...
        assert len(sandbox_dirs(process_root)) == 1
        # ...unless asked otherwise (that one is removed; the recycled one stays).
        session.run(["true"], timeout=30, recyclable=False).result()
        assert len(sandbox_dirs(process_root)) == 1
    assert session.closed
    assert sandbox_dirs(process_root) == []  # the recycled one goes with the session


def test_unclosed_session_is_closed_when_collected(process_root: Path) -> None:
    def use() -> None:
        session = process_session(process_root)
        sandbox = session.sandbox()  # held: a dropped sandbox is stopped on its own
        assert sandbox.exec(["true"]).result().returncode == 0
        assert len(sandbox_dirs(process_root)) == 1

    use()
    gc.collect()
    assert sandbox_dirs(process_root) == []


def test_unclosed_session_is_closed_at_interpreter_exit(process_root: Path) -> None:
    marker = f"sync-atexit-{uuid.uuid4().hex[:8]}"
    script = textwrap.dedent(
        f"""
        from asyncsandbox.sync import SyncSession

        session = SyncSession("process", backend_options={{"root": {str(process_root)!r}}},
                              sweep=False)  # module level, never closed
        sandbox = session.sandbox()
        print(sandbox.exec(["echo", "ready"]).result().stdout.decode(), end="", flush=True)
        pending = sandbox.exec(["sh", "-c", "sleep 600 # {marker}"])
        other = session.sandbox()
        other.start().result()
        """
    )
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, timeout=60, check=False
    )
    assert done.returncode == 0, done.stderr.decode()
    assert done.stdout.startswith(b"ready\n")  # (warnings may follow: structlog prints them)
    assert sandbox_dirs(process_root) == []
    assert processes_with(marker) == []


# -- many operations at once ------------------------------------------------------------------


@pytest.mark.parametrize("async_library", ["asyncio", "trio"])
def test_parallel_execs_collected_with_wait_and_as_completed(
    process_root: Path, async_library: str
) -> None:
    with process_session(process_root, async_library=async_library) as session:
        started = time.monotonic()
        handles = [
            session.sandbox().exec(["sh", "-c", 'sleep 0.5; echo "$0"', str(i)], timeout=60)
            for i in range(100)
        ]
        first, second = handles[:50], handles[50:]
        collected: dict[int, ExecResult] = {}
        pending = first
        while pending:
            [handle], pending = wait(pending, num_returns=1)
            assert handle.done()
            collected[handles.index(handle)] = handle.result()
        for handle in as_completed(second, timeout=60):
            collected[handles.index(handle)] = handle.result()
        # 100 half-second commands one after the other would take 50 s.
        assert time.monotonic() - started < 30
        assert sorted(collected) == list(range(100))
        for i, result in collected.items():
            assert result.stdout == f"{i}\n".encode()
        assert session.statistics().sandboxes_started == 100
    assert sandbox_dirs(process_root) == []


def test_many_threads_share_one_session(process_root: Path) -> None:
    session = process_session(process_root)
    barrier = threading.Barrier(16)

    def work(n: int) -> list[bytes]:
        barrier.wait()  # every thread's first call races to open the session
        sb = session.sandbox()
        handles = [sb.exec(["sh", "-c", 'echo "$0"', f"{n}-{i}"]) for i in range(5)]
        handles.append(session.run(["sh", "-c", 'echo "$0"', f"{n}-run"]))
        done, pending = wait(handles, timeout=60)
        assert pending == []
        return sorted(h.result().stdout for h in done)

    try:
        with ThreadPoolExecutor(16) as pool:
            outputs = list(pool.map(work, range(16)))
        for n, out in enumerate(outputs):
            expected = [f"{n}-{i}\n".encode() for i in range(5)] + [f"{n}-run\n".encode()]
            assert out == sorted(expected)
        assert session.statistics().sandboxes_started == 32
    finally:
        session.close()
    assert sandbox_dirs(process_root) == []


def test_wait_and_as_completed_semantics() -> None:
    with fake_session() as session:
        sb = session.sandbox()
        slow = sb.exec(["sleep", "999"])
        fast = sb.exec(["echo", "fast"])
        done, pending = wait([slow, fast], num_returns=1, timeout=30)
        assert done == [fast]
        assert pending == [slow]
        assert wait([slow], timeout=0.1) == ([], [slow])
        with pytest.raises(TimeoutError):
            list(as_completed([slow], timeout=0.1))
        other = sb.exec(["true"])
        other.result()
        # Already done ones come first, in the order given.
        assert list(as_completed([other, fast])) == [other, fast]
        assert wait([other, fast], num_returns=5) == ([other, fast], [])
        with pytest.raises(InvalidArgument):
            wait([slow.result])  # type: ignore[list-item]
        with pytest.raises(InvalidArgument):
            wait([slow], num_returns=0)
        assert slow.cancel()


# -- results, errors, timeouts, cancellation ------------------------------------------------


def test_errors_are_the_async_api_types(process_root: Path) -> None:
    with process_session(process_root) as session:
        sb = session.sandbox()
        with pytest.raises(SandboxFileError) as file_error:
            sb.read_file("missing.txt").result()
        assert file_error.value.reason == FileErrorReason.NOT_FOUND
        with pytest.raises(ExecFailed):
            sb.exec(["false"], check=True).result()
        with pytest.raises(InvalidArgument):
            sb.exec("echo not a list").result()  # type: ignore[arg-type]
        error = sb.exec(["sh", "-c", "exit 3"], check=True).exception(timeout=30)
        assert isinstance(error, ExecFailed)
        assert error.result.returncode == 3
        assert sb.exec(["true"]).exception() is None


def test_sandbox_death_is_an_infrastructure_error() -> None:
    fake = FakeBackend()
    with fake_session(fake) as session:
        sb = session.sandbox()
        sb.start().result()
        assert sb.id is not None
        fake.kill(sb.id)
        with pytest.raises(SandboxDied):
            sb.exec(["true"]).result()


def test_exec_timeout_raises_exec_timeout_with_partial_output(process_root: Path) -> None:
    with process_session(process_root) as session:
        sb = session.sandbox()
        sb.exec(["true"]).result()  # started: the timeout below is all the command's
        for timeout in until_printed(2):
            handle = sb.exec(["sh", "-c", "echo partial; sleep 600"], timeout=timeout)
            with pytest.raises(ExecTimeout) as caught:
                handle.result(timeout=60)
            if caught.value.result.stdout:
                break
        assert caught.value.result.timed_out
        assert caught.value.result.stdout == b"partial\n"


def test_result_timeout_is_not_the_command_timeout() -> None:
    with fake_session() as session:
        handle = session.sandbox().exec(["sleep", "999"])
        with pytest.raises(TimeoutError) as caught:
            handle.result(timeout=0.1)
        assert not isinstance(caught.value, ExecTimeout)
        assert not handle.done()  # still running
        assert handle.cancel()
        assert handle.done()
        assert handle.cancelled()
        assert isinstance(handle.exception(), OperationCancelled)


def test_cancel_reaches_the_async_task() -> None:
    entered, left = threading.Event(), threading.Event()

    async def block(p: FakeProcess) -> int:
        entered.set()
        try:
            await anyio.sleep_forever()
        finally:
            left.set()
        return 0

    with fake_session(FakeBackend(commands={"block": block})) as session:
        handle = session.sandbox().exec(["block"])
        assert entered.wait(10)
        assert handle.cancel()
        assert left.wait(10), "the command's task was not cancelled"
        with pytest.raises(OperationCancelled):
            handle.result()
        done = session.sandbox().exec(["true"])
        assert not done.result().returncode
        assert not done.cancel()  # already finished


def test_cancel_kills_the_command_in_the_sandbox(process_root: Path) -> None:
    with process_session(process_root) as session:
        sb = session.sandbox()
        marker = unique_marker()
        handle = sb.exec(probe("heartbeat", "cancel.hb", marker))  # the probe ignores it

        def size() -> int:
            try:
                return len(sb.read_file("cancel.hb").result())
            except SandboxFileError:
                return 0

        eventually(lambda: size() > 5)
        assert handle.cancel()
        with pytest.raises(OperationCancelled):
            handle.result()
        # The heartbeat's process is gone (it alone writes): it can beat no more.
        eventually(lambda: not processes_with(marker), what="the cancelled command killed")
        settled = size()
        assert settled > 5
        assert sb.exec(["echo", "alive"]).result().stdout == b"alive\n"


# -- misuse from async code -------------------------------------------------------------------


def _misuses(session: SyncSession, handle: Handle[Any]) -> list[Callable[[], object]]:
    def open_new() -> None:
        with fake_session():
            pass

    return [
        handle.result,
        handle.exception,
        session.sandbox,
        session.close,
        lambda: wait([handle]),
        lambda: as_completed([handle]),
        lambda: session.run(["true"]),
        open_new,
    ]


async def _misuse_in_event_loop(session: SyncSession, handle: Handle[Any]) -> list[str]:
    messages = []
    for misuse in _misuses(session, handle):
        with pytest.raises(RunningEventLoopError) as caught:
            misuse()
        assert isinstance(caught.value, SandboxError)
        assert isinstance(caught.value, RuntimeError)
        messages.append(str(caught.value))
    # A worker thread of the event loop may block: that is the supported way.
    result = await anyio.to_thread.run_sync(handle.result)
    assert isinstance(result, ExecResult)
    return messages


@pytest.mark.parametrize("runner", ["asyncio", "trio"])
def test_blocking_calls_inside_an_event_loop_raise_clearly(runner: str) -> None:
    with fake_session() as session:
        handle = session.sandbox().exec(["echo", "hi"])
        started = time.monotonic()
        if runner == "asyncio":
            messages = asyncio.run(_misuse_in_event_loop(session, handle))
        else:
            messages = trio.run(_misuse_in_event_loop, session, handle)
        assert time.monotonic() - started < 10  # quickly: never a deadlock
        assert all("use asyncsandbox.Session directly in async code" in m for m in messages)
        assert all(runner in m for m in messages)
        # The misuse changed nothing: the session still works from plain sync code.
        assert handle.result().stdout == b"hi\n"
        assert session.sandbox().exec(["true"]).result().returncode == 0


# -- plain blocking calls ---------------------------------------------------------------------


def test_list_delete_gc_statistics() -> None:
    fake = FakeBackend()
    with fake_session(fake) as session:
        # Held: a SyncSandbox dropped without stop() is stopped when collected.
        held = [session.sandbox(tags=["sync-list"]) for _ in range(3)]
        held.append(session.sandbox(tags=["other"]))
        for sb in held:
            sb.start().result()
        assert len(session.list(tags=["sync-list"])) == 3
        assert len(session.list(this_session=True)) == 4
        assert len(session.delete(tags=["sync-list"])) == 3
        assert session.list(tags=["sync-list"]) == []
        assert session.gc() == []
        assert fake.world.live == 1
        stats = session.statistics()
        assert stats.sandboxes_started == 4
    assert fake.world.live == 0
    assert session.statistics().sandboxes_removed == 4  # still readable after close


# -- the facade is complete: same surface as the async API ---------------------------------

# What the async classes have that the blocking ones deliberately do not, and why.
ASYNC_ONLY = {
    "Session": {
        "submit": "runs an awaitable in the session's background; sync code has none to give",
        "aclose": "the async resource protocol; SyncSession.close()",
        "backend": "the Backend instance lives in (and must be used from) the event loop",
    },
    "Sandbox": {
        "exec_stream": "streams output to an async iterator; sync code uses exec()",
        "run_code_stream": "streams events to an async iterator; sync code uses run_code()'s "
        "callbacks",
        "put_archive": "consumes an async iterable of tar chunks; sync code uses upload()",
        "get_archive": "yields an async iterator of tar chunks; sync code uses download()",
        "aclose": "the async resource protocol (an alias of stop())",
    },
}


def _public(obj: object) -> set[str]:
    return {name for name in dir(obj) if not name.startswith("_")}


def _parameters(func: Callable[..., object]) -> list[tuple[str, object, object, object]]:
    signature = inspect.signature(func)
    return [
        (p.name, p.kind, p.default, p.annotation)
        for p in signature.parameters.values()
        if p.name != "self"
    ]


@pytest.mark.parametrize(
    ("async_cls", "sync_cls"),
    [(AsyncSession, SyncSession), (AsyncSandbox, sync_module.SyncSandbox)],
    ids=["Session", "Sandbox"],
)
def test_sync_classes_mirror_the_async_ones(async_cls: type, sync_cls: type) -> None:
    """Every public method and property of the async class exists on the blocking one
    with the same parameters (names, kinds, defaults, annotations), unless listed in
    ASYNC_ONLY with a reason; nothing is only in the sync one but the sync extras."""
    excluded = ASYNC_ONLY[async_cls.__name__]
    for name in sorted(_public(async_cls) - set(excluded)):
        async_member = inspect.getattr_static(async_cls, name)
        assert hasattr(sync_cls, name), f"{sync_cls.__name__}.{name} is missing"
        sync_member = inspect.getattr_static(sync_cls, name)
        if isinstance(async_member, property):
            assert isinstance(sync_member, property), f"{sync_cls.__name__}.{name}"
        elif callable(async_member):
            assert _parameters(sync_member) == _parameters(async_member), (
                f"{sync_cls.__name__}.{name} drifted from {async_cls.__name__}.{name}"
            )
    for name in excluded:
        assert hasattr(async_cls, name), f"ASYNC_ONLY lists {name}, gone from the async API"
        assert not hasattr(sync_cls, name), f"{name} is in ASYNC_ONLY and in the sync class"


def test_sync_constructor_and_attributes_mirror_the_async_session() -> None:
    async_params = _parameters(AsyncSession.__init__)
    sync_params = _parameters(SyncSession.__init__)
    assert sync_params[:-1] == async_params
    assert sync_params[-1][0] == "async_library"
    fake = FakeBackend()
    async_session = AsyncSession(fake, sweep=False)
    sync_session = fake_session(limits=Limits(max_live=3))
    # Instance attributes of the async Session are properties of the sync one.
    for name in _public(async_session) - _public(AsyncSession):
        assert isinstance(inspect.getattr_static(SyncSession, name), property), name
    assert sync_session.limits == Limits(max_live=3)
    assert sync_session.defaults == SandboxDefaults()
    with sync_session:
        sb = sync_session.sandbox(tags=["mirror"])
        for name in _public(sb._sandbox) - _public(AsyncSandbox):
            assert isinstance(inspect.getattr_static(sync_module.SyncSandbox, name), property)
        sb.start().result()
        assert sb.startup_seconds is not None
        assert sb.config.tags == ("mirror",)


def test_no_async_class_under_a_bare_name() -> None:
    """`from asyncsandbox.sync import Session` used to give the ASYNC Session: its methods
    returned coroutines that sync code never ran, and every reward came out 0."""
    for name, sync_name in (("Session", "SyncSession"), ("Sandbox", "SyncSandbox")):
        assert name not in vars(sync_module)
        with pytest.raises(ImportError, match=f"asyncsandbox.sync.{sync_name}"):
            getattr(sync_module, name)
        with pytest.raises(ImportError, match=re.escape("asyncsandbox.compat.cwsandbox")):
            exec(f"from asyncsandbox.sync import {name}")  # noqa: S102 - the statement itself
    with pytest.raises(AttributeError):
        sync_module.Nothing  # noqa: B018
    for name in sync_module.__all__:  # nothing exported returns a coroutine
        value = getattr(sync_module, name)
        members = vars(value).values() if inspect.isclass(value) else [value]
        for member in members:
            assert not inspect.iscoroutinefunction(member), f"{name}: {member}"
            assert not inspect.isasyncgenfunction(member), f"{name}: {member}"


def test_metrics_log_metrics_and_exec_stats() -> None:
    calls: list[tuple[dict[str, float], int | None]] = []
    with fake_session(report_to=[lambda metrics, step: calls.append((dict(metrics), step))]) as s:
        assert s.metrics()["asyncsandbox/executions"] == 0
        sb = s.sandbox()
        sb.exec(["true"]).result()
        sb.exec(["false"]).result()
        assert sb.exec_count == 2
        assert sb.exec_stats == {
            "exec_count": 2,
            "exec_completed_ok": 1,
            "exec_completed_nonzero": 1,
            "exec_failures": 0,
        }
        logged = s.log_metrics(step=4)
        assert logged["asyncsandbox/executions"] == 2
        assert logged["asyncsandbox/max_execs_per_sandbox"] == 2  # a live sandbox
        assert calls == [(logged, 4)]
        assert s.metrics()["asyncsandbox/executions"] == 0  # reset after delivery
        sb.exec(["true"]).result()
        kept = s.log_metrics(step=5, reset=False)
        assert s.metrics()["asyncsandbox/executions"] == kept["asyncsandbox/executions"] == 1
    assert calls[-1][1] is None  # the close-time flush
    assert s.metrics()["asyncsandbox/executions"] == 0  # readable after close


def test_result_timeout_says_what_timed_out() -> None:
    with fake_session() as session:
        handle = session.sandbox().exec(["sleep", "999"])
        with pytest.raises(TimeoutError, match=r"exec did not finish within 0\.1s") as info:
            handle.result(timeout=0.1)
        assert "not of the command" in str(info.value)
        with pytest.raises(TimeoutError, match="keeps running"):
            handle.exception(timeout=0.1)
        seen: list[Handle[Any]] = []
        handle.add_done_callback(seen.append)
        handle.cancel()
        eventually(lambda: seen == [handle])
        done = session.sandbox().exec(["true"])
        done.result()
        done.add_done_callback(seen.append)  # already done: called at once
        assert seen == [handle, done]


# -- sandboxes dropped without stop() ---------------------------------------------------------


def test_a_dropped_sandbox_is_stopped_when_collected(process_root: Path) -> None:
    with process_session(process_root) as session:
        sb = session.sandbox()
        sb.exec(["true"]).result()
        assert len(sandbox_dirs(process_root)) == 1
        del sb
        gc.collect()
        eventually(lambda: session.statistics().sandboxes_removed == 1)
        assert sandbox_dirs(process_root) == []


def test_a_dropped_sandbox_lives_while_its_commands_run(process_root: Path) -> None:
    """`session.sandbox().exec(...)`: the sandbox object is dropped at once, its command
    runs on; the sandbox goes when the command is done and its handle dropped."""
    with process_session(process_root) as session:
        handle = session.sandbox().exec(["sh", "-c", "sleep 0.5; echo done"])
        gc.collect()
        assert handle.result(timeout=60).stdout == b"done\n"
        assert len(sandbox_dirs(process_root)) == 1  # the handle keeps it
        del handle
        gc.collect()
        eventually(lambda: sandbox_dirs(process_root) == [])
        fire_and_forget = session.sandbox()
        fire_and_forget.write_file("x", "data")  # the handle is dropped at once
        del fire_and_forget
        gc.collect()
        eventually(lambda: session.statistics().sandboxes_removed == 2)
        assert sandbox_dirs(process_root) == []
        assert session.statistics().remove_failures == 0


@pytest.mark.parametrize("async_library", ["asyncio", "trio"])
def test_the_seeds_reward_pattern_does_not_exhaust_max_live(async_library: str) -> None:
    """A reward function calling `session.sandbox().exec(...)` at every step, never
    stopping a sandbox: with max_live=4, the 5th call used to wait forever."""
    fake = FakeBackend()
    with fake_session(fake, limits=Limits(max_live=4), async_library=async_library) as session:

        def reward(completions: list[str]) -> list[float]:
            processes = [session.sandbox().exec(["echo", code]) for code in completions]
            return [1.0 if p.result(timeout=30).returncode == 0 else 0.0 for p in processes]

        for _ in range(10):
            assert reward(["a", "b", "c", "d"]) == [1.0] * 4
        assert session.statistics().sandboxes_started == 40
        eventually(lambda: fake.world.live == 0)


def test_collection_in_the_event_loop_thread_is_safe() -> None:
    """A finalizer may run in the event loop thread itself (a collection triggered
    there): it must neither block nor deadlock."""
    fake = FakeBackend()
    with fake_session(fake) as session:
        sandboxes = [session.sandbox() for _ in range(5)]
        for sb in sandboxes:
            sb.start().result()
        victims: list[object] = [sandboxes]
        del sandboxes, sb

        async def drop_in_loop() -> None:
            victims.clear()  # the last reference goes in the event loop thread
            gc.collect()

        session._runtime.call("drop", drop_in_loop)
        eventually(lambda: fake.world.live == 0)


def test_every_way_to_run_a_command_takes_the_same_keywords() -> None:
    """Sandbox.exec, exec_stream and Session.run (and their blocking twins) take one set of
    command keywords: a new one added to exec but forgotten elsewhere fails here."""

    def keywords(func: Callable[..., object]) -> list[tuple[str, object, object]]:
        return [
            (p.name, p.default, p.annotation)
            for p in inspect.signature(func).parameters.values()
            if p.kind is inspect.Parameter.KEYWORD_ONLY
        ]

    reference = keywords(AsyncSandbox.exec)
    assert [name for name, _, _ in reference] == [
        "cwd", "env", "stdin", "timeout", "check", "max_output_bytes"
    ]  # fmt: skip
    for func in (
        AsyncSandbox.exec_stream,
        AsyncSession.run,
        sync_module.SyncSandbox.exec,
        sync_module.SyncSession.run,
    ):
        assert keywords(func) == reference, func.__qualname__
