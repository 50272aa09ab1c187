"""The Docker backend of asyncsandbox: sandboxes are containers, driven through the Engine
API with aiodocker."""

from ._backend import DockerAttributes as DockerAttributes, DockerBackend as DockerBackend

__all__ = ("DockerAttributes", "DockerBackend")
