"""The OpenAI Agents SDK on asyncsandbox: :class:`SandboxShell`, the executor of a
``ShellTool`` whose commands run in a sandbox."""

from ._shell import SandboxShell as SandboxShell

__all__ = ("SandboxShell",)

# Show public objects as `asyncsandbox_openai_agents.X` (in reprs, tracebacks and the API reference),
# as anyio does for its own.
for _obj in (SandboxShell,):
    _obj.__module__ = __name__
del _obj
