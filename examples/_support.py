"""What the examples share: picking a backend on the command line, logging, and a progress
bar. Not part of asyncsandbox; copy what you need."""

from __future__ import annotations

import argparse
import importlib
import json
import logging
import shutil
import sys
import time
from types import TracebackType
from typing import IO, Any, Self

import structlog
from structlog.typing import EventDict, WrappedLogger

import asyncsandbox


def add_backend_arguments(parser: argparse.ArgumentParser) -> None:
    """``--backend``, ``--backend-option KEY=VALUE`` (repeatable) and ``--image``."""
    parser.add_argument(
        "--backend",
        default="process",
        help="sandbox backend: process (default, embedded, no daemon) or docker",
    )
    parser.add_argument(
        "--backend-option",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="backend option (repeatable), e.g. root=/tmp/sandboxes or pull=never",
    )
    parser.add_argument(
        "--image",
        default=None,
        help="image of the sandboxes (docker: e.g. python:3.12-slim; process: a root "
        "filesystem directory; default: the backend's)",
    )
    parser.add_argument(
        "-v", "--verbose", action="count", default=0, help="log more (-vv: debug) on stderr"
    )


def backend_options(args: argparse.Namespace) -> dict[str, Any]:
    """The ``--backend-option`` pairs as keyword arguments (values parsed as JSON if they
    are: numbers, booleans)."""
    options: dict[str, Any] = {}
    for pair in args.backend_option:
        key, sep, value = pair.partition("=")
        if not sep or not key:
            raise SystemExit(f"--backend-option needs KEY=VALUE, got {pair!r}")
        try:
            options[key] = json.loads(value)
        except ValueError:
            options[key] = value
    return options


def new_session(args: argparse.Namespace) -> asyncsandbox.Session:
    """A :class:`~asyncsandbox.Session` on ``--backend``, its options and ``--image``."""
    defaults = asyncsandbox.SandboxDefaults(image=args.image) if args.image else None
    return asyncsandbox.Session(
        args.backend, backend_options=backend_options(args), defaults=defaults
    )


def configure_logging(verbose: int = 0) -> None:
    """Send asyncsandbox's structured logs to stderr as JSON lines: warnings and errors,
    and the ``session.metrics`` events of ``report_to=["log"]`` (``-v``: info, ``-vv``:
    debug). The library never configures structlog; an application (an example) may."""
    level = {0: logging.WARNING, 1: logging.INFO}.get(verbose, logging.DEBUG)

    def keep(logger: WrappedLogger, method: str, event: EventDict) -> EventDict:
        if (
            event.get("event") != "session.metrics"
            and _LEVELS.get(method, logging.CRITICAL) < level
        ):
            raise structlog.DropEvent
        return event

    structlog.configure(
        processors=[
            keep,
            structlog.processors.add_log_level,
            structlog.processors.TimeStamper(fmt="iso"),
            structlog.processors.JSONRenderer(),
        ],
        wrapper_class=structlog.make_filtering_bound_logger(min(level, logging.INFO)),
        logger_factory=structlog.PrintLoggerFactory(sys.stderr),
        cache_logger_on_first_use=False,
    )


_LEVELS = {"debug": logging.DEBUG, "info": logging.INFO, "msg": logging.INFO}
"""structlog method names below WARNING (the others are kept)."""


class Progress:
    """A progress bar on stderr, shown only when stderr is a terminal (never in captured
    output): tqdm's when tqdm is installed, else a minimal one. ``write()`` prints a line to
    stdout without breaking the bar.

    ::

        with Progress(total=10, desc="step 1") as bar:
            ...
            bar.write("one done")
            bar.update()
    """

    def __init__(self, total: int, desc: str, *, stream: IO[str] | None = None) -> None:
        self.total = total
        self.desc = desc
        self.count = 0
        self._stream = sys.stderr if stream is None else stream
        self._enabled = self._stream.isatty()
        self._started = time.monotonic()
        self._tqdm: Any = None
        if self._enabled:
            try:
                tqdm = importlib.import_module("tqdm")
            except ImportError:
                self._draw()
            else:
                self._tqdm = tqdm.tqdm(
                    total=total, desc=desc, file=self._stream, dynamic_ncols=True
                )

    @property
    def enabled(self) -> bool:
        """Whether a bar is shown at all."""
        return self._enabled

    def update(self, n: int = 1) -> None:
        self.count += n
        if self._tqdm is not None:
            self._tqdm.update(n)
        elif self._enabled:
            self._draw()

    def write(self, line: str) -> None:
        """Print ``line`` to stdout, above the bar."""
        if self._tqdm is not None:
            self._tqdm.write(line, file=sys.stdout)
            return
        if self._enabled:
            self._stream.write("\r\x1b[K")
            self._stream.flush()
        print(line, flush=self._enabled)
        if self._enabled:
            self._draw()

    def close(self) -> None:
        if self._tqdm is not None:
            self._tqdm.close()
            self._tqdm = None
        elif self._enabled:
            self._draw()
            self._stream.write("\n")
            self._stream.flush()
        self._enabled = False

    def _draw(self) -> None:
        width = max(10, min(40, shutil.get_terminal_size().columns - len(self.desc) - 30))
        done = self.count / self.total if self.total else 1.0
        filled = int(width * done)
        elapsed = time.monotonic() - self._started
        self._stream.write(
            f"\r{self.desc}: {done:4.0%}|{'█' * filled}{' ' * (width - filled)}| "
            f"{self.count}/{self.total} [{elapsed:.0f}s]"
        )
        self._stream.flush()

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc_val: BaseException | None,
        exc_tb: TracebackType | None,
    ) -> None:
        self.close()
