"""The e2b backend of asyncsandbox: sandboxes of any E2B-compatible API (E2B's cloud, its
self-hosted infrastructure, or ``asyncsandbox serve``), through asyncsandbox's API.

* :class:`E2bBackend` (``Session("e2b")``): on httpx (asyncio and trio).
* :class:`E2bAttributes`: typed attributes of its sandboxes.
"""

from ._backend import E2bBackend as E2bBackend
from ._sandbox import E2bAttributes as E2bAttributes

__all__ = ("E2bAttributes", "E2bBackend")
