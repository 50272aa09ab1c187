"""How asyncsandbox logs: structlog, stable dotted event names, bound ids, sync methods only
(structlog's async methods need asyncio and fail under trio).

The library never configures structlog. But structlog's unconfigured default prints every
level to stdout, which would interleave routine events with the application's own output.
So until the application configures structlog, loggers obtained here drop routine (debug and
info) events and keep warnings and errors; once it is configured, its settings rule. The
check happens when a logger is obtained (a Session binds its logger when created).
"""

from __future__ import annotations

import logging
from typing import Any

import structlog


def get_logger(**context: Any) -> Any:
    """A structlog logger for asyncsandbox events, with ``context`` bound."""
    if structlog.is_configured():
        return structlog.get_logger("asyncsandbox", **context)
    return structlog.wrap_logger(
        None,
        wrapper_class=structlog.make_filtering_bound_logger(logging.WARNING),
        logger_factory_args=("asyncsandbox",),
        **context,
    )
