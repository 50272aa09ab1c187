"""The Docker backend of asyncsandbox: sandboxes are containers, driven through the Engine
API with aiodocker."""

from ._backend import DockerAttributes as DockerAttributes, DockerBackend as DockerBackend

__all__ = ("DockerAttributes", "DockerBackend")

# Show public objects as `asyncsandbox_docker.X` (in reprs, tracebacks and the API reference),
# as anyio does for its own.
for _obj in (DockerAttributes, DockerBackend):
    _obj.__module__ = __name__
del _obj
