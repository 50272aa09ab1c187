"""Backend names → backend classes: a static map for the built-in names first, then the
``asyncsandbox.backends`` entry-point group for third parties. Entry points are read only
for names that are not built in, so a broken plugin can never break the built-in ones."""

from __future__ import annotations

import importlib
from collections.abc import Mapping
from typing import Any

from ._errors import BackendNotFound, InvalidArgument
from .abc import Backend

__all__ = ("available_backends", "create_backend", "resolve_backend")

# name -> (import target, what to install when it is missing)
_BUILTIN: dict[str, tuple[str, str]] = {
    "process": ("asyncsandbox._process:ProcessBackend", "asyncsandbox"),
    "fake": ("asyncsandbox.testing:FakeBackend", "asyncsandbox"),
    "docker": ("asyncsandbox_docker:DockerBackend", "asyncsandbox[docker]"),
    "remote": ("asyncsandbox_remote:RemoteBackend", "asyncsandbox[remote]"),
    "ray": ("asyncsandbox_ray:RayBackend", "asyncsandbox[ray]"),
    "e2b": ("asyncsandbox_e2b:E2bBackend", "asyncsandbox[e2b]"),
}

ENTRY_POINT_GROUP = "asyncsandbox.backends"


def _load(target: str, name: str, install: str) -> type[Backend]:
    module_name, _, attr = target.partition(":")
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        if exc.name is not None and module_name.startswith(exc.name):
            raise BackendNotFound(
                f"backend {name!r} is not installed; install it with: pip install '{install}'"
            ) from exc
        raise
    cls = getattr(module, attr)
    if not (isinstance(cls, type) and issubclass(cls, Backend)):
        raise BackendNotFound(f"{target} (backend {name!r}) is not an asyncsandbox.abc.Backend")
    return cls


def resolve_backend(name: str) -> type[Backend]:
    """The backend class registered under ``name``."""
    if not isinstance(name, str):
        raise InvalidArgument(f"backend name must be a str, got {name!r}")
    if name in _BUILTIN:
        target, install = _BUILTIN[name]
        return _load(target, name, install)
    from importlib.metadata import entry_points  # not at import: it costs ~20 ms

    for ep in entry_points(group=ENTRY_POINT_GROUP, name=name):
        cls = ep.load()
        if isinstance(cls, type) and issubclass(cls, Backend):
            return cls
        raise BackendNotFound(f"entry point {ep.value} (backend {name!r}) is not a Backend")
    known = ", ".join(sorted(available_backends()))
    raise BackendNotFound(
        f"unknown backend {name!r}; known: {known}. Third-party backends register "
        f"under the entry-point group {ENTRY_POINT_GROUP!r}."
    )


def create_backend(name: str, options: Mapping[str, Any] | None = None) -> Backend:
    """A new, not yet entered backend ``name`` (a built-in one or an installed plugin's)
    made with keyword ``options``, as ``Session(name, backend_options=options)`` makes it.

    Raises :class:`BackendNotFound` (naming what to install) or :class:`InvalidArgument`.
    """
    cls = resolve_backend(name)
    try:
        return cls(**(options or {}))
    except TypeError as exc:
        raise InvalidArgument(f"invalid options for backend {name!r}: {exc}") from exc


def available_backends() -> set[str]:
    """Names that resolve: the built-in ones and installed plugins (not checked for import)."""
    from importlib.metadata import entry_points

    return set(_BUILTIN) | {ep.name for ep in entry_points(group=ENTRY_POINT_GROUP)}
