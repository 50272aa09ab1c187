"""The SDK's ``Sandbox``: one :class:`asyncsandbox.sync.SyncSandbox`, every operation one
of its handles wrapped in the SDK's futures; and ``wait()`` over sandboxes and futures.
Its constructors (standalone, ``run``, ``list``...) are the session's side
(``_client.py``): a sandbox is given what it needs of its session (:class:`Owner`)."""

from __future__ import annotations

import builtins
import threading
import time
from collections.abc import Callable, Generator, Iterable, Mapping, Sequence
from types import TracebackType
from typing import Any, ClassVar, Self, TypeVar

from .. import sync
from .._errors import InvalidArgument
from .._eventloop import refusal
from .._models import SandboxInfo
from ._futures import (
    OperationRef,
    Process,
    StreamReader,
    add_done_callback,
    in_thread,
    off_loop,
    resolved,
)
from ._settings import Settings
from ._types import (
    SandboxStatus,
    SandboxTimeoutError,
    UnsupportedFeatureError,
    cloud_only,
    translate,
)

__all__ = ("Owner", "SandboxBase", "wait")

T = TypeVar("T")

# -- sandboxes ------------------------------------------------------------------------------

_CLOUD_PROPERTIES = {
    "runner_id": "runners",
    "runner_group_id": "runners",
    "service_urls": "exposed services",
    "endpoint_share_token": "service endpoints",
    "service_endpoints": "service endpoints",
    "service_addresses": "service endpoints",
    "exposed_ports": "exposed services",
    "containers": "multi-container sandboxes",
    "container_statuses": "multi-container sandboxes",
    "dns_egress_names": "network allow-lists",
    "effective_runtime_class": "runtime classes",
    "attached_volume_ids": "volumes",
    "effective_egress": "network allow-lists",
    "effective_ingress": "network allow-lists",
    "resource_gpu": "GPUs",
    "file_system_snapshot_id": "file-system snapshots",
    "control": "Compose sandboxes",
}

_STATES = {
    "new": SandboxStatus.UNSPECIFIED,
    "starting": SandboxStatus.CREATING,
    "running": SandboxStatus.RUNNING,
    "stopping": SandboxStatus.TERMINATING,
    "closed": SandboxStatus.TERMINATED,
}


class _Stats(dict[str, int]):
    """A dict with the guide's keys that also answers to other spellings of them."""

    aliases: ClassVar[Mapping[str, str]] = {}

    def __missing__(self, key: str) -> int:
        if key in self.aliases:
            return self[self.aliases[key]]
        raise KeyError(key)

    def get(self, key: str, default: Any = None) -> Any:
        try:
            return self[key]
        except KeyError:
            return default


class _ExecStats(_Stats):
    # The 1.22 SDK's names (the reference), beside the cwsandbox guide's.
    aliases: ClassVar[Mapping[str, str]] = {
        "exec_completed_ok": "completed_ok",
        "exec_completed_nonzero": "completed_nonzero",
        "exec_failures": "failures",
    }


class Owner:
    """What a sandbox needs of its session: the :class:`~asyncsandbox.sync.SyncSession` its
    sandboxes are made in, and the SDK's default wait (``request_timeout_seconds``)."""

    def __init__(self, session: sync.SyncSession, request_timeout: float) -> None:
        self.session = session
        self.request_timeout = request_timeout


