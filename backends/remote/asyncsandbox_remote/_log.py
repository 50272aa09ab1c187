"""How the remote backend logs: like asyncsandbox itself (structlog, stable dotted event
names, sync methods only), and quiet until the application configures structlog: until
then only warnings and errors are emitted (structlog's default would print every debug
event to stdout)."""

from __future__ import annotations

import logging
from typing import Any

import structlog


class _Logger:
    """Resolves the logger on each call, so configuring structlog later takes effect."""

    def __init__(self, name: str) -> None:
        self._name = name

    def _logger(self) -> Any:
        if structlog.is_configured():
            return structlog.get_logger(self._name)
        return structlog.wrap_logger(
            None,
            wrapper_class=structlog.make_filtering_bound_logger(logging.WARNING),
            logger_factory_args=(self._name,),
        )

    def debug(self, event: str, **fields: Any) -> None:
        self._logger().debug(event, **fields)

    def info(self, event: str, **fields: Any) -> None:
        self._logger().info(event, **fields)

    def warning(self, event: str, **fields: Any) -> None:
        self._logger().warning(event, **fields)

    def error(self, event: str, **fields: Any) -> None:
        self._logger().error(event, **fields)


def get_logger(name: str = "asyncsandbox.remote") -> _Logger:
    """The logger of the remote backend and server."""
    return _Logger(name)
