"""The SDK under its earlier name, ``aviato`` (``import aviato``), as the aviato RL guides
use it::

    import asyncsandbox.compat.aviato as aviato
    from asyncsandbox.compat.aviato import Sandbox, SandboxDefaults, Session

Everything is :mod:`asyncsandbox.compat.cwsandbox` (the same classes and functions), except
:class:`Session`, whose ``log_metrics``/``get_metrics`` use the aviato guide's metric names:
``aviato/executions``, ``aviato/exec_successes`` (exit 0), ``aviato/exec_failures``
(non-zero exit), ``aviato/exec_errors`` (timeouts and errors), ``aviato/success_rate``,
``aviato/error_rate``, ``aviato/avg/min/max_execs_per_sandbox``... The per-sandbox
counts of that guide are ``sandbox.execution_stats`` (``total``, ``successes``,
``failures``, ``errors``), available in both spellings.
"""

from typing import ClassVar, final

from ._client import Session as _Session
from ._types import AVIATO, Dialect
from .cwsandbox import (
    CloudOnlyFeatureError,
    CWSandboxAuthenticationError,
    CWSandboxError,
    CWSandboxValidationError,
    OperationRef,
    Process,
    ProcessResult,
    Sandbox,
    SandboxCommandTimeoutError,
    SandboxDefaults,
    SandboxError,
    SandboxExecutionError,
    SandboxFailedError,
    SandboxFileError,
    SandboxNotFoundError,
    SandboxNotRunningError,
    SandboxRequestTimeoutError,
    SandboxResourceExhaustedError,
    SandboxStatus,
    SandboxTerminatedError,
    SandboxTimeoutError,
    SandboxUnavailableError,
    SandboxValidationError,
    StreamReader,
    UnsupportedFeatureError,
    disable_signal_handlers,
    format_bytes,
    format_cpu,
    get_runner,
    list_runners,
    results,
    set_auth_mode,
    wait,
)


@final
class Session(_Session):
    """:class:`asyncsandbox.compat.cwsandbox.Session` with the aviato guide's metric names
    (``aviato/exec_successes``...; see the module docstring)."""

    _dialect: ClassVar[Dialect] = AVIATO


# The same names as asyncsandbox.compat.cwsandbox (a test keeps them equal).
__all__ = (
    "Session",
    "Sandbox",
    "SandboxDefaults",
    "SandboxStatus",
    "OperationRef",
    "Process",
    "ProcessResult",
    "StreamReader",
    "wait",
    "results",
    "disable_signal_handlers",
    "set_auth_mode",
    "list_runners",
    "get_runner",
    "format_bytes",
    "format_cpu",
    "CWSandboxError",
    "CWSandboxAuthenticationError",
    "CWSandboxValidationError",
    "SandboxError",
    "SandboxValidationError",
    "SandboxNotRunningError",
    "SandboxUnavailableError",
    "SandboxTimeoutError",
    "SandboxRequestTimeoutError",
    "SandboxCommandTimeoutError",
    "SandboxTerminatedError",
    "SandboxFailedError",
    "SandboxNotFoundError",
    "SandboxExecutionError",
    "SandboxFileError",
    "SandboxResourceExhaustedError",
    "UnsupportedFeatureError",
    "CloudOnlyFeatureError",
)