class SandboxBase:
    """One sandbox (the SDK's class, less its constructors: see ``_client.Sandbox``): lazy
    until ``start()`` or its first operation. Dropped without ``stop()``, it is stopped
    when collected. Cloud-only properties raise :class:`CloudOnlyFeatureError`.

    :param owner: its session's.
    :param settings: its options, or for a sandbox found by a listing, ``info``: what the
        listing said of it (it can be inspected and stopped, not used).
    """

    _sync: sync.SyncSandbox | None
    _info: SandboxInfo | None

    def __init__(
        self, owner: Owner, settings: Settings | None, *, info: SandboxInfo | None = None
    ) -> None:
        self._owner = owner
        self._files_lock = threading.Lock()
        if info is not None:
            self._settings = Settings({}, owner.request_timeout, ())
            self._pending_files: builtins.list[tuple[str, bytes]] = []
            self._sync = None
            self._info = info
            self._start: OperationRef[None] | None = resolved(None)
            return
        assert settings is not None
        self._settings = settings
        self._pending_files = builtins.list(settings.mounted_files)
        self._start = None
        self._info = None
        try:
            self._sync = off_loop(lambda: owner.session.sandbox(**settings.overrides))
        except Exception as exc:
            raise translate(exc) from exc

    # -- identity and state ------------------------------------------------------------

    @property
    def sandbox_id(self) -> str | None:
        """The sandbox's id, once started (None before)."""
        if self._info is not None:
            return self._info.id
        assert self._sync is not None
        return self._sync.id

    @property
    def status(self) -> SandboxStatus:
        """The last known status (no I/O)."""
        if self._info is not None:
            return SandboxStatus.from_native(self._info.status)
        return _STATES[self._state()]

    def _state(self) -> str:
        if self._info is not None:
            return "closed" if self._info.status in ("stopped", "dead") else "running"
        assert self._sync is not None
        return self._sync.state

    def get_status(self) -> SandboxStatus:
        """The current status (local state: no call needed)."""
        return self.status

    @property
    def tags(self) -> tuple[str, ...]:
        """The sandbox's tags."""
        if self._info is not None:
            return self._info.tags
        assert self._sync is not None
        return self._sync.tags

    @property
    def created_at(self) -> float | None:
        """When it was created (Unix time; listed sandboxes) or started."""
        if self._info is not None:
            return self._info.created_at
        assert self._sync is not None
        return self._sync.started_at

    started_at = created_at

    @property
    def returncode(self) -> None:
        """The main process's exit status: there is no main process, always None."""
        return None

    @property
    def status_reason(self) -> str | None:
        """Why the sandbox is in its status (None locally)."""
        return None

    @property
    def exec_stats(self) -> dict[str, int]:
        """This sandbox's commands, with the cwsandbox guide's keys: ``exec_count``,
        ``completed_ok``, ``completed_nonzero``, ``failures`` (timeouts and errors). The
        1.22 SDK's ``exec_completed_ok``... are answered too."""
        stats = self._native_stats()
        return _ExecStats(
            exec_count=stats["exec_count"],
            completed_ok=stats["exec_completed_ok"],
            completed_nonzero=stats["exec_completed_nonzero"],
            failures=stats["exec_failures"],
        )

    @property
    def execution_stats(self) -> dict[str, int]:
        """This sandbox's commands, with the aviato guide's keys: ``total``, ``successes``
        (exit 0), ``failures`` (non-zero exit), ``errors`` (timeouts and errors)."""
        stats = self._native_stats()
        return _Stats(
            total=stats["exec_count"],
            successes=stats["exec_completed_ok"],
            failures=stats["exec_completed_nonzero"],
            errors=stats["exec_failures"],
        )

    def _native_stats(self) -> dict[str, int]:
        if self._sync is None:
            return dict.fromkeys(
                ("exec_count", "exec_completed_ok", "exec_completed_nonzero", "exec_failures"), 0
            )
        return self._sync.exec_stats

    def __getattr__(self, name: str) -> Any:
        if name in _CLOUD_PROPERTIES:
            raise cloud_only(f"Sandbox.{name}", _CLOUD_PROPERTIES[name])
        raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")

    # -- lifecycle ----------------------------------------------------------------------

    def _live(self) -> sync.SyncSandbox:
        if self._sync is None:
            raise UnsupportedFeatureError(
                f"sandbox {self.sandbox_id} was found by list()/from_id(): asyncsandbox.compat "
                "can stop it, not run commands in it (use a sandbox of your own session)"
            )
        if self._pending_files:
            self._write_mounted_files(self._sync)
        return self._sync

    def _write_mounted_files(self, sandbox: sync.SyncSandbox) -> None:
        with self._files_lock:
            files, self._pending_files = self._pending_files, []
            for path, content in files:
                OperationRef(sandbox.write_file(path, content, mode=0o444)).result()

    def _start_ref(self) -> OperationRef[None]:
        if self._start is None:
            assert self._sync is not None
            sandbox = self._sync
            self._start = OperationRef(off_loop(sandbox.start), lambda _: None, name="start")
        return self._start

    def start(self) -> OperationRef[None]:
        """Start the sandbox (idempotent); the ref resolves once it is running."""
        off_loop(self._live)
        return self._start_ref()

    def wait(self, timeout: float | None = None) -> Self:
        """Start the sandbox if needed and wait until it runs; return it. ``timeout``
        (default ``request_timeout_seconds``) raises :class:`SandboxTimeoutError`. Blocks."""
        limit = self._settings.exec_timeout if timeout is None else timeout
        try:
            self.start().result(limit)
        except TimeoutError as exc:
            if isinstance(exc, SandboxTimeoutError):
                raise
            raise SandboxTimeoutError(f"the sandbox did not start within {limit:g}s") from exc
        return self

    def wait_until_complete(
        self, timeout: float | None = None, **kwargs: Any
    ) -> OperationRef[Self]:
        """Not supported: it waits for the main process, which asyncsandbox sandboxes do not
        have."""
        raise UnsupportedFeatureError(
            "wait_until_complete() waits for a main process; asyncsandbox sandboxes have none "
            "(wait for a command with exec(...).result())"
        )

    def stop(
        self,
        *,
        snapshot_on_stop: bool = False,
        graceful_shutdown_seconds: float = 10.0,
        missing_ok: bool = False,
        wait_for_ready: bool = True,
        request_id: str | None = None,
    ) -> OperationRef[None]:
        """Remove the sandbox (its commands are killed at once: there is no main process to
        shut down gracefully). Returns at once; idempotent."""
        if snapshot_on_stop:
            raise cloud_only("snapshot_on_stop", "file-system snapshots")
        if self._sync is None:
            assert self._info is not None
            sandbox_id = self._info.id
            return OperationRef(
                in_thread(lambda: self._owner.session.delete(ids=[sandbox_id]), "stop"),
                lambda _: None,
                name="stop",
            )
        return OperationRef(off_loop(self._sync.stop), name="stop")

    def __enter__(self) -> Self:
        self.start().result()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc_val: BaseException | None,
        exc_tb: TracebackType | None,
    ) -> None:
        self.stop().result()

    async def __aenter__(self) -> Self:
        await self.start()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc_val: BaseException | None,
        exc_tb: TracebackType | None,
    ) -> None:
        await self.stop()

    def __await__(self) -> Generator[Any, None, Self]:
        async def started() -> Self:
            await self.start()
            return self

        return started().__await__()

    # -- commands and files ---------------------------------------------------------------

    def exec(
        self,
        command: Sequence[str],
        *,
        cwd: str | None = None,
        check: bool = False,
        timeout_seconds: float | None = None,
        stdin: bool = False,
        container: str | None = None,
    ) -> Process:
        """Run ``command`` (an argv list, no shell) and return its :class:`Process` at once.

        ``timeout_seconds``: the command's limit (default ``request_timeout_seconds``, as
        in the SDK); past it the command is killed and ``result()`` raises
        :class:`SandboxTimeoutError`. ``check=True``: a non-zero exit raises
        :class:`SandboxExecutionError`. ``stdin=True`` and ``container`` are not supported.
        """
        if stdin:
            raise UnsupportedFeatureError(
                "exec(stdin=True) (interactive stdin) is not supported by asyncsandbox.compat; "
                "asyncsandbox.sync's SyncSandbox.exec(argv, stdin=data) passes input at once"
            )
        if container:
            raise cloud_only("exec(container=...)", "multi-container sandboxes")
        if isinstance(command, str | bytes) or not command:
            raise ValueError(f"command must be a non-empty list of strings, got {command!r}")
        timeout = self._settings.exec_timeout if timeout_seconds is None else timeout_seconds
        argv = builtins.list(command)
        try:
            handle = off_loop(
                lambda: self._live().exec(argv, cwd=cwd, timeout=timeout, check=check)
            )
        except InvalidArgument as exc:
            raise translate(exc) from exc
        return Process(handle, argv, timeout)

    def read_file(
        self, filepath: str, *, timeout_seconds: float | None = None, container: str | None = None
    ) -> OperationRef[bytes]:
        """The content of ``filepath`` (:class:`SandboxFileError` if it cannot be read)."""
        if container:
            raise cloud_only("read_file(container=...)", "multi-container sandboxes")
        handle = off_loop(lambda: self._live().read_file(filepath))
        return self._file_ref(handle, "read_file", timeout_seconds)

    def write_file(
        self,
        filepath: str,
        contents: bytes,
        *,
        timeout_seconds: float | None = None,
        container: str | None = None,
    ) -> OperationRef[None]:
        """Create or replace ``filepath`` with ``contents`` (parent directories are
        created)."""
        if container:
            raise cloud_only("write_file(container=...)", "multi-container sandboxes")
        if not isinstance(contents, bytes | bytearray | memoryview):
            raise TypeError(f"contents must be bytes, got {type(contents).__name__}")
        data = bytes(contents)
        handle = off_loop(lambda: self._live().write_file(filepath, data))
        return self._file_ref(handle, "write_file", timeout_seconds)

    def read_file_streaming(
        self, filepath: str, *, timeout_seconds: float | None = None, container: str | None = None
    ) -> StreamReader[bytes]:
        """The content of ``filepath`` as a stream (one chunk: see :class:`StreamReader`)."""
        ref = self.read_file(filepath, timeout_seconds=timeout_seconds, container=container)
        return StreamReader(ref.result)

    def write_file_streaming(
        self,
        filepath: str,
        source: bytes | Iterable[bytes],
        *,
        timeout_seconds: float | None = None,
        container: str | None = None,
    ) -> OperationRef[None]:
        """Write ``filepath`` from bytes or an iterable of bytes (joined first)."""
        if isinstance(source, bytes | bytearray):
            data = bytes(source)
        elif isinstance(source, Iterable):
            chunks = builtins.list(source)
            if not all(isinstance(c, bytes | bytearray) for c in chunks):
                raise TypeError("write_file_streaming() needs bytes chunks")
            data = b"".join(chunks)
        else:
            raise TypeError(f"source must be bytes or an iterable of bytes, got {source!r}")
        return self.write_file(filepath, data, timeout_seconds=timeout_seconds, container=container)

    def _file_ref(
        self, handle: sync.Handle[T], name: str, timeout_seconds: float | None
    ) -> OperationRef[T]:
        timeout = self._settings.exec_timeout if timeout_seconds is None else timeout_seconds
        deadline = time.monotonic() + timeout
        return OperationRef(handle, name=name, deadline=deadline, timeout=timeout)

    def shell(self, command: Sequence[str] | None = None, **kwargs: Any) -> Any:
        """Not supported: an interactive TTY."""
        raise UnsupportedFeatureError(
            "shell() (an interactive terminal) is not supported by asyncsandbox.compat; "
            "run commands with exec()"
        )

    def stream_logs(self, **kwargs: Any) -> Any:
        """Not supported: the logs of a main process, which asyncsandbox sandboxes lack."""
        raise UnsupportedFeatureError(
            "stream_logs() streams a main process's logs; asyncsandbox sandboxes have no main "
            "process (read a command's output from its result)"
        )

    def snapshot(self, **kwargs: Any) -> Any:
        """Cloud-only: file-system snapshots."""
        raise cloud_only("Sandbox.snapshot()", "file-system snapshots")

    @classmethod
    def run_from_template(cls, template_id: str, /, *args: Any, **kwargs: Any) -> Self:
        """Cloud-only: sandbox templates."""
        raise cloud_only("Sandbox.run_from_template()", "sandbox templates")

    @classmethod
    def run_from_file(cls, contents: Any, /, **kwargs: Any) -> Self:
        """Cloud-only: sandboxes from Compose files."""
        raise cloud_only("Sandbox.run_from_file()", "Compose sandboxes")

    def __repr__(self) -> str:
        return f"<Sandbox {self.sandbox_id or '(not started)'} {self.status.value}>"


