"""The Ray backend of asyncsandbox: sandboxes placed across the nodes of a Ray cluster,
each hosted by its node's agent actor (``Session("ray")``)."""

from ._backend import RayAttributes as RayAttributes, RayBackend as RayBackend

__all__ = ("RayAttributes", "RayBackend")

# Show public objects as `asyncsandbox_ray.X` (in reprs, tracebacks and the API reference),
# as anyio does for its own.
for _obj in (RayAttributes, RayBackend):
    _obj.__module__ = __name__
del _obj
