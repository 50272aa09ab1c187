"""What crosses between the driver-side backend and a node's actor: plain values only.

Errors travel as data (:func:`error_to_wire`, :func:`error_from_wire`), not as pickled
exceptions: our exceptions take constructor arguments that pickling does not replay, and a
Ray-wrapped exception would reach users as a Ray type. One table, both directions.
"""

from __future__ import annotations

from typing import Any

from asyncsandbox import (
    BackendUnavailable,
    FileErrorReason,
    InfrastructureError,
    InvalidArgument,
    LaunchError,
    SandboxDied,
    SandboxError,
    SandboxFileError,
    SandboxNotFound,
    SandboxOOMKilled,
)

WireError = tuple[str, dict[str, Any]]


def error_to_wire(exc: SandboxError) -> WireError:
    """A plain description of ``exc`` (an asyncsandbox error raised on a node)."""
    if isinstance(exc, SandboxFileError):
        return "file", {"reason": exc.reason.value, "path": exc.path, "detail": exc.detail}
    if isinstance(exc, SandboxOOMKilled):
        return "oom", {"id": exc.sandbox_id, "reason": exc.reason}
    if isinstance(exc, SandboxDied):
        return "died", {"id": exc.sandbox_id, "reason": exc.reason}
    if isinstance(exc, SandboxNotFound):
        return "not_found", {"id": exc.sandbox_id, "message": str(exc)}
    if isinstance(exc, LaunchError):
        return "launch", {"message": str(exc), "retryable": exc.retryable}
    if isinstance(exc, InvalidArgument):
        return "invalid", {"message": str(exc)}
    if isinstance(exc, BackendUnavailable):
        return "unavailable", {"message": str(exc), "retryable": exc.retryable}
    if isinstance(exc, InfrastructureError):
        return "infrastructure", {"message": str(exc), "retryable": exc.retryable}
    return "other", {"message": f"{type(exc).__name__}: {exc}"}


def error_from_wire(error: WireError, *, sandbox_id: str | None) -> SandboxError:
    """The asyncsandbox error a node reported; ids are the driver's (``sandbox_id``)."""
    kind, f = error
    sid = sandbox_id or str(f.get("id", "?"))
    if kind == "file":
        try:
            reason = FileErrorReason(f["reason"])
        except ValueError:
            reason = FileErrorReason.OTHER
        return SandboxFileError(reason, f["path"], f.get("detail"))
    if kind == "oom":
        return SandboxOOMKilled(sid, f["reason"])
    if kind == "died":
        return SandboxDied(sid, f["reason"])
    if kind == "not_found":
        return SandboxNotFound(sid)
    if kind == "launch":
        return LaunchError(f["message"], retryable=bool(f["retryable"]))
    if kind == "invalid":
        return InvalidArgument(f["message"])
    if kind == "unavailable":
        return BackendUnavailable(f["message"], retryable=bool(f["retryable"]))
    if kind == "infrastructure":
        return InfrastructureError(f["message"], retryable=bool(f["retryable"]))
    return InfrastructureError(f"the node failed: {f.get('message')}", retryable=False)
