"""The agent toolbox (asyncsandbox.tools): its public surface and schemas, which tools it
offers, arguments as a model sends them (every invalid call an observation), submit and
grading, infrastructure failures flagged as such, and cancellation. The toolbox's policy
runs on asyncio and trio on the FakeBackend, which scripts the failures; what needs a real
sandbox runs on the process backend."""

from __future__ import annotations

import inspect
import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import anyio
import pytest

from asyncsandbox import (
    BackendUnavailable,
    InvalidArgument,
    Sandbox,
    SandboxFileError,
    Session,
    tools as tools_module,
)
from asyncsandbox.testing import FakeBackend, FakeProcess
from asyncsandbox.tools import TOOL_NAMES, Grade, Toolbox, ToolResult

from ._support import eventually_async, processes_with, unique_marker
from ._tools_support import edit, model_error, ok, process_toolbox, tools_generate_tests

# Tools on a real sandbox run on asyncio (tests/_tools_support.py), this module's by name.
pytest_generate_tests = tools_generate_tests


@asynccontextmanager
async def fake_toolbox(fake: FakeBackend | None = None, **kwargs: Any) -> AsyncIterator[Toolbox]:
    async with (
        Session(fake or FakeBackend(), sweep=False) as session,
        session.sandbox() as sandbox,
    ):
        yield Toolbox(sandbox, **kwargs)


def infrastructure_error(result: ToolResult) -> str:
    assert result.is_error
    assert result.infrastructure_error, result.observation
    assert result.observation.startswith("Error: ")
    return result.observation


async def size_of(sandbox: Sandbox, path: str) -> int:
    try:
        return len(await sandbox.read_file(path))
    except SandboxFileError:
        return 0


async def wait_for_size(sandbox: Sandbox, path: str, size: int) -> None:
    async def grown() -> bool:  # the writer is a process in the sandbox
        return await size_of(sandbox, path) >= size

    await eventually_async(grown, within=10, what=f"{path} has {size} bytes")


# -- surface and schemas ----------------------------------------------------------------------


def test_public_surface_is_exported_and_documented() -> None:
    assert isinstance(tools_module.__all__, tuple)
    defined = {
        name
        for name, obj in vars(tools_module).items()
        if not name.startswith("_")
        and (inspect.isclass(obj) or inspect.isfunction(obj))
        and obj.__module__ == tools_module.__name__
    }
    assert defined <= set(tools_module.__all__)
    for obj in (Toolbox, ToolResult, Toolbox.call, Toolbox.schemas, ToolResult.message):
        assert inspect.getdoc(obj)
    assert "Cancellation" in (Toolbox.call.__doc__ or "")


async def test_schemas_are_openai_tool_definitions() -> None:
    async with fake_toolbox(tests=["true"]) as toolbox:
        schemas = toolbox.schemas()
        # All but execute_bash and python, which are offered only when asked for.
        assert [s["function"]["name"] for s in schemas] == [
            n for n in TOOL_NAMES if n not in ("execute_bash", "python")
        ]
        json.dumps(schemas)  # plain JSON
        for schema in schemas:
            assert schema["type"] == "function"
            function = schema["function"]
            assert set(function) == {"name", "description", "parameters"}
            assert function["description"]
            params = function["parameters"]
            assert params["type"] == "object"
            assert params["additionalProperties"] is False
            assert set(params["required"]) <= set(params["properties"])
            for prop in params["properties"].values():
                assert "type" in prop
                assert prop["description"]
        by_name = {s["function"]["name"]: s["function"]["parameters"] for s in schemas}
        assert by_name["bash"]["required"] == ["command"]
        assert "default 30, at most 600" in by_name["bash"]["properties"]["timeout"]["description"]
        assert by_name["str_replace_editor"]["properties"]["command"]["enum"] == sorted(
            ["view", "create", "str_replace", "insert"]
        )
        assert by_name["submit"]["properties"] == {}
        assert "/workspace" in schemas[0]["function"]["description"]
        schemas[0]["function"]["name"] = "changed"
        assert toolbox.schemas()[0]["function"]["name"] == "bash"  # a fresh copy each time


async def test_tool_selection() -> None:
    async with fake_toolbox() as toolbox:
        sandbox = toolbox.sandbox
        assert toolbox.names == ("bash", "read_file", "write_file", "str_replace_editor")
        only = Toolbox(sandbox, tools=["read_file", "submit"], tests="true")
        assert [s["function"]["name"] for s in only.schemas()] == ["read_file", "submit"]
        result = await only.call("bash", {"command": "true"})
        assert "unknown tool 'bash'; the tools are: read_file, submit" in model_error(result)
        for bad in (
            {"tools": ["nope"]},
            {"tools": ["submit"]},  # no tests
            {"tools": "bash"},
            {"tools": ["bash", "bash"]},
            {"bash_timeout": 10, "max_bash_timeout": 5},
            {"bash_timeout": 0},
            {"max_observation_chars": 10},
            {"tests": "echo \0"},
        ):
            with pytest.raises(InvalidArgument):
                Toolbox(sandbox, **bad)
        with pytest.raises(InvalidArgument):
            Toolbox("not a sandbox")  # type: ignore[arg-type]


