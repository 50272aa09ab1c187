"""LangChain deepagents on asyncsandbox: :class:`SandboxBackend`, a
``deepagents.backends.sandbox.BaseSandbox`` whose commands and files are a sandbox's."""

from ._backend import SandboxBackend as SandboxBackend

__all__ = ("SandboxBackend",)

# Show public objects as `asyncsandbox_langchain.X` (in reprs, tracebacks and the API reference),
# as anyio does for its own.
for _obj in (SandboxBackend,):
    _obj.__module__ = __name__
del _obj
