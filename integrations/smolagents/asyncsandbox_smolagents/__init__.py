"""smolagents on asyncsandbox: :class:`SandboxExecutor`, the executor of a ``CodeAgent``
whose code runs in a sandbox's stateful interpreter."""

from ._executor import SandboxExecutor as SandboxExecutor

__all__ = ("SandboxExecutor",)

# Show public objects as `asyncsandbox_smolagents.X` (in reprs, tracebacks and the API reference),
# as anyio does for its own.
for _obj in (SandboxExecutor,):
    _obj.__module__ = __name__
del _obj
