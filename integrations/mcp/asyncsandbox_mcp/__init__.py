"""An MCP server over asyncsandbox: ``asyncsandbox mcp`` (stdio, or streamable HTTP).

Each MCP session gets a sandbox of its own, created on its first tool call and removed
when the session ends (its client leaves or ends it, it stays idle past
:attr:`McpConfig.idle_timeout`, or the server stops). Its tools are
:class:`asyncsandbox.tools.Toolbox`'s: the same names (its ``python``, stateful Python, is
``run_code``, whose images come back as MCP image content), arguments and schemas, with
MCP's behaviour hints. A tool's failure is a result with ``isError`` (and, when the failure is
the infrastructure's rather than the call's, ``_meta["asyncsandbox/infrastructure_error"]``),
never a protocol error.

Embed it with :func:`serve_stdio`, :func:`serve_http`, or mount :func:`create_app` (an ASGI
application, asyncio) over a :class:`Workspaces` of your own.
"""

from typing import TYPE_CHECKING, Any

from ._cli import main as main
from ._config import MCP_TOOL_NAMES as MCP_TOOL_NAMES, McpConfig as McpConfig
from ._server import INFRASTRUCTURE_ERROR as INFRASTRUCTURE_ERROR
from ._stdio import serve_stdio as serve_stdio
from ._workspaces import Workspaces as Workspaces

if TYPE_CHECKING:
    from ._http import create_app as create_app, serve_http as serve_http

__all__ = (
    "MCP_TOOL_NAMES",
    "McpConfig",
    "Workspaces",
    "serve_stdio",
    "serve_http",
    "create_app",
    "INFRASTRUCTURE_ERROR",
    "main",
)

# Show public objects as `asyncsandbox_mcp.X` (in reprs, tracebacks and the API reference),
# as anyio does for its own (the HTTP transport's in ._http).
for _obj in (McpConfig, Workspaces, serve_stdio, main):
    _obj.__module__ = __name__
del _obj


_LAZY = ("create_app", "serve_http")


def __getattr__(name: str) -> Any:
    # The streamable-HTTP transport (Starlette, MCP's auth, the remote server's tenants) is
    # imported when first asked for: `asyncsandbox mcp` over stdio never needs it (its
    # imports were ~120 ms of CPU of the stdio server's ~1 s start; the MCP SDK is the rest).
    if name in _LAZY:
        from . import _http

        return getattr(_http, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__() -> list[str]:  # what dir() and the API reference's autodoc list
    return sorted([*globals(), *_LAZY])
