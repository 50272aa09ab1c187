"""The exception tree of asyncsandbox.

Every error the runtime raises derives from :class:`SandboxError`. Errors are split by
*who is to blame*, so an RL trainer can score command outcomes and mask infrastructure
failures instead of turning them into reward 0::

    SandboxError
    ├── InvalidArgument (ValueError) ........ bad input to an asyncsandbox call
    ├── BackendNotFound (LookupError) ....... unknown backend name, or its plugin is not installed
    ├── SandboxClosed ....................... the sandbox or session was already closed
    ├── SandboxNotFound (LookupError) ....... no sandbox with that id (it was removed)
    ├── OperationCancelled .................. a submitted operation was cancelled before it ended
    ├── CommandError ........................ the command's own outcome (score it)
    │   ├── ExecTimeout (TimeoutError) ...... the command (or run_code) exceeded its ``timeout``
    │   └── ExecFailed ...................... ``check=True`` and the command exited non-zero
    ├── SandboxFileError .................... a file operation failed; see ``reason``
    └── InfrastructureError ................. not the command's fault (mask it); ``retryable``
        ├── CapacityTimeout (TimeoutError) .. waited longer than ``Limits.capacity_timeout``
        ├── BackendUnavailable .............. the backend (daemon, server) cannot be reached
        │   └── RequestNotSent .............. the call never reached it: retried, whatever it was
        ├── BackendTimeout (TimeoutError) ... an infrastructure call exceeded its ``Timeouts`` deadline
        ├── LaunchError ..................... the command could not be set up; it never ran
        └── SandboxDied ..................... the sandbox is gone (crashed, killed, expired, lost)
            └── SandboxOOMKilled ............ the sandbox as a whole was killed for memory

A command that is killed for using too much memory *inside* a sandbox that survives is a
command outcome, not an error: its :class:`~asyncsandbox.ExecResult` has ``oom_killed``
set. Only the death of the sandbox itself raises :class:`SandboxOOMKilled`.

Timeouts that are the command's own (:class:`ExecTimeout`) and timeouts of the
infrastructure (:class:`BackendTimeout`, :class:`CapacityTimeout`) are distinct types, and
all of them are also the builtin :class:`TimeoutError`.
"""

from __future__ import annotations

import enum
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from ._interpreter._models import Execution
    from ._models import ExecResult

__all__ = (
    "SandboxError",
    "InvalidArgument",
    "BackendNotFound",
    "SandboxClosed",
    "SandboxNotFound",
    "OperationCancelled",
    "CommandError",
    "ExecTimeout",
    "ExecFailed",
    "FileErrorReason",
    "SandboxFileError",
    "InfrastructureError",
    "CapacityTimeout",
    "BackendUnavailable",
    "RequestNotSent",
    "BackendTimeout",
    "LaunchError",
    "SandboxDied",
    "SandboxOOMKilled",
)


class SandboxError(Exception):
    """Base class of every error raised by asyncsandbox."""


class InvalidArgument(SandboxError, ValueError):
    """An argument to an asyncsandbox call is invalid; nothing was done."""


class BackendNotFound(SandboxError, LookupError):
    """No backend is registered under that name, or the distribution providing it is missing."""


class SandboxClosed(SandboxError):
    """The sandbox (or session) was closed; it cannot be used any more."""


class SandboxNotFound(SandboxError, LookupError):
    """The backend has no sandbox with this id (it was removed, or never existed)."""

    def __init__(self, sandbox_id: str, message: str | None = None) -> None:
        super().__init__(message or f"sandbox {sandbox_id!r} not found")
        self.sandbox_id = sandbox_id


class OperationCancelled(SandboxError):
    """The operation (from ``session.submit``) was cancelled before it finished."""

    def __init__(self, name: str) -> None:
        super().__init__(f"operation {name!r} was cancelled")
        self.name = name


class CommandError(SandboxError):
    """The command ran and its outcome is an error; the sandbox itself is fine.

    ``result`` holds what the command produced (for a timeout: the output up to the kill).
    For code run by :meth:`~asyncsandbox.Sandbox.run_code`, ``execution`` holds the partial
    :class:`~asyncsandbox.Execution` (and ``result`` the same call seen as a command: its
    output, exit status 130 if it stopped at the interrupt, 137 if it was killed).
    """

    def __init__(
        self, message: str, result: ExecResult, *, execution: Execution | None = None
    ) -> None:
        super().__init__(message)
        self.result = result
        self.execution = execution


