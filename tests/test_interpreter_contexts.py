"""The code interpreter's contexts, on every backend (tests/_interpreter_support.py):
each is isolated and keeps its directory, many run at once over many sandboxes, and
recycling a sandbox resets them.
"""

from __future__ import annotations

import anyio
import pytest

from asyncsandbox import CodeContext, InvalidArgument, Sandbox, SandboxDefaults, WarmPool

from . import _interpreter_support as interpreter
from ._interpreter_support import IS_ROOT, Target, marker, sandbox, session
from ._support import pool_ready, processes_gone, processes_with

# The interpreter family's fixtures (tests/_interpreter_support.py), this module's by name.
remote_server = interpreter.remote_server
target = interpreter.target


# -- contexts -------------------------------------------------------------------------------


async def test_contexts_are_isolated_and_keep_their_directory(target: Target) -> None:
    async with sandbox(target) as sb:
        await sb.run_code("shared = 'default'")
        other = await sb.create_code_context(cwd="/tmp")
        assert other == CodeContext(id=other.id, language="python", cwd="/tmp")
        assert (await sb.run_code("'shared' in globals()", context=other)).text == "False"
        await sb.run_code("shared = 'other'", context=other.id)
        assert (await sb.run_code("shared")).text == "'default'"
        assert (await sb.run_code("import os; os.getcwd()", context=other)).text == "'/tmp'"
        assert (await sb.run_code("import os; os.getcwd()")).text == repr(sb.config.workdir)
        ids = {c.id for c in await sb.list_code_contexts()}
        assert ids == {"default", other.id}
        await sb.remove_code_context(other)
        assert {c.id for c in await sb.list_code_contexts()} == {"default"}
        with pytest.raises(InvalidArgument, match="no code context"):
            await sb.run_code("1", context=other)
        with pytest.raises(InvalidArgument, match="context or a language"):
            await sb.run_code("1", context="default", language="python")
        with pytest.raises(InvalidArgument, match="python"):
            await sb.run_code("1", language="javascript")
        with pytest.raises(InvalidArgument):
            await sb.create_code_context(cwd="/no/such/directory")
        await sb.restart_code_context("default")
        assert (await sb.run_code("'shared' in globals()")).text == "False"


async def test_a_relative_directory_is_under_the_workdir(target: Target) -> None:
    async with sandbox(target) as sb:
        await sb.exec(["mkdir", "-p", "made"])
        context = await sb.create_code_context(cwd="made")
        assert (await sb.run_code("import os; os.getcwd()", context=context)).text == repr(
            f"{sb.config.workdir}/made"
        )


# -- many at once -------------------------------------------------------------------------


@pytest.mark.slow  # load: 8 sandboxes at once per backend
async def test_32_contexts_over_8_sandboxes_at_once(target: Target) -> None:
    async with session(target) as s:
        sandboxes = [s.sandbox() for _ in range(8)]
        results: dict[tuple[int, int], str | None] = {}
        async with anyio.create_task_group() as tg:
            for sb in sandboxes:
                tg.start_soon(sb.start)
        try:

            async def work(i: int, sb: Sandbox) -> None:
                contexts = [None, *[await sb.create_code_context() for _ in range(3)]]

                async def one(j: int, context: CodeContext | None) -> None:
                    await sb.run_code(
                        f"value = {i * 10 + j}\nimport time; time.sleep(0.2)", context=context
                    )
                    results[i, j] = (await sb.run_code("value", context=context)).text

                async with anyio.create_task_group() as inner:
                    for j, context in enumerate(contexts):
                        inner.start_soon(one, j, context)

            async with anyio.create_task_group() as tg:
                for i, sb in enumerate(sandboxes):
                    tg.start_soon(work, i, sb)
        finally:
            with anyio.CancelScope(shield=True):
                for sb in sandboxes:
                    await sb.stop()
        assert results == {(i, j): str(i * 10 + j) for i in range(8) for j in range(4)}


async def test_recycling_resets_contexts(target: Target) -> None:
    if target.kind in ("process", "remote") and not IS_ROOT:
        pytest.skip("the process backend (the remote server's too) resets isolated sandboxes only")
    options = {"recyclable": True} if target.kind == "docker" else {}
    mark = marker()
    async with session(
        target,
        backend_options=options,
        warm_pool=WarmPool(size=1, recycle=True),
        defaults=SandboxDefaults(tags=("test-interpreter",)),
    ) as s:
        await pool_ready(s, 1, within=120)
        async with s.sandbox() as first:  # from the pool, and back to it once reset
            await first.run_code(
                f"import subprocess\nsecret = 1\np = subprocess.Popen(['sleep', '{mark}'])"
            )
            await first.create_code_context()
            used = first.id
        if target.kind == "remote":
            # Its contexts live on the server, and end there with the reset, which runs in
            # the background (before the sandbox is handed to another episode).
            assert await processes_gone(mark, within=60) == []
        else:
            assert not processes_with(mark)  # the episode's processes went with it
        await pool_ready(s, 1, within=120)  # the pool's one sandbox, reset
        async with s.sandbox() as second:
            assert second.id == used  # the same sandbox, reset
            assert await second.list_code_contexts() == []
            fresh = await second.run_code("'secret' in globals()")
            assert fresh.text == "False"
            assert fresh.execution_count == 1
