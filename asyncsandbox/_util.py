"""Small helpers shared by the runtime modules."""

from __future__ import annotations

import sys
import typing
from collections.abc import Iterator, Mapping
from contextlib import contextmanager

import msgspec


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


def claim_public(module: str, namespace: Mapping[str, object]) -> None:
    """Make the objects a public module re-exports (its ``__all__``) report it as their module.

    ``asyncsandbox.Limits``, not ``asyncsandbox._config.Limits``: in reprs, tracebacks,
    ``help()`` and the API reference. An object whose module is public already (re-exported
    from another public module) keeps it.

    A class's string annotations (``from __future__ import annotations``) are resolved first,
    in the module that defined them, because msgspec and :func:`typing.get_type_hints` look
    names up in the module ``__module__`` names: after the rewrite they would look in the
    public module, which does not hold the defining module's imports.
    """
    for name in typing.cast("tuple[str, ...]", namespace["__all__"]):
        obj = namespace[name]
        home = getattr(obj, "__module__", None)
        if not isinstance(home, str) or not any(part.startswith("_") for part in home.split(".")):
            continue
        if isinstance(obj, type):
            _resolve_annotations(obj)
        obj.__module__ = module  # classes and functions


def _resolve_annotations(cls: type) -> None:
    own = vars(cls).get("__annotations__")
    if not own or not any(isinstance(value, str) for value in own.values()):
        return
    try:
        hints = typing.get_type_hints(cls, include_extras=True)
    except NameError:
        # Names imported under TYPE_CHECKING only: nothing at run time resolves them, here
        # or later. A msgspec Struct must resolve (msgspec needs its field types).
        if issubclass(cls, msgspec.Struct):
            raise
        return
    cls.__annotations__ = {name: hints[name] for name in own}
