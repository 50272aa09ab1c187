"""LangChain deepagents on asyncsandbox: :class:`SandboxBackend`, a
``deepagents.backends.sandbox.BaseSandbox`` whose commands and files are a sandbox's."""

from ._backend import SandboxBackend as SandboxBackend

__all__ = ("SandboxBackend",)
