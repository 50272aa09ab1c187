"""The backend contract: what a sandbox backend implements.

A backend is two classes. :class:`Backend` creates, finds and lists sandboxes;
:class:`SandboxHandle` runs commands and moves files in one of them. Both are thin: the
runtime (:class:`asyncsandbox.Session`) applies all policy once for every backend —
concurrency limits, infrastructure deadlines, retries, the exec ``timeout``, output
bounds, argument checks, logging, metrics. A backend only has to do what it is asked,
promptly, and keep the few promises written on each method below. The public
conformance suite, :func:`asyncsandbox.testing.check_backend`, checks them all.

Promises that hold for every method:

* Raise only :mod:`asyncsandbox` errors. Translate your library's exceptions at the
  boundary (``raise BackendUnavailable(...) from exc``); mark an
  :class:`~asyncsandbox.InfrastructureError` ``retryable`` only when the call left nothing
  behind and repeating it may succeed. A call whose request never reached the backend
  (its connection could not be established) raises :class:`~asyncsandbox.RequestNotSent`:
  the runtime retries any call on it, a command included, so raise it only when nothing
  was sent nor consumed; a :meth:`Backend.__aenter__` that raises it must leave the
  backend as it was, to be entered again. Retry nothing yourself: the runtime's
  :class:`~asyncsandbox.RetryPolicy` is the one place for it.
* Never block the event loop, and work on every async library you declare in
  :attr:`BackendCapabilities.async_libraries` (use anyio).
* Cancellation: when a call is cancelled, undo what it started before letting the
  cancellation propagate — a cancelled ``create`` leaves no sandbox, a cancelled ``exec``
  leaves no process — in a shielded scope with a bounded deadline. Never swallow it.
* A sandbox that is gone (its node or machine died, it was removed or killed from
  outside, its lifetime ended) raises :class:`~asyncsandbox.SandboxDied` from every
  method of its handle — a command running when it went, and every later command and
  file operation — except :meth:`SandboxHandle.inspect` (``SandboxNotFound``) and
  :meth:`SandboxHandle.remove` (succeeds). See :meth:`SandboxHandle.exec` for what is
  *not* a dead sandbox.

Backends that can run ``sh`` scripts inside their sandboxes get the four file operations
from the :class:`ShellFiles` mixin by implementing one method,
:meth:`SandboxHandle.interact`, which also gives their sandboxes the code interpreter
(``Sandbox.run_code``). A backend whose sandboxes run elsewhere (a server, a cluster) runs
code where they are instead, by making its handles :class:`CodeInterpreter` objects.

Third-party backends register under the entry-point group ``asyncsandbox.backends``
(``name = "package.module:BackendClass"``); ``Session(backend="name", backend_options={...})``
then calls ``BackendClass(**backend_options)``.
"""

from __future__ import annotations

import builtins
from abc import ABCMeta, abstractmethod
from collections.abc import AsyncIterable, AsyncIterator, Awaitable, Callable, Mapping
from contextlib import AbstractAsyncContextManager
from types import TracebackType
from typing import ClassVar, Protocol, Self, runtime_checkable

import msgspec
from anyio import TypedAttributeProvider

from ._config import Resources, Timeouts
from ._connection import ServiceConnection
from ._interpreter._engine import Interpreter as SandboxInterpreter
from ._interpreter._models import CodeContext, CodeEventCallback, CodeRequest, Execution
from ._models import SandboxInfo, SnapshotInfo, Stream
from ._shellfiles import InteractiveProcess, ShellFiles
from ._util import claim_public

__all__ = (
    "Backend",
    "BackendCapabilities",
    "CodeEventCallback",
    "CodeInterpreter",
    "CodeRequest",
    "ExitStatus",
    "InteractiveProcess",
    "OutputCallback",
    "SandboxHandle",
    "SandboxInterpreter",
    "SandboxSpec",
    "ServiceConnection",
    "ShellFiles",
)

