"""A pydantic-ai agent whose workspace is a sandbox (``asyncsandbox-pydantic-ai``).

The agent gets two tools that act through ``ctx.workspace``: ``shell`` (a command) and
``write_file``. Its task: make ``fizzbuzz.py`` print FizzBuzz from 1 to 15. By default the
model is scripted (pydantic-ai's ``FunctionModel``: NOT a model, a script of tool calls):
it writes a draft with a bug, runs it, reads the error, fixes the file, runs it again and
answers. Any pydantic-ai model works instead (``--model openai:gpt-4o-mini``, with its key).

Run it::

    uv run examples/pydantic_ai_agent.py
    uv run examples/pydantic_ai_agent.py --backend docker --image python:3.12-slim

The workspace outlives the run: its ref is printed, and a second backend attached by that
ref (as a later run, or another process, would) reads the file the agent wrote.
"""

from __future__ import annotations

import argparse

import _support
import anyio
from asyncsandbox_pydantic_ai import SandboxWorkspace
from pydantic_ai import Agent, RunContext
from pydantic_ai.messages import ModelMessage, ModelResponse, TextPart, ToolCallPart, ToolReturnPart
from pydantic_ai.models import Model
from pydantic_ai.models.function import AgentInfo, FunctionModel

TASK = "Make fizzbuzz.py print FizzBuzz for 1 to 15, one per line, and run it."
DRAFT = "for i in range(1, 16):\n    print('FizzBuzz' if i % 15 == 0 else 'Fizz' if i % 3 == 0 else 'Buzz' if i % 5 == 0 else i\n"
FIXED = DRAFT.replace("else i\n", "else i)\n")
SCRIPT = [
    ("write_file", {"path": "fizzbuzz.py", "content": DRAFT}),
    ("shell", {"command": "python3 fizzbuzz.py"}),
    ("write_file", {"path": "fizzbuzz.py", "content": FIXED}),
    ("shell", {"command": "python3 fizzbuzz.py | tail -3"}),
]


def scripted(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
    """The script: the next tool call, or, once all ran, an answer quoting the last output."""
    returns = [
        part for message in messages for part in message.parts if isinstance(part, ToolReturnPart)
    ]
    if len(returns) < len(SCRIPT):
        name, args = SCRIPT[len(returns)]
        return ModelResponse(parts=[ToolCallPart(name, args, tool_call_id=f"call-{len(returns)}")])
    return ModelResponse(parts=[TextPart(f"Done. The last lines:\n{returns[-1].content}")])


def build_agent(model: Model | str) -> Agent[None, str]:
    agent = Agent(
        model, deps_type=type(None), instructions="You work in a Linux sandbox with python3."
    )

    @agent.tool
    async def shell(ctx: RunContext[None], command: str) -> str:
        """Run a shell command in the workspace; its exit code and output."""
        result = await ctx.workspace.run(command, shell=True, timeout=30)
        return f"exit={result.exit_code}\n{result.stdout}{result.stderr}"

    @agent.tool
    async def write_file(ctx: RunContext[None], path: str, content: str) -> str:
        """Create or replace a file in the workspace."""
        await ctx.workspace.write_text(path, content)
        return f"wrote {path}"

    return agent


async def main(args: argparse.Namespace) -> None:
    model = FunctionModel(scripted) if args.model == "scripted" else args.model
    agent = build_agent(model)
    async with _support.new_session(args) as session:
        backend = SandboxWorkspace(session)
        result = await agent.run(TASK, workspace=backend)
        for message in result.all_messages():
            for part in message.parts:
                if isinstance(part, ToolCallPart):
                    print(f"> {part.tool_name} {part.args_as_dict()}"[:100])
                elif isinstance(part, ToolReturnPart):
                    lines = str(part.content).splitlines()
                    print(f"< {lines[0]}" + (f" ... {lines[-1]}" if len(lines) > 1 else ""))
        print(f"Answer: {result.output}")
        print(f"Workspace: {backend.ref}")
        again = SandboxWorkspace(session, ref=backend.ref)
        print(
            f"Attached by ref: fizzbuzz.py has {len(await again.read_bytes('/workspace/fizzbuzz.py'))} bytes"
        )


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    _support.add_backend_arguments(parser)
    parser.add_argument("--model", default="scripted", help="a pydantic-ai model name, or scripted")
    args = parser.parse_args()
    _support.configure_logging(args.verbose)
    anyio.run(main, args)