def test_result_message() -> None:
    result = ToolResult(name="bash", observation="exit=0\nhi\n")
    assert result.message("call_1") == {
        "role": "tool",
        "tool_call_id": "call_1",
        "content": "exit=0\nhi\n",
    }


# -- arguments --------------------------------------------------------------------------------


async def test_invalid_calls_are_observations() -> None:
    async with fake_toolbox(tests="true") as toolbox:
        cases: list[tuple[Any, Any, str]] = [
            ("bash", '{"command": ', "are not valid JSON"),
            ("bash", b"\xff", "are not valid JSON"),
            ("bash", "[1, 2]", "must be a JSON object, not list"),
            ("bash", 42, "must be a JSON object"),
            ("bash", {}, "missing required field `command`"),
            ("bash", {"command": 3}, "Expected `str`, got `int` - at `$.command`"),
            ("bash", {"command": "true", "cmd": "x"}, "unknown field `cmd`"),
            ("bash", {"command": "true", "timeout": -1}, "`$.timeout`"),
            ("bash", {"command": "true", "timeout": "10"}, "Expected `float`, got `str`"),
            ("read_file", {"path": "x", "start_line": 0}, "`$.start_line`"),
            ("str_replace_editor", {"command": "delete", "path": "x"}, "Invalid enum value"),
            ("str_replace_editor", {"command": "view", "path": "x", "view_range": [1]}, "length"),
            ("submit", {"answer": 42}, "unknown field `answer`"),
            ("launch_missiles", {}, "unknown tool 'launch_missiles'"),
            (None, {}, "unknown tool None"),
        ]
        for name, arguments, expected in cases:
            observation = model_error(await toolbox.call(name, arguments))
            assert expected in observation, (name, arguments, observation)
        assert not toolbox.done


async def test_arguments_as_dict_json_or_nothing() -> None:
    async with fake_toolbox(tests="true") as toolbox:
        assert ok(await toolbox.call("read_file", {"path": "/etc/hostname"})) == "fake\n"
        assert ok(await toolbox.call("read_file", '{"path": "/etc/hostname"}')) == "fake\n"
        assert ok(await toolbox.call("read_file", b'{"path": "/etc/hostname"}')) == "fake\n"
    async with fake_toolbox(tests=["true"]) as toolbox:
        assert (await toolbox.call("submit", "")).reward == 1.0  # "" means no arguments
    async with fake_toolbox(tests=["true"]) as toolbox:
        assert (await toolbox.call("submit")).reward == 1.0


# -- submit -----------------------------------------------------------------------------------


async def test_submit_runs_the_test_command(process_root: Path) -> None:
    async with process_toolbox(process_root, tests="test -f solved && echo PASS") as toolbox:
        result = await toolbox.call("submit", {})
        assert result.done
        assert result.reward == 0.0
        assert not result.is_error
        assert result.observation.startswith("Submitted: the tests failed (exit=1); reward=0.0.")
        assert toolbox.done
        assert toolbox.reward == 0.0
        # The episode is over: nothing runs any more, and a second submit grades nothing.
        result = await toolbox.call("bash", {"command": "touch solved"})
        assert result.done
        assert "already submitted" in model_error(result)
        assert "already submitted" in model_error(await toolbox.call("submit", {}))
        assert toolbox.reward == 0.0
        assert await size_of(toolbox.sandbox, "solved") == 0  # the touch did not run

    async with process_toolbox(process_root, tests=["sh", "-c", "test -f solved"]) as toolbox:
        assert not (await toolbox.call("bash", {"command": "touch solved"})).done
        result = await toolbox.call("submit", {})
        assert (result.reward, result.done, result.is_error) == (1.0, True, False)
        assert result.observation.startswith("Submitted: the tests passed (exit=0); reward=1.0.")
        assert toolbox.reward == 1.0


async def test_submit_test_timeout_scores_zero(process_root: Path) -> None:
    async with process_toolbox(
        # 2 s: under CI's load, 0.5 s passed before the shell printed its first line
        process_root,
        tests="echo running; sleep 60",
        test_timeout=2,
    ) as tb:
        result = await tb.call("submit", {})
        assert (result.reward, result.done, result.infrastructure_error) == (0.0, True, False)
        assert result.observation.startswith("Submitted: the tests timed out after 2s")
        assert "running" in result.observation