OutputCallback = Callable[[Stream, bytes], Awaitable[None]]
"""Receives output as it arrives: ``await on_output("stdout", data)``. It may apply
backpressure (awaiting it may take a while); call it from one task at a time."""


class BackendCapabilities(msgspec.Struct, frozen=True, kw_only=True):
    """What a backend can do; the runtime checks requests against it."""

    async_libraries: frozenset[str] = frozenset({"asyncio", "trio"})
    """Async libraries the backend works on (as named by ``sniffio``)."""
    isolation: str
    """How sandboxes are isolated, in a few words (shown by ``asyncsandbox backends``)."""
    enforced_limits: frozenset[str] = frozenset()
    """Which :class:`~asyncsandbox.Resources` fields are enforced: ``cpus``, ``memory_mb``,
    ``pids``, ``disk_mb``. The runtime refuses to create a sandbox that asks for one that
    is not (a limit asked for and not enforced is a lie), unless ``best_effort_limits``."""
    best_effort_limits: bool = False
    """The user chose to run sandboxes whose limits cannot all be enforced here (a weaker
    mode, named explicitly, such as the process backend's ``limits="best-effort"``): the
    runtime then creates them, warning once, instead of refusing."""
    limits_note: str = ""
    """Why the limits missing from ``enforced_limits`` cannot be had here, and how to get
    them (or to choose best-effort limits): the refusal says it."""
    network_modes: frozenset[str] = frozenset({"none"})
    """Supported values of ``SandboxDefaults.network``."""
    reports_signal: bool = False
    """``ExitStatus.signal`` tells a signal death apart from ``exit(128 + N)``."""
    snapshots: bool = False
    """:meth:`SandboxHandle.snapshot` works, and :meth:`Backend.create` starts a sandbox
    from a snapshot (``SandboxSpec.snapshot``)."""
    reset: bool = False
    """:meth:`SandboxHandle.reset` works: a sandbox can be handed to another episode."""
    interactive: bool = False
    """:meth:`SandboxHandle.interact` works (and with it the code interpreter), unless the
    handles are :class:`CodeInterpreter` objects, which run code themselves."""


class SandboxSpec(msgspec.Struct, frozen=True, kw_only=True):
    """Everything a backend needs to create a sandbox (validated by the runtime)."""

    image: str | None
    env: dict[str, str]
    """Environment for every command; the backend adds its own PATH/HOME/LANG underneath."""
    workdir: str
    """Absolute path; must exist (writable) once ``create`` returns."""
    resources: Resources
    network: str
    labels: dict[str, str]
    """Store verbatim and return in :class:`~asyncsandbox.SandboxInfo`; ``list`` filters on them."""
    max_lifetime: float | None
    """Seconds; past this the backend removes the sandbox, even if the owner process died."""
    snapshot: str | None = None
    """Start from this snapshot (an id :meth:`SandboxHandle.snapshot` returned) instead of
    an empty workdir, home and ``/tmp``; ``image`` is then the snapshot's."""


class ExitStatus(msgspec.Struct, frozen=True, kw_only=True):
    """How a command ended."""

    returncode: int
    """0-255 (128+N after signal N), as a shell reports it."""
    signal: int | None = None
    oom_killed: bool = False
    cpu_time: float | None = None
    """CPU seconds of the command's main process and the children it waited for (its
    ``wait4`` usage), where the backend can tell; else None."""