# -- waiting ---------------------------------------------------------------------------------


def wait(
    waitables: Iterable[SandboxBase | OperationRef[Any]],
    num_returns: int | None = None,
    timeout: float | None = None,
) -> tuple[builtins.list[Any], builtins.list[Any]]:
    """Wait until ``num_returns`` of ``waitables`` are done (all by default) or ``timeout``
    seconds passed; return ``(done, pending)``, ``done`` in order of completion (those
    already done first) and at most ``num_returns`` long. A sandbox is done once running.
    A failed waitable counts as done (its ``result()`` raises). Blocks. ::

        while pending:
            [process], pending = cwsandbox.wait(pending, num_returns=1)
    """
    if (message := refusal("cwsandbox.wait()")) is not None:
        raise sync.RunningEventLoopError(message)
    items = builtins.list(waitables)
    if num_returns is not None and (isinstance(num_returns, bool) or num_returns < 1):
        raise ValueError(f"num_returns must be >= 1, got {num_returns!r}")
    if not items:
        return [], []
    wanted = min(len(items), num_returns or len(items))
    finished: builtins.list[Any] = []
    changed = threading.Condition()

    def on_done(item: object) -> None:
        with changed:
            finished.append(item)
            changed.notify_all()

    for item in dict.fromkeys(items, None):
        if isinstance(item, SandboxBase):
            ref: OperationRef[Any] = item._start_ref()
        elif isinstance(item, OperationRef):
            ref = item
        else:
            raise TypeError(f"wait() takes Sandbox and OperationRef objects, got {item!r}")
        add_done_callback(ref, _calling(on_done, item))
    with changed:
        changed.wait_for(lambda: len(finished) >= wanted, timeout)
        done = finished[:wanted]
    chosen = {id(x) for x in done}
    return done, [x for x in items if id(x) not in chosen]


def _calling(func: Callable[[object], None], item: object) -> Callable[[object], None]:
    return lambda _: func(item)
