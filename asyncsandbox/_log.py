"""How asyncsandbox logs: structlog, stable dotted event names, bound ids, sync methods only
(structlog's async methods need asyncio and fail under trio). Public as
:mod:`asyncsandbox.log`, for plugins; the core imports it from here.

The library never configures structlog, and follows two rules of a well-behaved library:

* Silent below warning until the application configures structlog. Unconfigured, structlog
  prints every event, debug included, on stdout, interleaved with the application's own
  output. So routine (debug, info) events are dropped until ``structlog.configure()`` was
  called; from then on the application's settings rule every event. Warnings and errors
  always come out: on stderr until the application configures structlog.
* Cheap to import. Importing structlog costs a third of a second (it imports its console
  renderer's dependencies, ``rich`` among them, when they are installed), so structlog is
  imported only when an event is emitted: an application that configured it has imported
  it already, and until then only warnings and errors need it.
"""

from __future__ import annotations

import sys
from typing import Any

__all__ = ("Logger", "get_logger")

_WARNING = 30  # logging.WARNING, without importing logging


def _structlog() -> Any:
    """structlog if the application imported and configured it, else None."""
    structlog = sys.modules.get("structlog")
    if structlog is None or not structlog.is_configured():
        return None
    return structlog


class Logger:
    """A structlog logger for asyncsandbox events; see :func:`get_logger`.

    Its methods take a stable dotted event name and key-value fields, as structlog's do.
    """

    __slots__ = ("_bound", "_context", "_name")

    def __init__(self, name: str, context: dict[str, Any], bound: Any = None) -> None:
        self._name = name
        self._context = context
        self._bound = bound  # a concrete structlog logger, once resolved by bind()

    def bind(self, **context: Any) -> Logger:
        """This logger with ``context`` added to every event.

        When structlog is configured at that moment, the result is resolved against the
        configuration then, as structlog's own ``bind`` does; otherwise it keeps checking.
        """
        merged = {**self._context, **context}
        if self._bound is not None:
            return Logger(self._name, merged, self._bound.bind(**context))
        structlog = _structlog()
        if structlog is None:
            return Logger(self._name, merged)
        return Logger(self._name, merged, structlog.get_logger(self._name).bind(**merged))

    def _configured(self) -> Any:
        if self._bound is not None:
            return self._bound
        structlog = _structlog()
        if structlog is None:
            return None
        # A lazy proxy: it follows structlog's caching rules (cache_logger_on_first_use).
        return structlog.get_logger(self._name, **self._context)

    def _always(self) -> Any:
        target = self._configured()
        if target is not None:
            return target
        import structlog

        return structlog.wrap_logger(
            structlog.PrintLogger(sys.stderr),
            wrapper_class=structlog.make_filtering_bound_logger(_WARNING),
            **self._context,
        )

    def debug(self, event: str, **fields: Any) -> None:
        """A routine detail (dropped until the application configures structlog)."""
        target = self._configured()
        if target is not None:
            target.debug(event, **fields)

    def info(self, event: str, **fields: Any) -> None:
        """A routine event (dropped until the application configures structlog)."""
        target = self._configured()
        if target is not None:
            target.info(event, **fields)

    def warning(self, event: str, **fields: Any) -> None:
        """Something went wrong and was handled (always emitted)."""
        self._always().warning(event, **fields)

    def error(self, event: str, **fields: Any) -> None:
        """Something went wrong and was not handled (always emitted)."""
        self._always().error(event, **fields)


def get_logger(name: str = "asyncsandbox", **context: Any) -> Logger:
    """The logger of an asyncsandbox component (``"asyncsandbox.docker"``, ...), with
    ``context`` bound to every event.

    Call it at module level or per object; it costs nothing until an event is emitted, and
    it never configures structlog (see the module docstring for what happens until the
    application does). Only sync methods exist: structlog's async ones fail under trio.
    """
    return Logger(name, context)