class SandboxHandle(TypedAttributeProvider, metaclass=ABCMeta):
    """One live sandbox of a backend.

    Paths given to its methods are absolute and normalised by the runtime. The runtime
    never calls a handle after :meth:`remove` returned, except :meth:`remove` again.
    Backend-specific information is offered as typed attributes
    (``handle.extra(MyAttributes.container_id)``), never by adding methods.
    """

    @property
    @abstractmethod
    def id(self) -> str:
        """The backend's id of this sandbox; ``Backend.attach(id)`` finds it again."""

    @abstractmethod
    async def exec(
        self,
        argv: tuple[str, ...],
        *,
        cwd: str,
        env: Mapping[str, str],
        stdin: bytes | None,
        on_output: OutputCallback,
        timeout: float | None = None,
    ) -> ExitStatus:
        """Run ``argv`` in the sandbox and return when its main process has exited.

        * ``timeout`` is advisory: the command's own limit in seconds (``None``: none). The
          runtime enforces it by cancelling this call; a backend may also enforce it where
          the command runs (a remote server does, so a timed-out command costs no round
          trip to kill it). Either way the command is killed.

        * Output goes to ``on_output`` as it arrives, unbuffered and unbounded (the runtime
          bounds it). Return only after all output read so far was delivered.
        * ``stdin`` is written to the command and then closed; ``None`` means an empty
          stdin (``/dev/null``), never the backend's own.
        * The command owns every process it starts: when its main process exits, processes
          it left behind (background jobs, ``setsid`` and double-forked daemons) are killed.
          The call must not wait for them, nor for pipes they hold open.
        * A command that cannot start (no such program, bad ``cwd``) is an exit status as a
          shell gives it (126/127), not an exception.
        * Which infrastructure failure is which (a trainer retries in the sandbox after
          one, and gives the sandbox up after the other):

          - :class:`~asyncsandbox.SandboxDied`: the sandbox is gone (see the module's
            promises); this command and every later call of the sandbox fail.
          - A recovered means of running commands is not a dead sandbox. When what runs
            commands in a sandbox that is still there fails (an executor, an agent or a
            launcher died, and the next command gets a new one), raise
            :class:`~asyncsandbox.LaunchError` (``retryable``: the command never ran, and
            the runtime runs it again) or, if it was cut short while it ran, an
            :class:`~asyncsandbox.InfrastructureError` (not ``retryable``: it may have
            done part of its work; running it again in the same sandbox is the caller's
            choice), and let the next call succeed.
          - Before raising the latter, look whether the sandbox itself is still there:
            what took the executor with it (the sandbox removed from outside, its node's
            daemon killed) may have taken the sandbox.

        Cancellation: kill the whole process tree (``SIGKILL``; children that ignore
        ``SIGTERM`` and ``setsid`` daemons included) and wait until it is gone, shielded and
        within a few seconds, then re-raise. The runtime implements ``timeout`` this way.
        """

    @abstractmethod
    async def read_file(self, path: str, *, max_bytes: int) -> bytes:
        """Return the content of the regular file ``path``.

        Raise :class:`~asyncsandbox.SandboxFileError` with reason ``not_found``,
        ``is_a_directory``, ``permission`` or, if it holds more than ``max_bytes``,
        ``too_large`` (without reading it all).
        """

    @abstractmethod
    async def write_file(self, path: str, data: bytes, *, mode: int) -> None:
        """Create or replace the regular file ``path`` with ``data`` and permission ``mode``.

        Missing parent directories are created. Raise
        :class:`~asyncsandbox.SandboxFileError` with reason ``is_a_directory``,
        ``not_a_directory`` (a parent is a file) or ``permission``.
        """

    @abstractmethod
    async def put_archive(self, path: str, archive: AsyncIterable[bytes]) -> None:
        """Extract an uncompressed tar stream into the directory ``path`` (created if missing).

        Consume ``archive`` incrementally; never hold it whole in memory. Members carry
        their permission bits; ownership is the sandbox user's.
        """

    @abstractmethod
    def get_archive(self, path: str) -> AbstractAsyncContextManager[AsyncIterator[bytes]]:
        """Stream ``path`` (file or directory, recursively) as an uncompressed tar.

        The single top-level member is named ``basename(path)``; symlinks are stored as
        symlinks, never followed. Raise :class:`~asyncsandbox.SandboxFileError`
        (``not_found``, ``permission``) on entering the context.
        """

    @abstractmethod
    async def inspect(self) -> SandboxInfo:
        """Describe the sandbox now. Raise :class:`~asyncsandbox.SandboxNotFound` if it is gone."""

    @abstractmethod
    async def remove(self) -> None:
        """Kill everything in the sandbox and release all its resources.

        Idempotent: removing a sandbox that is already gone succeeds.
        Cancellation: the runtime shields this call and bounds it with ``Timeouts.remove``.
        """

    def interact(
        self,
        argv: tuple[str, ...],
        *,
        cwd: str,
        env: Mapping[str, str],
        stdin: bool = True,
    ) -> AbstractAsyncContextManager[InteractiveProcess]:
        """Start ``argv`` in the sandbox, as a command of the sandbox (its user, its
        isolation, its limits), and keep it running for as long as the block lasts: its
        stdin is written as the caller goes (``stdin=False``: an empty stdin), its stdout
        read as it comes. Only with ``capabilities.interactive``.

        * ``env`` and ``cwd`` are as for :meth:`exec` (the runtime merged the sandbox's
          environment in). A program that cannot start ends at once with a shell's status
          (126/127) in :meth:`InteractiveProcess.wait`, not an exception.
        * The process may stay silent for as long as it likes (the code interpreter's runner
          waits for its next request): never treat silence as a failure.
        * Processes it starts are its own: when its main process exits, or when the block
          exits before that (an error, a cancellation), kill its whole process tree
          (shielded, bounded by ``timeouts.cleanup``) before leaving.
        * Raise :class:`~asyncsandbox.SandboxDied` if the sandbox is gone, and
          :class:`~asyncsandbox.LaunchError` if the process could not be set up.

        Cancellation: as for :meth:`exec`, the whole tree is killed before leaving.
        """
        raise NotImplementedError

    async def snapshot(self, *, labels: Mapping[str, str] | None = None) -> str:
        """Freeze the sandbox's filesystem state (workdir, home, ``/tmp``, what was
        installed) as a snapshot, and return its id; the sandbox goes on running.
        Processes are not part of a snapshot. Only with ``capabilities.snapshots``.

        ``labels``: store them with the snapshot, for :meth:`Backend.list_snapshots`
        (the runtime gives a snapshot that goes with its session its owner's labels, so
        that one a crashed owner left is found and deleted).

        Cancellation: nothing is left of a snapshot that was not returned.
        """
        raise NotImplementedError

    async def reset(self) -> None:
        """Return the sandbox to the state it was created in, for another episode: every
        process killed, every writable place (files, ``/tmp``, ``/dev/shm``, the home's
        dotfiles, IPC objects) as it was at creation. Raise (any error) if that cannot be
        guaranteed: the runtime then removes the sandbox. Only with ``capabilities.reset``.

        Cancellation: the runtime removes a sandbox whose reset was cancelled.
        """
        raise NotImplementedError


