"""The Ray backend of asyncsandbox: sandboxes placed across the nodes of a Ray cluster,
each hosted by its node's agent actor (``Session("ray")``)."""

from ._backend import RayAttributes as RayAttributes, RayBackend as RayBackend

__all__ = ("RayAttributes", "RayBackend")
