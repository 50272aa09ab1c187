"""The output of the code interpreter's calls, on every backend
(tests/_interpreter_support.py): a flood is bounded, output streams to the callbacks as it
comes, and what background threads print late never lands in the next call.
"""

from __future__ import annotations

import textwrap

from asyncsandbox import ExecutionError, OutputMessage, Result

from . import _interpreter_support as interpreter
from ._interpreter_support import Target, sandbox, stderr, stdout

# The interpreter family's fixtures (tests/_interpreter_support.py), this module's by name.
remote_server = interpreter.remote_server
target = interpreter.target


async def test_an_output_flood_is_bounded(target: Target) -> None:
    code = textwrap.dedent(
        """
        import sys
        print("HEAD")
        line = "x" * 1023 + "\\n"
        for _ in range(50 * 1024):  # 50 MiB
            sys.stdout.write(line)
        print("TAIL")
        """
    )
    async with sandbox(target) as sb:
        execution = await sb.run_code(code, max_output_bytes=64 * 1024, timeout=300)
        assert execution.error is None
        text = stdout(execution)
        assert execution.logs.stdout_truncated
        assert execution.truncated
        assert text.startswith("HEAD\n")
        assert text.endswith("TAIL\n")
        assert len(text) <= 64 * 1024
        assert (await sb.run_code("1 + 1")).text == "2"


async def test_output_streams_as_it_comes(target: Target) -> None:
    """on_stdout sees output while the code still runs: the code waits for a file that
    the callback writes once it saw the first line."""
    code = textwrap.dedent(
        """
        import os, time
        print("waiting", flush=True)
        while not os.path.exists("go"):
            time.sleep(0.02)
        print("went")
        42
        """
    )
    async with sandbox(target) as sb:
        seen: list[str] = []

        async def on_stdout(message: OutputMessage) -> None:
            seen.append(message.line)
            if message.line == "waiting\n":
                await sb.write_file("go", "")

        results: list[Result] = []
        execution = await sb.run_code(
            code, on_stdout=on_stdout, on_result=results.append, timeout=60
        )
        assert seen == ["waiting\n", "went\n"]
        assert results == execution.results
        assert execution.text == "42"
        async with sb.run_code_stream("print('a'); display(1); 1/0") as stream:
            events = [event async for event in stream]
            final = await stream.wait()
        assert [type(e) for e in events] == [OutputMessage, Result, ExecutionError]
        assert final.error == events[-1]


async def test_late_background_output_never_lands_in_the_next_call(target: Target) -> None:
    code = textwrap.dedent(
        """
        import threading, time, sys
        go = threading.Event()
        def chatter():
            go.wait()
            while True:
                print("late", flush=True)
                sys.stderr.write("late\\n")
                display("late result")
                time.sleep(0.001)
        threading.Thread(target=chatter, daemon=True).start()
        print("own")
        """
    )
    async with sandbox(target) as sb:
        first = await sb.run_code(code)
        assert stdout(first) == "own\n"
        await sb.run_code("go.set()")
        # The thread chatters from now on, between calls and during the next ones.
        for _ in range(3):
            later = await sb.run_code(
                "import time\nfor _ in range(20):\n    print('mine')\n    time.sleep(0.005)\n7"
            )
            assert stdout(later) == "mine\n" * 20
            assert stderr(later) == ""
            assert [r.text for r in later.results] == ["7"]
        # A thread started in this call is this call's.
        own = await sb.run_code(
            "t = threading.Thread(target=print, args=('from a thread',)); t.start(); t.join()"
        )
        assert stdout(own) == "from a thread\n"


async def test_many_short_writes_arrive_whole_and_in_order(target: Target) -> None:
    """Thousands of prints, stdout and stderr one after the other: the runner sends what
    one stream says in a row as one frame, never across a change of stream, so every
    byte arrives, and the streams alternate exactly as the code wrote them."""
    code = "import sys\nfor i in range(3000):\n    print(i)\n    print(-i, file=sys.stderr)\n"
    events: list[tuple[str, str]] = []

    async def on_stdout(message: OutputMessage) -> None:
        events.append(("out", message.line))

    async def on_stderr(message: OutputMessage) -> None:
        events.append(("err", message.line))

    async with sandbox(target) as sb:
        execution = await sb.run_code(code, on_stdout=on_stdout, on_stderr=on_stderr)
    assert execution.error is None, execution.error
    assert "".join(line for kind, line in events if kind == "out") == "".join(
        f"{i}\n" for i in range(3000)
    )
    assert "".join(line for kind, line in events if kind == "err") == "".join(
        f"{-i}\n" for i in range(3000)
    )
    assert [kind for kind, _ in events] == ["out", "err"] * 3000