@runtime_checkable
class CodeInterpreter(Protocol):
    """Runs code where a sandbox is: a :class:`SandboxHandle` whose sandbox runs elsewhere
    (on a server, on a cluster's node) implements these to forward a whole ``run_code`` (or
    context) call there, where the local ``Sandbox.run_code`` runs it. The runtime checks
    for it on the handle (as it checks a backend for ``JudgingBackend``) and otherwise runs
    code itself over :meth:`SandboxHandle.interact`; either way it applies the same policy
    (the exec budget, metrics, logs, error translation, the timeout's
    :class:`~asyncsandbox.ExecTimeout`).

    Contexts are processes of the sandbox: they die with it and never survive its reset.
    """

    async def run_code(self, request: CodeRequest, *, on_event: CodeEventCallback) -> Execution:
        """Run ``request.code`` in the context ``request.context`` (the default one is made
        on first use; another unknown id raises :class:`~asyncsandbox.InvalidArgument`),
        deliver its events to ``on_event`` as they come, and return the whole
        :class:`~asyncsandbox.Execution`, bounded by ``request.max_output_bytes``.

        Past ``request.timeout`` the code is interrupted (then killed and its context
        restarted if it does not stop), and the execution returned has ``timed_out`` set:
        the runtime raises the timeout, not the handle. An exception in the code, and an
        interpreter that died, are data in the execution.

        Cancellation: the code is interrupted (killed if it does not stop) before the
        cancellation propagates; the context keeps its state if it stopped.
        """
        ...

    async def create_code_context(self, *, cwd: str, language: str) -> CodeContext:
        """A new context starting in ``cwd`` (absolute). Raise
        :class:`~asyncsandbox.InvalidArgument` if it cannot start there.

        Cancellation: nothing is left of a context that was not returned.
        """
        ...

    async def list_code_contexts(self) -> list[CodeContext]:
        """The contexts of the sandbox, the default one included once it was made."""
        ...

    async def restart_code_context(self, context_id: str) -> None:
        """Give the context a fresh interpreter (same id and working directory); a call
        running in it ends, restarted. Raise :class:`~asyncsandbox.InvalidArgument` for an
        unknown id.

        Cancellation: the restart completes or the context is left as it was.
        """
        ...

    async def remove_code_context(self, context_id: str) -> None:
        """Kill the context's interpreter and everything it started; forget it. Raise
        :class:`~asyncsandbox.InvalidArgument` for an unknown id.

        Cancellation: runs to its end (it only kills).
        """
        ...


