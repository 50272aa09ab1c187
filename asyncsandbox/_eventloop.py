"""Whether this thread runs an event loop, for the blocking facades (:mod:`asyncsandbox.sync`
and :mod:`asyncsandbox.compat`): a blocking call from such a thread would block its loop,
or deadlock, so they refuse it (or hop to a worker thread) instead."""

from __future__ import annotations

import asyncio
import sys

HINT = "use asyncsandbox.Session directly in async code"


def running_event_loop() -> str | None:
    """``"asyncio"`` or ``"trio"`` if this thread runs that library's event loop, else None."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        pass
    else:
        return "asyncio"
    trio = sys.modules.get("trio")  # never import trio just to find out it is not running
    if trio is not None:
        try:
            trio.lowlevel.current_trio_token()
        except RuntimeError:
            pass
        else:
            return "trio"
    return None


def refusal(what: str) -> str | None:
    """Why ``what`` (a blocking call, as the message names it) must not run in this thread
    (it runs an event loop), or None: it may. The blocking facades raise their
    ``RunningEventLoopError`` with it."""
    library = running_event_loop()
    if library is None:
        return None
    return f"{what} would block this thread, which runs an event loop ({library}); {HINT}"
