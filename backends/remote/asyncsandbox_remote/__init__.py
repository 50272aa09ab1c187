"""The remote backend of asyncsandbox: sandboxes on a server, over HTTP.

* :class:`RemoteBackend` (``Session("remote")``): the client, on httpx (asyncio and trio).
* :mod:`asyncsandbox_remote.server`: the server, ``asyncsandbox serve`` (Starlette on
  uvicorn), which runs any backend for many tenants.
"""

from ._client import RemoteBackend as RemoteBackend
from ._sandbox import RemoteAttributes as RemoteAttributes

__all__ = ("RemoteAttributes", "RemoteBackend")

# Show public objects as `asyncsandbox_remote.X` (in reprs, tracebacks and the API reference),
# as anyio does for its own.
for _obj in (RemoteAttributes, RemoteBackend):
    _obj.__module__ = __name__
del _obj
