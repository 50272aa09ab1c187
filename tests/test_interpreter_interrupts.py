"""A call of the code interpreter that does not end by itself, on every backend
(tests/_interpreter_support.py): a timeout interrupts it and the state stays; code that
ignores the interrupt is killed with all it started; an interpreter that dies (its exit, a
signal, the memory limit) is reported and replaced; cancelling a call interrupts its code,
even while the code is blocked writing its output; restarting a context ends its running
call.
"""

from __future__ import annotations

import os
import textwrap
import uuid
from pathlib import Path

import anyio
import pytest

from asyncsandbox import ExecTimeout, Execution, OutputMessage, Resources, Sandbox

from . import _interpreter_support as interpreter
from ._interpreter_support import IS_ROOT, Target, marker, sandbox, stdout
from ._support import eventually_async, processes_with, until_printed

# The interpreter family's fixtures (tests/_interpreter_support.py), this module's by name.
remote_server = interpreter.remote_server
target = interpreter.target


async def test_a_timeout_interrupts_and_the_state_stays(target: Target) -> None:
    async with sandbox(target) as sb:
        await sb.run_code("kept = 'yes'")
        for timeout in until_printed(1):  # the state stays through each interrupt
            with pytest.raises(ExecTimeout) as raised:
                await sb.run_code(
                    "import time\nprint('started', flush=True)\ntime.sleep(600)",
                    timeout=timeout,
                )
            if raised.value.result.stdout:
                break
        execution = raised.value.execution
        assert execution is not None
        assert execution.timed_out
        assert not execution.restarted
        assert execution.error is not None
        assert execution.error.name == "KeyboardInterrupt"
        assert "time.sleep(600)" in execution.error.traceback
        assert stdout(execution) == "started\n"
        assert raised.value.result.returncode == 130
        assert raised.value.result.timed_out
        assert raised.value.result.stdout == b"started\n"
        after = await sb.run_code("kept")
        assert after.text == "'yes'"
        assert not after.restarted


async def test_code_that_ignores_the_interrupt_is_killed_with_all_it_started(
    target: Target,
) -> None:
    mark = marker()
    code = textwrap.dedent(
        f"""
        import signal, subprocess, os, time
        subprocess.Popen(["sleep", "{mark}"], start_new_session=True)  # a daemon of its own
        if os.fork() == 0:  # and an orphan, double-forked
            os.setsid()
            if os.fork() == 0:
                os.execvp("sleep", ["sleep", "{mark}"])
            os._exit(0)
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        print("ignoring", flush=True)
        while True:
            try:
                time.sleep(0.05)
            except BaseException:
                pass
        """
    )
    for timeout in until_printed(2):  # each attempt in a fresh sandbox
        async with sandbox(target) as sb:
            await sb.run_code("lost = 1")
            started = anyio.current_time()
            with pytest.raises(ExecTimeout) as raised:
                await sb.run_code(code, timeout=timeout)
            if raised.value.result.stdout:
                await _ignored_and_killed(sb, raised.value, started, mark)
                return
    pytest.fail("the code never printed within its timeout, the longest included")


async def _ignored_and_killed(sb: Sandbox, raised: ExecTimeout, started: float, mark: str) -> None:
    """What the test above checks once the code printed before its timeout."""
    execution = raised.execution
    assert execution is not None
    assert execution.restarted
    assert execution.timed_out
    assert execution.error is not None
    assert execution.error.name == "InterpreterRestarted"
    assert raised.result.returncode == 137
    assert stdout(execution) == "ignoring\n"
    assert anyio.current_time() - started < 60  # the grace, not forever
    await eventually_async(
        lambda: not processes_with(mark), within=30, what="the leftovers are killed"
    )
    fresh = await sb.run_code("'lost' in globals()")
    assert fresh.text == "False"
    assert fresh.execution_count == 1
    assert {c.id for c in await sb.list_code_contexts()} == {"default"}


@pytest.mark.parametrize(
    ("code", "how"),
    [
        ("import os; os._exit(3)", "exited with status 3"),
        ("import ctypes; ctypes.string_at(0)", "killed by SIGSEGV"),
        ("import os, signal; os.kill(os.getpid(), signal.SIGKILL)", "killed by SIGKILL"),
    ],
    ids=["exit", "segfault", "sigkill"],
)
async def test_a_dying_interpreter_is_reported_and_replaced(
    target: Target, code: str, how: str
) -> None:
    async with sandbox(target) as sb:
        await sb.run_code("before = 1")
        other = await sb.create_code_context()
        await sb.run_code("untouched = 1", context=other)
        died = await sb.run_code(f"print('last words', flush=True)\n{code}")
        assert died.error is not None
        assert died.error.name == "InterpreterDied"
        assert how in died.error.value
        assert died.restarted
        assert stdout(died) == "last words\n"
        fresh = await sb.run_code("'before' in globals()")
        assert fresh.error is None
        assert fresh.text == "False"
        assert not fresh.restarted  # reported once, by the call it died in
        # The other context has nothing to do with it.
        survived = await sb.run_code("untouched", context=other)
        assert survived.text == "1"
        assert not survived.restarted


