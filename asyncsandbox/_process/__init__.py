"""The embedded ``process`` backend: no daemon, sandboxes are directories and every
command runs in fresh Linux namespaces (bubblewrap, else unshare)."""

from ._backend import ProcessAttributes as ProcessAttributes, ProcessBackend as ProcessBackend

__all__ = ("ProcessAttributes", "ProcessBackend")
