"""The OpenAI Agents SDK on asyncsandbox: :class:`SandboxShell`, the executor of a
``ShellTool`` whose commands run in a sandbox."""

from ._shell import SandboxShell as SandboxShell

__all__ = ("SandboxShell",)