class Backend(metaclass=ABCMeta):
    """Creates and finds sandboxes. Used as an async context manager by the Session.

    ``__aenter__`` may start background work (a connection pool, a lease keeper) in a task
    group of its own; ``aclose`` stops it (:class:`ServiceConnection` does both for a
    backend that talks to a service). Sandboxes outlive the backend object: closing
    the backend does not remove them (the Session does that first).
    """

    name: ClassVar[str]
    """Registry name, such as ``"docker"``."""
    timeouts: Timeouts = Timeouts()
    """The deadlines of the Session using this backend (set before it is entered): a
    backend bounds its own waits with them, e.g. killing a process tree within
    ``timeouts.cleanup``, instead of constants of its own."""

    def use_timeouts(self, timeouts: Timeouts) -> None:
        """Called by the runtime before entering the backend; sets :attr:`timeouts`."""
        self.timeouts = timeouts

    @property
    @abstractmethod
    def capabilities(self) -> BackendCapabilities:
        """What this backend supports."""

    @abstractmethod
    async def create(self, spec: SandboxSpec) -> SandboxHandle:
        """Create and start a sandbox; return once it accepts ``exec``.

        Cancellation: remove whatever was created so far, then re-raise.
        """

    @abstractmethod
    async def attach(self, sandbox_id: str) -> SandboxHandle:
        """A handle to an existing sandbox. Raise :class:`~asyncsandbox.SandboxNotFound`."""

    @abstractmethod
    async def list(self, *, labels: Mapping[str, str]) -> builtins.list[SandboxInfo]:
        """Every sandbox of this backend (any owner) carrying all of ``labels``
        (``""`` matches a label with an empty value)."""

    async def list_snapshots(self) -> builtins.list[SnapshotInfo]:
        """Every snapshot this backend holds, with the labels it was taken with (any
        owner). Only with ``capabilities.snapshots``; the default lists none."""
        return []

    async def delete_snapshot(self, snapshot_id: str) -> None:  # noqa: B027 - optional
        """Forget a snapshot (sandboxes started from it keep working). Idempotent.
        Only with ``capabilities.snapshots``.

        Cancellation: the runtime shields this call.
        """

    async def aclose(self) -> None:  # noqa: B027 - an optional hook, a no-op by default
        """Release the backend's own resources (connections, tasks). Idempotent."""

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc_val: BaseException | None,
        exc_tb: TracebackType | None,
    ) -> None:
        await self.aclose()


# Show public objects as `asyncsandbox.abc.X` (see asyncsandbox._util.claim_public).
claim_public(__name__, globals())
