"""pydantic-ai's workspaces on asyncsandbox: :class:`SandboxWorkspace`, a
``pydantic_ai.workspaces.WorkspaceBackend`` whose environment is a sandbox."""

from ._backend import PROVIDER as PROVIDER, SandboxWorkspace as SandboxWorkspace

__all__ = ("SandboxWorkspace", "PROVIDER")

# Show public objects as `asyncsandbox_pydantic_ai.X` (in reprs, tracebacks and the API reference),
# as anyio does for its own.
for _obj in (SandboxWorkspace,):
    _obj.__module__ = __name__
del _obj
