"""An MCP client driving ``asyncsandbox mcp``: the server any MCP-speaking agent (Claude
Desktop, Cursor, the OpenAI Agents SDK, pydantic-ai, smolagents, ...) can use.

It starts the server over stdio as an MCP host would (``asyncsandbox mcp``, the
``asyncsandbox-mcp`` distribution), lists its tools (the ``asyncsandbox.tools`` Toolbox's,
same names and arguments), then plays a scripted agent's turns (NOT a model: fixed tool
calls) in the session's sandbox: write a program, run it, fix it with
``str_replace_editor``, run it again. Files persist across the calls of the session; the
sandbox is removed when the client disconnects.

Run it::

    uv run examples/mcp_client.py
    uv run examples/mcp_client.py --backend docker --image python:3.12-slim

An MCP host runs the same server from its configuration, e.g.::

    {"mcpServers": {"sandbox": {"command": "asyncsandbox", "args": ["mcp"]}}}
"""

from __future__ import annotations

import argparse
import os
import sys

import anyio
import mcp_types
from mcp import Client, StdioServerParameters

TURNS = [
    (
        "write_file",
        {
            "path": "primes.py",
            "content": "print([n for n in range(2, 30) if all(n % d for d in range(2, n))]\n",
        },
    ),
    ("bash", {"command": "python3 primes.py"}),
    (
        "str_replace_editor",
        {"command": "str_replace", "path": "primes.py", "old_str": "n))]", "new_str": "n))])"},
    ),
    ("bash", {"command": "python3 primes.py"}),
]


async def main(args: argparse.Namespace) -> None:
    server = [sys.executable, "-m", "asyncsandbox", "mcp", "--backend", args.backend]
    for option in args.backend_option:
        server += ["--backend-option", option]
    if args.image:
        server += ["--image", args.image]
    params = StdioServerParameters(command=server[0], args=server[1:], env=dict(os.environ))
    async with Client(params) as client:
        tools = (await client.list_tools()).tools
        print("Tools: " + ", ".join(tool.name for tool in tools))
        for name, arguments in TURNS:
            result = await client.call_tool(name, arguments)
            text = "".join(c.text for c in result.content if isinstance(c, mcp_types.TextContent))
            lines = [line for line in text.splitlines() if line.strip()]
            flag = " (error)" if result.is_error else ""
            print(f"> {name}{flag}: {lines[0]}" + (f" ... {lines[-1]}" if len(lines) > 1 else ""))


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--backend", default="process", help="the server's backend")
    parser.add_argument("--backend-option", action="append", default=[], metavar="KEY=VALUE")
    parser.add_argument("--image", help="image of the sandboxes")
    anyio.run(main, parser.parse_args())
