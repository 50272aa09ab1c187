"""What the MCP server offers and how long a session's sandbox may live: one struct,
built once (from the command line or by the embedding application) and passed down.

No ``from __future__ import annotations``: the struct's annotations are evaluated here, so
that msgspec and :func:`typing.get_type_hints` still resolve them once :mod:`asyncsandbox_mcp`
claims the struct as its own."""

import math
from typing import Any

import msgspec

from asyncsandbox import InvalidArgument

__all__ = ("MCP_TOOL_NAMES", "McpConfig", "toolbox_name")

MCP_TOOL_NAMES = (
    "bash",
    "execute_bash",
    "run_code",
    "read_file",
    "write_file",
    "str_replace_editor",
)
"""Every tool the server knows: the :class:`~asyncsandbox.tools.Toolbox`'s own (``submit``
excepted: an MCP session has no task to grade), its ``python`` named ``run_code`` (the
name E2B's and the other code-interpreter MCP servers give it)."""
_DEFAULT_TOOLS = ("bash", "read_file", "write_file", "str_replace_editor", "run_code")
_TOOLBOX_NAMES = {"run_code": "python"}


def toolbox_name(name: str) -> str:
    """The :class:`~asyncsandbox.tools.Toolbox`'s name of the MCP tool ``name``."""
    return _TOOLBOX_NAMES.get(name, name)


class McpConfig(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """The MCP server's settings (frozen; unknown fields rejected)."""

    tools: tuple[str, ...] | None = None
    """The tools to offer, in order, a subset of :data:`MCP_TOOL_NAMES`. ``None``:
    ``bash``, ``read_file``, ``write_file``, ``str_replace_editor`` and ``run_code``."""
    bash_timeout: float = 30.0
    """Seconds a ``bash`` command may run when the call gives no ``timeout``."""
    max_bash_timeout: float = 600.0
    """The longest ``timeout`` a call may ask for."""
    max_observation_chars: int = 10_000
    """A tool result longer than this keeps its head and tail around a marker."""
    max_sessions: int = 64
    """Sessions (so sandboxes) at once; a client opening one more is refused (HTTP 503)."""
    idle_timeout: float | None = 1800.0
    """Streamable HTTP: a session with no request for this many seconds ends, and its
    sandbox is removed. ``None``: sessions end only when their client ends them (or the
    server stops). Not applied to stdio, whose one session lasts as long as its client."""

    def __post_init__(self) -> None:
        if self.tools is not None:
            if "submit" in self.tools:
                raise InvalidArgument("the submit tool needs a task's tests; MCP offers none")
            for name in self.tools:
                if name not in MCP_TOOL_NAMES:
                    raise InvalidArgument(
                        f"unknown tool {name!r}; known: {', '.join(MCP_TOOL_NAMES)}"
                    )
        if self.max_sessions < 1:
            raise InvalidArgument("max_sessions must be >= 1")
        if self.idle_timeout is not None and not (
            math.isfinite(self.idle_timeout) and self.idle_timeout > 0
        ):
            raise InvalidArgument("idle_timeout must be a positive number of seconds or None")

    def toolbox_options(self) -> dict[str, Any]:
        """The keyword arguments of :class:`~asyncsandbox.tools.Toolbox` these settings
        give (the Toolbox validates them)."""
        return {
            "tools": tuple(toolbox_name(name) for name in self.tools or _DEFAULT_TOOLS),
            "bash_timeout": self.bash_timeout,
            "max_bash_timeout": self.max_bash_timeout,
            "max_observation_chars": self.max_observation_chars,
        }
