"""An OpenAI Agents SDK agent whose shell is a sandbox (``asyncsandbox-openai-agents``).

``ShellTool(executor=SandboxShell(sandbox))``: every shell call the model makes runs in
the sandbox, command by command, each with its outcome (exit code, or timeout). The task:
find which of three scripts crashes. By default the model is scripted (NOT a model: an
``agents.Model`` replaying fixed shell calls, so no API key is needed); with
``--model gpt-4.1`` the SDK's OpenAI model is used (``$OPENAI_API_KEY``).

Run it::

    uv run examples/openai_agents_shell.py
    uv run examples/openai_agents_shell.py --backend docker --image python:3.12-slim
"""

from __future__ import annotations

import argparse
from collections.abc import AsyncIterator
from typing import Any

import _support
import anyio
from agents import Agent, Model, ModelResponse, RunConfig, Runner, ShellTool, Usage
from agents.items import ToolCallItem, ToolCallOutputItem
from asyncsandbox_openai_agents import SandboxShell
from openai.types.responses import (
    ResponseFunctionShellToolCall,
    ResponseOutputMessage,
    ResponseOutputText,
)
from openai.types.responses.response_function_shell_tool_call import Action

SCRIPTS = {
    "a.py": "print(sum(range(10)))\n",
    "b.py": "print({}['missing'])\n",
    "c.py": "import time\nwhile True:\n    time.sleep(1)\n",
}
TASK = "Three scripts are in the working directory. Which of them crash?"


class ScriptedModel(Model):
    """NOT a model: two shell calls, then an answer read off the outputs."""

    def __init__(self) -> None:
        self.turn = 0

    async def get_response(self, *args: Any, **kwargs: Any) -> ModelResponse:
        self.turn += 1
        item: Any
        if self.turn == 1:
            commands = ["ls *.py"]
        elif self.turn == 2:
            commands = [f"python3 {name}" for name in sorted(SCRIPTS)]
        else:
            text = "b.py crashes (KeyError); c.py never ends; a.py prints 45."
            return ModelResponse(
                output=[
                    ResponseOutputMessage(
                        id="msg",
                        content=[ResponseOutputText(annotations=[], text=text, type="output_text")],
                        role="assistant",
                        status="completed",
                        type="message",
                    )
                ],
                usage=Usage(),
                response_id=None,
            )
        item = ResponseFunctionShellToolCall(
            id=f"sh_{self.turn}",
            call_id=f"call_{self.turn}",
            action=Action(commands=commands, timeout_ms=2000),
            status="completed",
            type="shell_call",
        )
        return ModelResponse(output=[item], usage=Usage(), response_id=None)

    def stream_response(self, *args: Any, **kwargs: Any) -> AsyncIterator[Any]:
        raise NotImplementedError("scripted: no streaming")


async def main(args: argparse.Namespace) -> None:
    model: Model | str = ScriptedModel() if args.model == "scripted" else args.model
    async with _support.new_session(args) as session, session.sandbox() as sandbox:
        for name, code in SCRIPTS.items():
            await sandbox.write_file(name, code)
        agent = Agent(
            name="debugger",
            instructions="Use the shell to answer.",
            model=model,
            tools=[ShellTool(executor=SandboxShell(sandbox))],
        )
        result = await Runner.run(
            agent, TASK, run_config=RunConfig(tracing_disabled=args.model == "scripted")
        )
        commands: list[str] = []
        for item in result.new_items:
            if isinstance(item, ToolCallItem) and isinstance(item.raw_item, dict):
                commands = item.raw_item["action"]["commands"]  # the shell call, as sent
            elif isinstance(item, ToolCallOutputItem) and isinstance(item.raw_item, dict):
                for command, entry in zip(commands, item.raw_item["output"], strict=False):
                    outcome = entry["outcome"]
                    status = outcome.get("exit_code", outcome["type"])
                    text = (entry["stdout"] + entry["stderr"]).strip().splitlines()
                    print(f"$ {command} -> {status}: {text[-1] if text else ''}")
        print(f"Answer: {result.final_output}")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    _support.add_backend_arguments(parser)
    parser.add_argument("--model", default="scripted", help="an OpenAI model name, or scripted")
    args = parser.parse_args()
    _support.configure_logging(args.verbose)
    anyio.run(main, args)