async def test_an_interpreter_killed_for_memory_is_reported(target: Target) -> None:
    if target.kind == "process" and not IS_ROOT:
        pytest.skip("the process backend enforces memory limits as root (cgroups)")
    async with sandbox(target, resources=Resources(memory_mb=256)) as sb:
        await sb.run_code("before = 1")
        hog = await sb.run_code("blocks = []\nwhile True:\n    blocks.append(bytearray(1 << 24))")
        assert hog.error is not None
        if hog.error.name == "MemoryError":  # the allocation failed before the killer came
            pytest.skip("the sandbox refused the memory instead of killing for it")
        assert hog.error.name == "InterpreterDied", hog.error
        assert "SIGKILL" in hog.error.value
        assert (await sb.run_code("'before' in globals()")).text == "False"


def blocked_writing(name: str) -> bool:
    """Whether the host thread named ``name`` (its ``comm``) waits to write to a full pipe:
    the kernel's events pipe, when the host reads no more of its output."""
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            for task in Path(f"/proc/{pid}/task").iterdir():
                if (task / "comm").read_text().strip() == name:
                    return "pipe_write" in (task / "wchan").read_text()
        except OSError:
            continue
    return False


FLOOD_IN_MAIN = """
import ctypes, time
ctypes.CDLL(None).prctl(15, b"{name}", 0, 0, 0)  # PR_SET_NAME: for the host to find
print("x" * (64 << 20))
time.sleep(600)
"""
FLOOD_IN_A_THREAD = """
import ctypes, threading, time
def flood():
    ctypes.CDLL(None).prctl(15, b"{name}", 0, 0, 0)
    print("x" * (64 << 20))
threading.Thread(target=flood, daemon=True).start()
time.sleep(600)
"""


async def test_cancelling_a_call_interrupts_it_and_the_state_stays(target: Target) -> None:
    async with sandbox(target) as sb:
        await sb.run_code("kept = 2")
        printed = anyio.Event()

        async def on_stdout(message: OutputMessage) -> None:
            printed.set()

        async with anyio.create_task_group() as tg:

            async def run() -> None:
                await sb.run_code(
                    "import time\nprint('running', flush=True)\ntime.sleep(600)",
                    on_stdout=on_stdout,
                )

            tg.start_soon(run)
            await printed.wait()
            tg.cancel_scope.cancel()
        after = await sb.run_code("kept")
        assert after.error is None, after.error
        assert after.text == "2"
        assert not after.restarted


@pytest.mark.parametrize("flood", [FLOOD_IN_MAIN, FLOOD_IN_A_THREAD], ids=["main", "thread"])
async def test_an_interrupt_while_the_code_is_blocked_writing_takes_effect(
    target: Target, flood: str, anyio_backend: str
) -> None:
    """The interrupt comes while a thread of the code is inside the runner, writing its
    output (where an interrupt must wait: half a frame would break the channel), blocked
    there because nobody reads the output: it takes effect once the write is whole (the
    main thread's), or at once (another thread's write is none of the main thread's
    business); the context keeps its state. (The race that made the test above flaky,
    made certain.)"""
    if target.kind == "remote" and anyio_backend == "trio":
        pytest.skip(
            "the remote client leaves httpcore's body generators to the garbage collector "
            "when a call is cancelled mid-body (trio warns of each): not the interpreter's"
        )
    name = f"k{uuid.uuid4().hex[:12]}"
    async with sandbox(target) as sb:
        await sb.run_code("kept = 2")
        printed = anyio.Event()

        async def on_stdout(message: OutputMessage) -> None:
            printed.set()
            await anyio.Event().wait()  # read no more: the code blocks on its output

        async with anyio.create_task_group() as tg:

            async def run() -> None:
                await sb.run_code(flood.format(name=name), on_stdout=on_stdout)

            tg.start_soon(run)
            await printed.wait()
            await eventually_async(
                lambda: blocked_writing(name), within=30, what="the code blocks writing"
            )
            tg.cancel_scope.cancel()
        after = await sb.run_code("kept")
        assert after.error is None, after.error
        assert after.text == "2"
        assert not after.restarted


async def test_a_context_lost_under_a_cancelled_call_is_reported_by_the_next(
    target: Target,
) -> None:
    """Cancelled, the call never returns the execution that says its interpreter was
    restarted (the code ignored the interrupt): the next call of the context says so."""
    code = textwrap.dedent(
        """
        import signal, time
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        print("ignoring", flush=True)
        time.sleep(600)
        """
    )
    async with sandbox(target) as sb:
        await sb.run_code("lost = 1")
        other = await sb.create_code_context()
        await sb.run_code("untouched = 1", context=other)
        printed = anyio.Event()
        async with anyio.create_task_group() as tg:

            async def run() -> None:
                await sb.run_code(code, on_stdout=lambda _: printed.set())

            tg.start_soon(run)
            await printed.wait()
            tg.cancel_scope.cancel()
        fresh = await sb.run_code("'lost' in globals()")
        assert fresh.text == "False"
        assert fresh.restarted
        assert fresh.execution_count == 1
        again = await sb.run_code("1")
        assert not again.restarted  # said once
        survived = await sb.run_code("untouched", context=other)
        assert survived.text == "1"
        assert not survived.restarted


async def test_restarting_a_context_ends_its_running_call(target: Target) -> None:
    async with sandbox(target) as sb:
        printed = anyio.Event()
        ended: list[Execution] = []

        async with anyio.create_task_group() as tg:

            async def run() -> None:
                ended.append(
                    await sb.run_code(
                        "import time\nprint('running', flush=True)\ntime.sleep(600)",
                        on_stdout=lambda _: printed.set(),
                    )
                )

            tg.start_soon(run)
            await printed.wait()
            await sb.restart_code_context("default")
        (execution,) = ended
        assert execution.restarted
        assert execution.error is not None
        assert execution.error.name == "InterpreterRestarted"
