"""Small helpers shared by the runtime modules."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from contextlib import contextmanager


@contextmanager
def single_error() -> Iterator[None]:
    """Re-raise the lone exception of a group raised by one of *our own* task groups.

    Use it only around task groups whose tasks store their errors instead of raising, so
    that at most the body's exception can end up in the group: unwrapping is then exact.
    """
    try:
        yield
    except BaseExceptionGroup as group:
        if len(group.exceptions) == 1 and not isinstance(group.exceptions[0], BaseExceptionGroup):
            raise group.exceptions[0] from group.exceptions[0].__cause__
        raise


def current_async_library() -> str:
    """``"trio"`` inside a trio run, else ``"asyncio"``."""
    trio = sys.modules.get("trio")
    if trio is not None:
        try:
            trio.lowlevel.current_task()
        except RuntimeError:
            pass
        else:
            return "trio"
    return "asyncio"
