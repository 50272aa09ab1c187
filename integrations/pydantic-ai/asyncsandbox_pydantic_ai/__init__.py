"""pydantic-ai's workspaces on asyncsandbox: :class:`SandboxWorkspace`, a
``pydantic_ai.workspaces.WorkspaceBackend`` whose environment is a sandbox."""

from ._backend import PROVIDER as PROVIDER, SandboxWorkspace as SandboxWorkspace

__all__ = ("SandboxWorkspace", "PROVIDER")
