"""The MCP server: the :class:`~asyncsandbox.tools.Toolbox`'s tools, same names (its
``python`` is ``run_code``), same arguments, same JSON schemas, over the SDK's low-level
:class:`mcp.server.Server` (whose handlers take the schemas as given, so there is one
definition of each tool's arguments: the Toolbox's). Images a call produced (``run_code``:
figures, ``_repr_png_``) follow its text as MCP image content."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import mcp_types as types
from mcp.server import Server, ServerRequestContext

from ._config import MCP_TOOL_NAMES, toolbox_name
from ._workspaces import Workspaces

__all__ = ("INFRASTRUCTURE_ERROR", "create_server")

INFRASTRUCTURE_ERROR = "asyncsandbox/infrastructure_error"
"""The ``_meta`` key set (to ``true``) on a tool result whose failure is not the call's
doing (the sandbox died, the backend is unreachable): mask the episode, do not score it."""

# MCP's behaviour hints. No tool reaches outside the sandbox, which has no network.
_ANNOTATIONS = {
    "bash": types.ToolAnnotations(
        title="Run a shell command",
        read_only_hint=False,
        destructive_hint=True,
        idempotent_hint=False,
        open_world_hint=False,
    ),
    "execute_bash": types.ToolAnnotations(
        title="Run a bash command (directory and variables persist)",
        read_only_hint=False,
        destructive_hint=True,
        idempotent_hint=False,
        open_world_hint=False,
    ),
    "run_code": types.ToolAnnotations(
        title="Run Python code (variables and imports persist)",
        read_only_hint=False,
        destructive_hint=True,
        idempotent_hint=False,
        open_world_hint=False,
    ),
    "read_file": types.ToolAnnotations(
        title="Read a file", read_only_hint=True, idempotent_hint=True, open_world_hint=False
    ),
    "write_file": types.ToolAnnotations(
        title="Write a file",
        read_only_hint=False,
        destructive_hint=True,
        idempotent_hint=True,
        open_world_hint=False,
    ),
    "str_replace_editor": types.ToolAnnotations(
        title="View, create and edit files",
        read_only_hint=False,
        destructive_hint=True,
        idempotent_hint=False,
        open_world_hint=False,
    ),
}

INSTRUCTIONS = (
    "Each session has a sandbox of its own: an isolated Linux environment without network, "
    "created on the first tool call. Files persist from one call to the next; the sandbox "
    "and everything in it are removed when the session ends."
)

SessionKey = Callable[[ServerRequestContext[Any, Any]], str | None]
"""Which session a request belongs to (``None``: the transport keeps no session)."""


def create_server(workspaces: Workspaces, session_key: SessionKey, *, version: str) -> Server[Any]:
    """The MCP server over ``workspaces``; ``session_key`` tells the sessions apart."""
    names = {toolbox_name(name): name for name in MCP_TOOL_NAMES}  # the Toolbox's -> ours
    tools = [
        types.Tool(
            name=names[schema["function"]["name"]],
            description=schema["function"]["description"],
            input_schema=schema["function"]["parameters"],
            annotations=_ANNOTATIONS[names[schema["function"]["name"]]],
        )
        for schema in workspaces.schemas()
    ]
    schemas = {tool.name: tool.input_schema for tool in tools}
    offered = ", ".join(schemas)

    async def list_tools(
        ctx: ServerRequestContext[Any, Any], params: types.PaginatedRequestParams | None
    ) -> types.ListToolsResult:
        return types.ListToolsResult(tools=tools)

    async def call_tool(
        ctx: ServerRequestContext[Any, Any], params: types.CallToolRequestParams
    ) -> types.CallToolResult:
        key = session_key(ctx)
        if key is None:
            return types.CallToolResult(
                content=[
                    types.TextContent(
                        type="text",
                        text=(
                            "Error: this server keeps a sandbox per session; connect with a "
                            "protocol version that has sessions (2025-11-25)."
                        ),
                    )
                ],
                is_error=True,
            )
        if params.name not in schemas:  # (the Toolbox's own names are not ours)
            return types.CallToolResult(
                content=[
                    types.TextContent(
                        type="text",
                        text=f"Error: unknown tool {params.name!r}; the tools are: {offered}",
                    )
                ],
                is_error=True,
            )
        result = await workspaces.call(key, toolbox_name(params.name), params.arguments)
        content: list[types.ContentBlock] = [
            types.TextContent(type="text", text=result.observation)
        ]
        content += [
            types.ImageContent(type="image", data=image.base64, mime_type=image.mime_type)
            for image in result.images
        ]
        return types.CallToolResult(
            content=content,
            is_error=result.is_error,
            _meta={INFRASTRUCTURE_ERROR: True} if result.infrastructure_error else None,
        )

    return Server(
        "asyncsandbox",
        version=version,
        title="asyncsandbox",
        instructions=INSTRUCTIONS,
        get_tool_input_schema=schemas.get,
        on_list_tools=list_tools,
        on_call_tool=call_tool,
    )
