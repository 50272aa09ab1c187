from __future__ import annotations

from functools import cache

__all__ = ("version",)


@cache
def version() -> str:
    """This distribution's version (the MCP server reports it)."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("asyncsandbox-mcp")
    except PackageNotFoundError:  # pragma: no cover - running from a source tree
        return "0"
