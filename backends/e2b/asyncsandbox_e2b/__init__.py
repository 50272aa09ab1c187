"""The E2B backend of asyncsandbox: sandboxes of any E2B-compatible API.

* :class:`E2bBackend` (``Session("e2b")``): the control plane over httpx, each sandbox's
  envd over Connect (asyncio and trio).
"""

from ._backend import E2bAttributes as E2bAttributes, E2bBackend as E2bBackend

__all__ = ("E2bAttributes", "E2bBackend")