class ExecTimeout(CommandError, TimeoutError):
    """The command ran past its ``timeout`` and its whole process tree was killed.

    ``result`` carries the partial output, with ``timed_out`` set. From
    :meth:`~asyncsandbox.Sandbox.run_code`: the code was interrupted as a notebook
    interrupts it, and ``execution`` carries what it did so far; its context keeps its
    state unless ``execution.restarted`` (it ignored the interrupt and was killed).
    """


class ExecFailed(CommandError):
    """``check=True`` was given and the command exited with a non-zero status."""


class FileErrorReason(enum.StrEnum):
    """Why a file operation failed."""

    NOT_FOUND = "not_found"
    IS_A_DIRECTORY = "is_a_directory"
    NOT_A_DIRECTORY = "not_a_directory"
    TOO_LARGE = "too_large"
    PERMISSION = "permission"
    INVALID_PATH = "invalid_path"
    OTHER = "other"


class SandboxFileError(SandboxError):
    """A file operation inside a sandbox failed; ``reason`` says why, ``path`` says where."""

    def __init__(self, reason: FileErrorReason, path: str, detail: str | None = None) -> None:
        message = f"{reason.value.replace('_', ' ')}: {path}"
        if detail:
            message = f"{message} ({detail})"
        super().__init__(message)
        self.reason = reason
        self.path = path
        self.detail = detail


class InfrastructureError(SandboxError):
    """The infrastructure failed, not the command. Mask these instead of scoring them.

    ``retryable`` is true when repeating the same call may succeed and the failed call
    left nothing behind; the runtime retries such errors for lifecycle calls (and
    :class:`RequestNotSent` for every call).
    """

    retryable: bool = False

    def __init__(self, message: str, *, retryable: bool | None = None) -> None:
        super().__init__(message)
        if retryable is not None:
            self.retryable = retryable


class CapacityTimeout(InfrastructureError, TimeoutError):
    """Waiting for a concurrency slot took longer than ``Limits.capacity_timeout``."""

    def __init__(self, limiter: str, waited: float) -> None:
        super().__init__(f"waited {waited:.1f}s for a {limiter!r} slot", retryable=True)
        self.limiter = limiter
        self.waited = waited


class BackendUnavailable(InfrastructureError):
    """The backend (a daemon, a server) cannot be reached or refuses service."""

    retryable = True


class RequestNotSent(BackendUnavailable):
    """The call never reached the backend (say, its connection could not be established):
    nothing of it was done, and nothing of its input (an archive's stream) was consumed.
    Always ``retryable``, whatever the call was: the runtime tries every call that fails
    with it again, a command or a snapshot included, following
    :class:`~asyncsandbox.RetryPolicy`. Backends raise it only when they know the request
    never left; a call that may have been received is never this error.
    """

    def __init__(self, message: str) -> None:
        super().__init__(message, retryable=True)


class BackendTimeout(InfrastructureError, TimeoutError):
    """An infrastructure call did not finish within its deadline from :class:`Timeouts`."""

    def __init__(self, operation: str, seconds: float) -> None:
        super().__init__(f"{operation} did not finish within {seconds:g}s", retryable=False)
        self.operation = operation
        self.seconds = seconds


class LaunchError(InfrastructureError):
    """The backend could not start the command: setting it up failed (a launcher, an agent
    or the sandbox's isolation), so the command never ran. Never the command's exit status.

    ``retryable`` when the cause is transient (the runtime then runs the command again,
    following :class:`~asyncsandbox.RetryPolicy`: it is safe, as nothing ran).
    """

    def __init__(self, message: str, *, retryable: bool = True) -> None:
        super().__init__(message, retryable=retryable)


class SandboxDied(InfrastructureError):
    """The sandbox is gone: it crashed, was removed from outside, expired or stopped answering."""

    def __init__(self, sandbox_id: str, reason: str) -> None:
        super().__init__(f"sandbox {sandbox_id!r} died: {reason}", retryable=False)
        self.sandbox_id = sandbox_id
        self.reason = reason


class SandboxOOMKilled(SandboxDied):
    """The sandbox as a whole was killed for exceeding its memory limit."""
