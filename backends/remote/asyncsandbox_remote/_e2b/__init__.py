"""The E2B-compatible API of ``asyncsandbox serve``: E2B's control plane, each sandbox's
envd (Connect services, files, health), its code interpreter (served by
asyncsandbox's own, :mod:`._interpreter`) and, on the one port, the routing between them and
the server's own API. Needs the ``e2b`` extra (``asyncsandbox-remote[e2b]``)."""

from ._control import ControlPlane as ControlPlane
from ._router import E2bRouter as E2bRouter

__all__ = ("ControlPlane", "E2bRouter")
