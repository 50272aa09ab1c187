"""The cwsandbox SDK's API (``import cwsandbox``), over asyncsandbox: code written for the
CoreWeave sandbox SDK runs locally with only its imports changed::

    import asyncsandbox.compat.cwsandbox as cwsandbox
    from asyncsandbox.compat.cwsandbox import Sandbox, SandboxDefaults, Session

    session = Session(SandboxDefaults(container_image="python:3.11", tags=("rl",)))
    process = session.sandbox().exec(["python", "-c", "print(6 * 7)"], timeout_seconds=30)
    print(process.result().stdout)  # str, as in the SDK

What maps, and how:

* ``Session(defaults, report_to=None)``, ``session.sandbox(**kw)``, ``session.list()``,
  ``session.log_metrics(step=, reset=)`` with the SDK's W&B metric names
  (``cwsandbox/executions``, ``cwsandbox/avg_execs_per_sandbox``...), ``get_metrics()``,
  ``close()``, sync and async context managers.
* ``Sandbox``: ``start()``, ``wait()``, ``stop()``, ``exec(cmd, timeout_seconds=,
  check=, cwd=)`` returning a :class:`Process` future whose result has str ``stdout`` and
  ``stderr``, ``read_file``/``write_file`` (and their streaming forms), ``sandbox_id``,
  ``status``, ``tags``, ``exec_stats`` (the guide's keys) and ``execution_stats`` (the
  aviato guide's), ``Sandbox.run()``, ``Sandbox.list(tags=, status=)``, ``from_id``,
  ``delete``.
* ``wait(waitables, num_returns=, timeout=)``, ``results(refs)``, :class:`SandboxStatus`,
  the SDK's exceptions (``SandboxTimeoutError``, ``SandboxFileError``...), into which
  asyncsandbox's errors are translated (the original is ``__cause__``).
* Defaults follow the SDK: ``exec`` without ``timeout_seconds`` is limited to
  ``request_timeout_seconds`` (300 s), and so is a wait for a free sandbox slot.

Where sandboxes run: the ``process`` backend (or ``$ASYNCSANDBOX_BACKEND``, or
``Session(..., backend="docker")``). On the process backend ``container_image`` does not
apply: commands run on the host's system, read-only, in an isolated sandbox.

Differences that keep results safe: a sandbox dropped without ``stop()`` is stopped when
collected, and a session left open is closed at exit (the SDK leaks both until their
lifetime ends). Cloud-only features (placement, GPUs, volumes, snapshots, services,
secrets, templates, runners, authentication) raise :class:`CloudOnlyFeatureError`;
features this layer lacks (interactive stdin and TTYs, main processes and their logs,
``Session.function``) raise :class:`UnsupportedFeatureError`. Unknown keyword arguments
raise ``TypeError`` naming the closest known one.
"""

from .._util import claim_public
from ._client import (
    Sandbox,
    Session,
    disable_signal_handlers,
    format_bytes,
    format_cpu,
    get_runner,
    list_runners,
    set_auth_mode,
)
from ._futures import OperationRef, Process, StreamReader, results
from ._sandbox import wait
from ._types import (
    CloudOnlyFeatureError,
    CWSandboxAuthenticationError,
    CWSandboxError,
    CWSandboxValidationError,
    ProcessResult,
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
    UnsupportedFeatureError,
)

__all__ = (
    # sessions and sandboxes
    "Session",
    "Sandbox",
    "SandboxDefaults",
    "SandboxStatus",
    # futures and results
    "OperationRef",
    "Process",
    "ProcessResult",
    "StreamReader",
    "wait",
    "results",
    # module functions
    "disable_signal_handlers",
    "set_auth_mode",
    "list_runners",
    "get_runner",
    "format_bytes",
    "format_cpu",
    # errors
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

# Show public objects as `asyncsandbox.compat.cwsandbox.X` (see asyncsandbox._util.claim_public).
claim_public(__name__, globals())
