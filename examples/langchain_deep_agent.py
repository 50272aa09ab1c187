"""A LangChain deep agent (``deepagents``) whose backend is a sandbox
(``asyncsandbox-langchain``).

deepagents gives the agent its file tools (``ls``, ``read_file``, ``write_file``,
``edit_file``, ``glob``, ``grep``) and ``execute``, all through the backend: here
:class:`~asyncsandbox_langchain.SandboxBackend`, so they act in the sandbox. The task: fix
a failing test. By default the chat model is scripted (NOT a model: LangChain's
``GenericFakeChatModel`` replaying fixed tool calls, so no API key is needed): it runs the
test, reads the file, fixes it with ``edit_file`` and runs the test again. Any LangChain
chat model works instead (``--model openai:gpt-4.1``, with its key).

Run it::

    uv run examples/langchain_deep_agent.py
    uv run examples/langchain_deep_agent.py --backend docker --image python:3.12-slim
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from typing import Any

import _support
import anyio
from asyncsandbox_langchain import SandboxBackend
from deepagents import create_deep_agent
from langchain_core.language_models import BaseChatModel
from langchain_core.language_models.fake_chat_models import GenericFakeChatModel
from langchain_core.messages import AIMessage, HumanMessage, ToolMessage

CODE = "def add(a, b):\n    return a - b\n"
TEST = "from calc import add\nassert add(2, 3) == 5, add(2, 3)\nprint('ok')\n"
TASK = "test_calc.py fails. Fix calc.py so that it passes."


class ScriptedChatModel(GenericFakeChatModel):
    """GenericFakeChatModel takes no tools; the script needs none bound."""

    def bind_tools(self, tools: Sequence[Any], **kwargs: Any) -> Any:
        return self


def script() -> list[AIMessage]:
    def call(name: str, n: int, **args: Any) -> AIMessage:
        return AIMessage(content="", tool_calls=[{"name": name, "args": args, "id": f"call-{n}"}])

    return [
        # -B: an edit within the same second that keeps the file's size would otherwise
        # run the stale bytecode Python cached for it (it compares mtime seconds and size).
        call("execute", 1, command="cd /workspace && python3 -B test_calc.py"),
        call("read_file", 2, file_path="/workspace/calc.py"),
        call(
            "edit_file", 3, file_path="/workspace/calc.py", old_string="a - b", new_string="a + b"
        ),
        call("execute", 4, command="cd /workspace && python3 -B test_calc.py"),
        AIMessage(content="Fixed: add() subtracted; test_calc.py prints ok now."),
    ]


def show(text: str) -> str:
    """The last two lines of a tool's answer that are not blank."""
    return " | ".join([line for line in text.splitlines() if line.strip()][-2:])


async def main(args: argparse.Namespace) -> None:
    model: BaseChatModel | str
    model = ScriptedChatModel(messages=iter(script())) if args.model == "scripted" else args.model
    async with _support.new_session(args) as session, session.sandbox() as sandbox:
        await sandbox.write_file("calc.py", CODE)
        await sandbox.write_file("test_calc.py", TEST)
        agent = create_deep_agent(model=model, backend=SandboxBackend(sandbox))
        result = await agent.ainvoke({"messages": [HumanMessage(TASK)]})
        for message in result["messages"]:
            if isinstance(message, AIMessage) and message.tool_calls:
                for tool_call in message.tool_calls:
                    print(f"> {tool_call['name']} {tool_call['args']}"[:100])
            elif isinstance(message, ToolMessage):
                print(f"< {show(str(message.content))}"[:120])
        print(f"Answer: {result['messages'][-1].content}")
        check = await sandbox.exec(["python3", "-B", "test_calc.py"])
        print(
            f"test_calc.py in the sandbox afterwards: exit={check.returncode} {check.stdout_text.strip()}"
        )


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    _support.add_backend_arguments(parser)
    parser.add_argument("--model", default="scripted", help="a LangChain model, or scripted")
    args = parser.parse_args()
    _support.configure_logging(args.verbose)
    anyio.run(main, args)
