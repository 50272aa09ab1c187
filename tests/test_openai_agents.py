"""The OpenAI Agents SDK's ``ShellTool`` with our executor (``asyncsandbox_openai_agents.
SandboxShell``), called as the SDK calls it: ``Runner.run`` of an ``Agent`` whose model
(scripted here: no API key) asks for shell calls; the SDK builds the
``ShellCommandRequest``, runs the executor, and turns its ``ShellResult`` (or its
exception) into the ``shell_call_output`` the model sees next."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from agents import (
    Agent,
    Model,
    ModelResponse,
    ModelSettings,
    RunConfig,
    Runner,
    ShellTool,
    Usage,
)
from agents.items import ToolCallOutputItem
from asyncsandbox_openai_agents import SandboxShell
from openai.types.responses import (
    ResponseFunctionShellToolCall,
    ResponseOutputMessage,
    ResponseOutputText,
)
from openai.types.responses.response_function_shell_tool_call import Action

from asyncsandbox import Sandbox, SandboxDied, Session


class ScriptedModel(Model):
    """A model that answers with the given turns, one per request: shell calls (a list of
    commands, with an optional timeout), then a final text. It records its inputs."""

    def __init__(self, *turns: tuple[list[str], int | None] | str) -> None:
        self.turns = list(turns)
        self.inputs: list[Any] = []

    async def get_response(self, *args: Any, **kwargs: Any) -> ModelResponse:
        self.inputs.append(args[1] if len(args) > 1 else kwargs.get("input"))
        turn = self.turns.pop(0)
        n = len(self.inputs)
        item: Any
        if isinstance(turn, str):
            text = ResponseOutputText(annotations=[], text=turn, type="output_text")
            item = ResponseOutputMessage(
                id=f"msg_{n}", content=[text], role="assistant", status="completed", type="message"
            )
        else:
            commands, timeout_ms = turn
            item = ResponseFunctionShellToolCall(
                id=f"sh_{n}",
                call_id=f"call_{n}",
                action=Action(commands=commands, timeout_ms=timeout_ms),
                status="completed",
                type="shell_call",
            )
        return ModelResponse(output=[item], usage=Usage(), response_id=None)

    def stream_response(self, *args: Any, **kwargs: Any) -> AsyncIterator[Any]:
        raise NotImplementedError("scripted: get_response only")


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"  # the Agents SDK's runner is asyncio-only


@pytest.fixture
async def sandbox(process_root: Path) -> AsyncIterator[Sandbox]:
    async with (
        Session("process", backend_options={"root": str(process_root)}) as session,
        session.sandbox() as sandbox,
    ):
        yield sandbox


async def run(model: ScriptedModel, shell: SandboxShell) -> list[ToolCallOutputItem]:
    agent = Agent(
        name="coder",
        instructions="Use the shell.",
        model=model,
        model_settings=ModelSettings(),
        tools=[ShellTool(executor=shell)],
    )
    result = await Runner.run(agent, "go", run_config=RunConfig(tracing_disabled=True))
    return [item for item in result.new_items if isinstance(item, ToolCallOutputItem)]


def entries(item: ToolCallOutputItem) -> list[dict[str, Any]]:
    raw = item.raw_item
    assert isinstance(raw, dict)
    assert raw["type"] == "shell_call_output"
    output: object = raw["output"]
    assert isinstance(output, list)
    return output


async def test_the_sdk_runs_the_models_commands_in_the_sandbox(sandbox: Sandbox) -> None:
    model = ScriptedModel(
        (["echo hello > note.txt", "cat note.txt; pwd", "echo oops >&2; exit 3"], None),
        (["cat note.txt"], None),
        "done",
    )
    first, second = await run(model, SandboxShell(sandbox))
    assert [e["outcome"] for e in entries(first)] == [
        {"type": "exit", "exit_code": 0},
        {"type": "exit", "exit_code": 0},
        {"type": "exit", "exit_code": 3},
    ]
    assert [e["stdout"] for e in entries(first)] == ["", "hello\n/workspace\n", ""]
    assert entries(first)[2]["stderr"] == "oops\n"
    assert first.raw_item["status"] == "completed"  # type: ignore[index]
    assert entries(second)[0]["stdout"] == "hello\n"  # the files persist between calls
    # The model got the outputs back as the next turn's input.
    assert any(
        isinstance(i, dict)
        and i.get("type") == "shell_call_output"
        and i.get("call_id") == "call_1"
        for i in model.inputs[1]
    )


async def test_a_timeout_is_the_sdks_timeout_outcome_and_the_next_commands_run(
    sandbox: Sandbox,
) -> None:
    model = ScriptedModel(
        # (2 s: the output before the kill is asserted; CI's load can delay a first line)
        (["echo partial; exec flock held sh -c 'touch locked; exec sleep 60'", "echo next"], 2000),
        (["test -e locked && flock -n held echo released"], None),
        "done",
    )
    first, second = await run(model, SandboxShell(sandbox))
    timed_out, following = entries(first)
    assert timed_out["outcome"] == {"type": "timeout"}
    assert timed_out["stdout"] == "partial\n"
    assert following["outcome"] == {"type": "exit", "exit_code": 0}
    assert following["stdout"] == "next\n"
    # The sleep held a lock; it is free: the command was killed, with what it started.
    assert entries(second)[0]["stdout"] == "released\n"


async def test_a_dead_sandbox_fails_the_call_apart_from_command_outcomes(
    sandbox: Sandbox, process_root: Path
) -> None:
    """An infrastructure failure is raised by the executor: the SDK reports the call as
    failed with our error's message, never as a command that exited."""
    await sandbox.exec(["true"])
    assert sandbox.id is not None
    async with Session("process", backend_options={"root": str(process_root)}) as other:
        await other.delete(ids=[sandbox.id])
    model = ScriptedModel((["echo unreachable"], None), "done")
    (item,) = await run(model, SandboxShell(sandbox))
    raw = item.raw_item
    assert isinstance(raw, dict)
    assert raw["status"] == "failed"  # not a command's exit: the call itself failed
    assert isinstance(item.output, str)
    assert item.output == f"sandbox {sandbox.id!r} died: removed"  # SandboxDied's message
    with pytest.raises(SandboxDied):
        await sandbox.exec(["true"])


@pytest.mark.parametrize("anyio_backend", ["asyncio", "trio"])
async def test_the_executor_alone_runs_on_asyncio_and_trio(
    anyio_backend: str, process_root: Path
) -> None:
    from agents import RunContextWrapper, ShellCommandRequest
    from agents.tool import ShellActionRequest, ShellCallData

    async with (
        Session("process", backend_options={"root": str(process_root)}) as session,
        session.sandbox() as sandbox,
    ):
        request = ShellCommandRequest(
            ctx_wrapper=RunContextWrapper(context=None),
            data=ShellCallData(
                call_id="c",
                action=ShellActionRequest(commands=["echo $((6*7))"], timeout_ms=10_000),
            ),
        )
        result = await SandboxShell(sandbox)(request)
    assert [(o.stdout, o.exit_code, o.status) for o in result.output] == [("42\n", 0, "completed")]
