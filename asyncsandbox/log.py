"""Logging for asyncsandbox and its plugins: one helper, :func:`get_logger`.

Events are structlog events with stable dotted names (``sandbox.exec.finished``,
``docker.connected``) and key-value fields. The library never configures structlog: until
the application does (``structlog.configure(...)``), debug and info events are dropped
and warnings and errors go to stderr; from then on the application's configuration
decides. Importing asyncsandbox does not import structlog.

Backend plugins log through this module, so that they behave alike::

    from asyncsandbox.log import get_logger

    log = get_logger("asyncsandbox.mybackend")
    log.debug("mybackend.connected", host=host)
"""

from ._log import Logger, get_logger
from ._util import claim_public

__all__ = ("Logger", "get_logger")

# Show public objects as `asyncsandbox.log.X` (see asyncsandbox._util.claim_public).
claim_public(__name__, globals())
