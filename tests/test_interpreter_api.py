"""The rest of the code interpreter's API: a backend without interactive processes
refuses to run code, the sync facade runs it, a warm call starts no interpreter (on every
backend: tests/_interpreter_support.py), and the runner fits in one argument.
"""

from __future__ import annotations

from pathlib import Path

import anyio
import pytest

from asyncsandbox import ExecTimeout, InvalidArgument, Session
from asyncsandbox.testing import FakeBackend

from . import _interpreter_support as interpreter
from ._interpreter_support import Target, sandbox

# The interpreter family's fixtures (tests/_interpreter_support.py), this module's by name.
remote_server = interpreter.remote_server
target = interpreter.target


async def test_a_backend_without_interactive_processes_refuses() -> None:
    async with Session(FakeBackend(), sweep=False) as s, s.sandbox() as sb:
        with pytest.raises(InvalidArgument, match="cannot run code"):
            await sb.run_code("1")


async def test_sync_facade_runs_code(process_root: Path, anyio_backend: str) -> None:
    from asyncsandbox.sync import SyncSession

    def blocking() -> None:
        sync = SyncSession("process", backend_options={"root": process_root}, sweep=False)
        with sync as s, s.sandbox() as sb:
            seen: list[str] = []
            sb.run_code("x = 5").result()
            execution = sb.run_code(
                "print(x); x * 2", on_stdout=lambda m: seen.append(m.line)
            ).result()
            assert execution.text == "10"
            assert seen == ["5\n"]
            context = sb.create_code_context(cwd="/tmp").result()
            assert sb.run_code("import os; os.getcwd()", context=context).result().text == "'/tmp'"
            assert len(sb.list_code_contexts().result()) == 2
            sb.restart_code_context(context).result()
            sb.remove_code_context(context).result()
            with pytest.raises(ExecTimeout):
                sb.run_code("import time; time.sleep(60)", timeout=0.5).result()

    await anyio.to_thread.run_sync(blocking)


async def test_wall_clock_of_a_warm_call_is_small(target: Target) -> None:
    """Not a timing assertion: the warm call must not start an interpreter (its count
    goes on, its pid stays)."""
    async with sandbox(target) as sb:
        first = await sb.run_code("import os; os.getpid()")
        for _ in range(5):
            again = await sb.run_code("os.getpid()")
            assert again.text == first.text
        assert again.execution_count == (first.execution_count or 0) + 5


def test_the_runner_fits_in_one_argument() -> None:
    """The runner is sent as ``python3 -c SOURCE``: Linux takes no single argument longer
    than MAX_ARG_STRLEN (32 pages: 128 KiB), whatever the total room (E2BIG)."""
    from asyncsandbox._interpreter._engine import RUNNER

    assert len(RUNNER.encode()) < 32 * 4096


async def test_the_runners_modules_are_not_the_codes(target: Target) -> None:
    """The runner ships as modules (``common``, ``kernel``...) that are not in
    ``sys.modules``: the code's own modules of those names are its own."""
    async with sandbox(target) as sb:
        await sb.write_file("kernel.py", "WHO = 'mine'\n")
        execution = await sb.run_code(
            "import sys, kernel\n"
            "kernel.WHO, [n for n in ('common', 'charts', 'hooks', 'runner') if n in sys.modules]"
        )
        assert execution.error is None, execution.error
        assert execution.text == "('mine', [])"