async def test_submit_with_a_grader_callable() -> None:
    async def grader(sandbox: Sandbox) -> float:
        return 0.25 * len(await sandbox.read_file("answer.txt"))

    async with fake_toolbox(tests=grader) as toolbox:
        ok(await toolbox.call("write_file", {"path": "answer.txt", "content": "42"}))
        result = await toolbox.call("submit", {})
        assert (result.reward, result.done) == (0.5, True)
        assert toolbox.reward == 0.5

    async def graded(sandbox: Sandbox) -> Grade:
        return Grade(reward=0.75, observation="Test execution complete.\nReward: 0.75")

    async with fake_toolbox(tests=graded) as toolbox:
        result = await toolbox.call("submit", {})
        assert (result.reward, result.done) == (0.75, True)
        assert result.observation == "Test execution complete.\nReward: 0.75"

    async def broken(sandbox: Sandbox) -> float:
        raise ValueError("grader bug")

    async with fake_toolbox(tests=broken) as toolbox:
        result = await toolbox.call("submit", {})
        assert "ValueError: grader bug" in infrastructure_error(result)
        assert (result.reward, result.done) == (None, True)
        assert toolbox.reward is None

    async def not_a_number(sandbox: Sandbox) -> float:
        return "yes"  # type: ignore[return-value]

    async with fake_toolbox(tests=not_a_number) as toolbox:
        infrastructure_error(await toolbox.call("submit", {}))


# -- infrastructure failures and cancellation -------------------------------------------------


async def test_infrastructure_failures_are_flagged() -> None:
    fake = FakeBackend()
    async with fake_toolbox(fake, tests=["true"]) as toolbox:
        sandbox = toolbox.sandbox
        await sandbox.start()
        assert sandbox.id is not None
        fake.kill(sandbox.id)
        for name, arguments in [
            ("bash", {"command": "true"}),
            ("read_file", {"path": "x"}),
            ("write_file", {"path": "x", "content": "x"}),
            ("str_replace_editor", edit("view", "x")),
        ]:
            observation = infrastructure_error(await toolbox.call(name, arguments))
            assert "died" in observation
            assert "infrastructure failure" in observation
        result = await toolbox.call("submit", {})
        infrastructure_error(result)
        assert (result.reward, result.done) == (None, True)

    async def unavailable(p: FakeProcess) -> int:
        raise BackendUnavailable("daemon gone")

    async with fake_toolbox(FakeBackend(commands={"sh": unavailable})) as toolbox:
        result = await toolbox.call("bash", {"command": "true"})
        assert "daemon gone" in infrastructure_error(result)

    async with fake_toolbox() as toolbox:
        await toolbox.sandbox.stop()
        infrastructure_error(await toolbox.call("read_file", {"path": "x"}))


async def test_cancellation_propagates() -> None:
    entered, left = anyio.Event(), anyio.Event()

    async def block(p: FakeProcess) -> int:
        entered.set()
        try:
            await anyio.sleep_forever()
        finally:
            left.set()
        return 0

    async with fake_toolbox(FakeBackend(commands={"sh": block})) as toolbox:
        results: list[ToolResult] = []
        with anyio.CancelScope() as scope:
            async with anyio.create_task_group() as tg:

                async def call() -> None:
                    results.append(await toolbox.call("bash", {"command": "anything"}))

                tg.start_soon(call)
                await entered.wait()
                scope.cancel()
        assert scope.cancelled_caught
        assert results == []  # cancellation is never turned into an observation
        with anyio.fail_after(5):
            await left.wait()


async def test_cancelling_a_call_kills_the_command(process_root: Path) -> None:
    async with process_toolbox(process_root) as toolbox:
        sandbox = toolbox.sandbox
        marker = unique_marker()  # on the shell's command line
        command = f": {marker}; while :; do echo . >> beat; sleep 0.02; done"
        results: list[ToolResult] = []
        async with anyio.create_task_group() as tg:

            async def call() -> None:
                results.append(await toolbox.call("bash", {"command": command, "timeout": 600}))

            tg.start_soon(call)
            await wait_for_size(sandbox, "beat", 10)
            tg.cancel_scope.cancel()
        assert results == []
        # The shell that alone writes the file is gone: it grows no more.
        await eventually_async(lambda: not processes_with(marker), what="the command killed")
        assert await size_of(sandbox, "beat") >= 10
        assert ok(await toolbox.call("bash", {"command": "echo alive"})) == "exit=0\nalive\n"
