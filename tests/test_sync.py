"""The blocking facade (asyncsandbox.sync): handles, parallel collection, threads, misuse
from async code, cancellation and cleanup. Tests are sync: each drives its own event loop
thread (asyncio unless a test says trio)."""

from __future__ import annotations

import asyncio
import gc
import inspect
import os
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
    OperationCancelled,
    SandboxClosed,
    SandboxDied,
    SandboxError,
    SandboxFileError,
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


def process_session(root: Path, **kwargs: Any) -> SyncSession:
    return SyncSession("process", backend_options={"root": root}, sweep=False, **kwargs)


def fake_session(fake: FakeBackend | None = None, **kwargs: Any) -> SyncSession:
    return SyncSession(fake or FakeBackend(), sweep=False, **kwargs)


def sandbox_dirs(root: Path) -> list[str]:
    try:
        return [name for name in os.listdir(root) if not name.startswith(".")]
    except FileNotFoundError:
        return []


def eventually(predicate: Callable[[], bool], *, within: float = 10.0) -> None:
    deadline = time.monotonic() + within
    while not predicate():
        assert time.monotonic() < deadline, "condition not reached in time"
        time.sleep(0.05)


def processes_with(marker: str) -> list[str]:
    found = []
    for pid in os.listdir("/proc"):
        if pid.isdigit():
            try:
                cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
            except OSError:
                continue
            if marker.encode() in cmdline:
                found.append(cmdline.replace(b"\0", b" ").decode(errors="replace"))
    return found


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
        SyncSession(FakeBackend(), limits=3)


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
        assert sandbox_dirs(process_root) == []  # run() removes its sandbox
    assert session.closed


def test_unclosed_session_is_closed_when_collected(process_root: Path) -> None:
    def use() -> None:
        session = process_session(process_root)
        assert session.sandbox().exec(["true"]).result().returncode == 0
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
        handle = sb.exec(["sh", "-c", "echo partial; sleep 600"], timeout=0.5)
        with pytest.raises(ExecTimeout) as caught:
            handle.result(timeout=60)
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
            await anyio.sleep(999)
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
        handle = sb.exec(probe("heartbeat", "cancel.hb"))

        def size() -> int:
            try:
                return len(sb.read_file("cancel.hb").result())
            except SandboxFileError:
                return 0

        eventually(lambda: size() > 5)
        assert handle.cancel()
        with pytest.raises(OperationCancelled):
            handle.result()
        # The heartbeat stops: sizes a little apart become equal, and stay equal.
        previous = [-1]

        def stable() -> bool:
            now = size()
            same, previous[0] = now == previous[0], now
            time.sleep(0.2)
            return same

        eventually(stable)
        settled = size()
        time.sleep(0.5)
        assert size() == settled, "the cancelled command still runs"
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
        for _ in range(3):
            session.sandbox(tags=["sync-list"]).start().result()
        session.sandbox(tags=["other"]).start().result()
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
