"""The e2b backend of asyncsandbox: sandboxes of any E2B-compatible API (E2B's cloud, its
self-hosted infrastructure, or ``asyncsandbox serve``), through asyncsandbox's API.

* :class:`E2bBackend` (``Session("e2b")``): on httpx (asyncio and trio).
* :class:`E2bAttributes`: typed attributes of its sandboxes.
"""

from ._backend import E2bBackend as E2bBackend
from ._sandbox import E2bAttributes as E2bAttributes

__all__ = ("E2bAttributes", "E2bBackend")

# Show public objects as `asyncsandbox_e2b.X` (in reprs, tracebacks and the API reference),
# as anyio does for its own.
for _obj in (E2bAttributes, E2bBackend):
    _obj.__module__ = __name__
del _obj
