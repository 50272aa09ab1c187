"""The seed SDK's ``Session``, ``Sandbox``, futures and helpers, over :mod:`asyncsandbox.sync`.

Every sandbox is an :class:`asyncsandbox.sync.SyncSandbox` of a
:class:`~asyncsandbox.sync.SyncSession`; every operation is one of its handles, wrapped in
the SDK's future types. This module adds no runtime: it renames, converts results, and
translates errors (:func:`._types.translate`) at its boundary.
"""

from __future__ import annotations

import builtins
import concurrent.futures
import dataclasses
import os
import threading
import time
import weakref
from collections.abc import (
    AsyncIterator,
    Callable,
    Generator,
    Iterable,
    Iterator,
    Mapping,
    Sequence,
)
from types import TracebackType
from typing import Any, ClassVar, Generic, Protocol, Self, TypeVar, final

import anyio
import anyio.to_thread

from .. import _metrics, sync
from .._config import Limits, SandboxDefaults as NativeDefaults, Timeouts
from .._errors import InvalidArgument
from .._log import get_logger
from .._models import SandboxInfo
from ..abc import Backend
from ._types import (
    ACTIVE,
    CLOUD_OPTIONS,
    CWSANDBOX,
    KEEP_ALIVE_ARGS,
    CWSandboxValidationError,
    Dialect,
    ProcessResult,
    SandboxDefaults,
    SandboxError,
    SandboxNotFoundError,
    SandboxStatus,
    SandboxTimeoutError,
    UnsupportedFeatureError,
    cloud_only,
    native_network,
    native_resources,
    normalize_tags,
    process_result,
    translate,
    unknown_argument,
)

T = TypeVar("T")
T_co = TypeVar("T_co", covariant=True)
S = TypeVar("S", str, bytes)

_log = get_logger()
_images_noted: set[str] = set()

# -- futures --------------------------------------------------------------------------------


class _Source(Protocol[T_co]):
    """What an OperationRef waits on: a sync Handle, a thread's future, or a value."""

    def done(self) -> bool: ...
    def result(self, timeout: float | None = None) -> T_co: ...
    def cancel(self) -> bool: ...
    def add_done_callback(self, callback: Callable[[Any], object]) -> None: ...


class _FutureSource(Generic[T]):
    def __init__(self, future: concurrent.futures.Future[T]) -> None:
        self._future = future

    def done(self) -> bool:
        return self._future.done()

    def result(self, timeout: float | None = None) -> T:
        return self._future.result(timeout)

    def cancel(self) -> bool:
        return self._future.cancel()

    def add_done_callback(self, callback: Callable[[Any], object]) -> None:
        self._future.add_done_callback(lambda _: callback(self))


class _Done(Generic[T]):
    def __init__(self, value: T | None = None, error: BaseException | None = None) -> None:
        self._value = value
        self._error = error

    def done(self) -> bool:
        return True

    def result(self, timeout: float | None = None) -> T:
        if self._error is not None:
            raise self._error
        return self._value  # type: ignore[return-value]

    def cancel(self) -> bool:
        return False

    def add_done_callback(self, callback: Callable[[Any], object]) -> None:
        callback(self)


_hops = concurrent.futures.ThreadPoolExecutor(4, thread_name_prefix="asyncsandbox.compat")


def _off_loop(func: Callable[[], T]) -> T:
    """``func()``, here, or in a worker thread when this thread runs an event loop: the
    blocking facade refuses calls from event loop threads, the SDK's API allows them (its
    calls return futures at once). The hop is as short as a hand-over to the sandbox
    event loop; like the SDK's own calls, it blocks the caller's loop for that long."""
    if sync._running_event_loop() is None:
        return func()
    return _hops.submit(func).result()


def _in_thread(func: Callable[[], T], name: str) -> _FutureSource[T]:
    """Run a blocking call in a thread of its own, as a future (the SDK's non-blocking
    ``close()`` and friends)."""
    future: concurrent.futures.Future[T] = concurrent.futures.Future()

    def run() -> None:
        if not future.set_running_or_notify_cancel():
            return
        try:
            future.set_result(func())
        except BaseException as exc:  # noqa: BLE001 - delivered by the future
            future.set_exception(exc)

    threading.Thread(target=run, name=f"asyncsandbox.compat:{name}", daemon=True).start()
    return _FutureSource(future)


class OperationRef(Generic[T]):
    """A running operation (the SDK's future): ``result(timeout=None)`` blocks for its
    value, ``await ref`` waits without blocking the event loop.

    ``result(timeout)`` raises the builtin ``TimeoutError`` past ``timeout`` and leaves the
    operation running, as the SDK does. Errors are the SDK's (``SandboxTimeoutError``,
    ``SandboxFileError``...), with asyncsandbox's original as ``__cause__``.
    """

    def __init__(
        self,
        source: _Source[Any],
        convert: Callable[[Any], T] = lambda value: value,
        *,
        name: str = "operation",
        deadline: float | None = None,
        timeout: float | None = None,
    ) -> None:
        self._source = source
        self._convert = convert
        self._name = name
        self._deadline = deadline  # monotonic; past it the operation is cancelled
        self._timeout = timeout  # for messages

    @classmethod
    def _done(cls, value: T | None = None, error: BaseException | None = None) -> OperationRef[T]:
        return cls(_Done(value, error))

    def result(self, timeout: float | None = None) -> T:
        """Wait until done; return the value or raise the operation's error. Blocks."""
        wait, by_deadline = timeout, False
        if self._deadline is not None:
            remaining = max(0.0, self._deadline - time.monotonic())
            if wait is None or remaining <= wait:
                wait, by_deadline = remaining, True
        try:
            value = self._source.result(wait)
        except TimeoutError as exc:
            if self._source.done():
                raise self._translated(exc) from exc  # the operation's own timeout
            if by_deadline:
                self._source.cancel()
                raise SandboxTimeoutError(
                    f"{self._name} did not finish within {self._timeout:g}s (cancelled)"
                ) from None
            raise
        except sync.RunningEventLoopError:
            raise  # a usage error with its own advice: keep it as it is
        except BaseException as exc:
            translated = self._translated(exc)
            if translated is exc:
                raise
            raise translated from exc
        return self._convert(value)

    def _translated(self, exc: BaseException) -> BaseException:
        return translate(exc, timeout=self._timeout)

    def done(self) -> bool:
        """True once finished (with a value, an error, or cancelled). Never blocks."""
        return self._source.done()

    def cancel(self) -> bool:
        """Cancel the operation (a running command is killed); False if already done."""
        return self._source.cancel()

    async def _wait(self) -> T:
        try:
            return await anyio.to_thread.run_sync(self.result, abandon_on_cancel=True)
        except anyio.get_cancelled_exc_class():
            self.cancel()  # as the SDK: cancelling the awaiting task cancels the operation
            raise

    def __await__(self) -> Generator[Any, None, T]:
        return self._wait().__await__()

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self._name} {'done' if self.done() else 'pending'}>"


@final
class StreamReader(Generic[S]):
    """A command's output stream (``process.stdout``). Iterating gives the output once the
    command finished, as one chunk (asyncsandbox delivers streaming output through
    ``asyncsandbox.Sandbox.exec_stream``; this one does not stream)."""

    def __init__(self, read: Callable[[], S]) -> None:
        self._read: Callable[[], S] = read

    def __iter__(self) -> Iterator[S]:
        data = self._read()
        if data:
            yield data

    async def __aiter__(self) -> AsyncIterator[S]:
        data = await anyio.to_thread.run_sync(self._read, abandon_on_cancel=True)
        if data:
            yield data

    def close(self) -> None:
        """Stop reading (nothing to release here)."""


@final
class Process(OperationRef[ProcessResult]):
    """A command started by :meth:`Sandbox.exec`: a future of its
    :class:`ProcessResult` (str ``stdout``/``stderr``, ``returncode``).

    ``result()`` raises :class:`SandboxTimeoutError` when the command ran past its
    ``timeout_seconds`` (it was killed), :class:`SandboxExecutionError` for ``check=True``
    and a non-zero exit. ``cancel()`` kills it.
    """

    def __init__(self, handle: sync.Handle[Any], command: list[str], timeout: float | None) -> None:
        super().__init__(handle, process_result, name="exec", timeout=timeout)
        self._command = command
        self.stdout: StreamReader[str] = StreamReader(lambda: self.result().stdout)
        """The command's standard output (see :class:`StreamReader`)."""
        self.stderr: StreamReader[str] = StreamReader(lambda: self.result().stderr)
        """The command's standard error."""
        self.stdin: None = None
        """Interactive stdin (``exec(stdin=True)``) is not supported: always None."""

    @property
    def command(self) -> list[str]:
        """The command, as given."""
        return list(self._command)

    @property
    def returncode(self) -> int | None:
        """The exit status once finished (None before, and when it failed to finish)."""
        return self.poll()

    def poll(self) -> int | None:
        """The exit status if finished, else None. Never blocks."""
        if not self.done():
            return None
        try:
            return self.result(0).returncode
        except Exception:  # noqa: BLE001 - a failed command has no exit status
            return None

    def wait(self, timeout: float | None = None) -> int:
        """Wait for the command and return its exit status. Blocks."""
        return self.result(timeout).returncode


# -- helpers --------------------------------------------------------------------------------


def results(refs: OperationRef[T] | Sequence[OperationRef[T]], /) -> T | list[T]:
    """``.result()`` of one ref, or of each ref of a sequence, in order (the first error
    propagates). Blocks."""
    if isinstance(refs, OperationRef):
        return refs.result()
    return [ref.result() for ref in refs]


def wait(
    waitables: Iterable[Sandbox | OperationRef[Any]],
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
    sync._check_blocking_allowed("cwsandbox.wait()")
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
        if isinstance(item, Sandbox):
            source = item._start_ref()._source
        elif isinstance(item, OperationRef):
            source = item._source
        else:
            raise TypeError(f"wait() takes Sandbox and OperationRef objects, got {item!r}")
        source.add_done_callback(_calling(on_done, item))
    with changed:
        changed.wait_for(lambda: len(finished) >= wanted, timeout)
        done = finished[:wanted]
    chosen = {id(x) for x in done}
    return done, [x for x in items if id(x) not in chosen]


def _calling(func: Callable[[object], None], item: object) -> Callable[[object], None]:
    return lambda _: func(item)


def _statuses(status: object) -> set[SandboxStatus] | None:
    if status is None:
        return None
    values = [status] if isinstance(status, str) else status
    if not isinstance(values, Iterable):
        raise CWSandboxValidationError(f"status must be a SandboxStatus or a list, got {status!r}")
    try:
        return {SandboxStatus(str(v).lower()) for v in values}
    except ValueError:
        known = ", ".join(s.value for s in SandboxStatus)
        raise CWSandboxValidationError(f"unknown status in {status!r}; known: {known}") from None


def _check_cloud_arguments(where: str, **values: Any) -> None:
    for name, value in values.items():
        if value is not None and value != () and value != []:
            raise cloud_only(f"{where}({name}=...)", CLOUD_OPTIONS.get(name, ""))


# -- sessions -------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class _Settings:
    """One sandbox's options, resolved: what the SyncSession is given, and what stays
    here (the default exec timeout, files to write at start)."""

    overrides: dict[str, Any]
    exec_timeout: float
    mounted_files: tuple[tuple[str, bytes], ...]


class _MetricsReporter:
    """Sends the session's metrics to the active W&B run, under a dialect's names."""

    def __init__(self, dialect: Dialect) -> None:
        self.dialect = dialect
        self.delivered = 0

    def __call__(self, metrics: Mapping[str, float], step: int | None) -> None:
        run = _metrics._wandb_run()
        if run is None:
            raise LookupError("no active wandb run")  # keep counting until one exists
        run.log(self.dialect.metrics(metrics), step=step)
        self.delivered += 1


class Session:
    """Sandboxes sharing :class:`SandboxDefaults`, tracked and cleaned up together, with
    sandbox metrics (``log_metrics``). The SDK's signature, plus where sandboxes run:

    :param defaults: :class:`SandboxDefaults` or a mapping of its fields.
    :param report_to: ``None``: log metrics to the active W&B run when there is one;
        ``["wandb"]``: the same, explicitly; ``[]``: never. Metrics keep accumulating
        while no run is active.
    :param auth: cloud-only (must be None).
    :param backend: asyncsandbox backend: ``"process"`` (default, or
        ``$ASYNCSANDBOX_BACKEND``), ``"docker"``, ``"remote"``...
    :param backend_options: its options (e.g. ``{"root": ...}``).

    Sandboxes it creates that are dropped without ``stop()`` are stopped when collected;
    a session never closed is closed at interpreter exit. Waiting for a sandbox slot is
    bounded by ``request_timeout_seconds`` (then :class:`SandboxResourceExhaustedError`).
    """

    _dialect: ClassVar[Dialect] = CWSANDBOX

    def __init__(
        self,
        defaults: SandboxDefaults | Mapping[str, Any] | None = None,
        report_to: builtins.list[str] | None = None,
        *,
        auth: Any = None,
        backend: str | Backend | None = None,
        backend_options: Mapping[str, Any] | None = None,
    ) -> None:
        self._defaults = _coerce_defaults(defaults)
        if auth is not None:
            raise cloud_only("auth", CLOUD_OPTIONS["auth"])
        for name in self._defaults.cloud_options():
            raise cloud_only(f"SandboxDefaults({name}=...)", CLOUD_OPTIONS[name])
        _check_main_process(self._defaults.command, self._defaults.args)
        chosen = backend if backend is not None else os.environ.get("ASYNCSANDBOX_BACKEND")
        self._backend: str | Backend = chosen or "process"
        self._backend_name = self._backend if isinstance(self._backend, str) else self._backend.name
        self._reporter = _MetricsReporter(self._dialect)
        self._reporting = _check_report_to(report_to)
        timeout = self._defaults.request_timeout_seconds
        try:
            native = _native_defaults(self._defaults, self._backend_name)
            self._sync = sync.SyncSession(
                self._backend,
                backend_options=backend_options,
                defaults=native,
                # The SDK waits at most request_timeout_seconds for a sandbox: so does
                # this session, for a slot; it never waits forever.
                limits=Limits(capacity_timeout=timeout),
                timeouts=Timeouts(create=timeout),
                report_to=[self._reporter] if self._reporting else [],
                metrics_prefix="",
            )
        except InvalidArgument as exc:
            raise translate(exc) from exc
        self._sandboxes: weakref.WeakSet[Sandbox] = weakref.WeakSet()
        self._adopted: set[str] = set()
        self._closed = False
        self._close_ref: OperationRef[None] | None = None

    @property
    def defaults(self) -> SandboxDefaults:
        """The session's :class:`SandboxDefaults`."""
        return self._defaults

    @property
    def sandbox_count(self) -> int:
        """Sandboxes of this session not stopped yet."""
        return sum(1 for sb in list(self._sandboxes) if sb._state() not in ("closed",))

    def _check_open(self) -> None:
        if self._closed:
            raise SandboxError("the session is closed")

    def sandbox(self, **kwargs: Any) -> Sandbox:
        """A new sandbox with the session's defaults and ``kwargs`` (any
        :class:`SandboxDefaults` field, plus ``mounted_files``). Not started: it starts on
        its first operation, or ``start()``. Unknown arguments raise ``TypeError``."""
        self._check_open()
        sandbox = Sandbox._new(self, self._resolve(None, kwargs, "Session.sandbox()"))
        self._sandboxes.add(sandbox)
        return sandbox

    def _resolve(
        self, defaults: SandboxDefaults | None, kwargs: dict[str, Any], where: str
    ) -> _Settings:
        base = self._defaults if defaults is None else _coerce_defaults(defaults)
        return _resolve_settings(self._defaults, base, self._backend_name, kwargs, where)

    def list(
        self,
        *,
        tags: Iterable[str] | None = None,
        status: Any = None,
        runner_ids: Iterable[str] | None = None,
        show_terminated: bool = False,
        adopt: bool = False,
        volume_ids: Iterable[str] | None = None,
    ) -> OperationRef[builtins.list[Sandbox]]:
        """Sandboxes carrying all of the session's default tags and ``tags``, optionally in
        ``status`` (a status or a list); active ones only unless ``show_terminated``. With
        ``adopt``, this session's close also stops them. Resolved at once (listing is
        local)."""
        _check_cloud_arguments("Session.list", runner_ids=runner_ids, volume_ids=volume_ids)
        wanted = self._defaults.merge_tags(tags)
        found = self._list(wanted, status, show_terminated)
        if adopt:
            for sandbox in found.result():
                self.adopt(sandbox)
        return found

    def _list(
        self, tags: Sequence[str], status: Any, show_terminated: bool
    ) -> OperationRef[builtins.list[Sandbox]]:
        try:
            wanted = _statuses(status)
            self._check_open()
            infos = _off_loop(lambda: self._sync.list(tags=normalize_tags(tags)))
        except Exception as exc:  # noqa: BLE001 - delivered by the ref, as the SDK would
            return OperationRef._done(error=_translated(exc))
        found = []
        for info in infos:
            compat_status = SandboxStatus.from_native(info.status)
            if wanted is not None:
                if compat_status not in wanted:
                    continue
            elif not show_terminated and compat_status not in ACTIVE:
                continue
            found.append(Sandbox._discovered(self, info))
        return OperationRef._done(found)

    def from_id(self, sandbox_id: str, *, adopt: bool = True) -> OperationRef[Sandbox]:
        """The sandbox with this id (of any session on this backend), adopted by default:
        this session's close stops it. It can be stopped, not used (see ``Sandbox.list``)."""
        found = self._list((), None, True)
        if not found.done():  # pragma: no cover - _list resolves at once
            raise AssertionError("listing resolves at once")
        try:
            sandbox = next(s for s in found.result() if s.sandbox_id == sandbox_id)
        except StopIteration:
            return OperationRef._done(
                error=SandboxNotFoundError(
                    f"sandbox {sandbox_id!r} not found", sandbox_id=sandbox_id
                )
            )
        except Exception as exc:  # noqa: BLE001 - delivered by the ref
            return OperationRef._done(error=exc)
        if adopt:
            self.adopt(sandbox)
        return OperationRef._done(sandbox)

    def adopt(self, sandbox: Sandbox) -> None:
        """Let this session's close stop ``sandbox`` too."""
        self._check_open()
        if sandbox.sandbox_id is None:
            raise SandboxError("cannot adopt a sandbox that has no id yet")
        if sandbox._session is not self:
            self._adopted.add(sandbox.sandbox_id)

    def function(self, **kwargs: Any) -> Any:
        """``@session.function()`` (remote Python functions) is not supported."""
        raise UnsupportedFeatureError(
            "Session.function() is not supported by asyncsandbox.compat; run the code with "
            "sandbox.exec(['python3', '-c', source]) and exchange data with write_file/read_file"
        )

    def log_metrics(self, step: int | None = None, *, reset: bool = True) -> bool:
        """Log the session's sandbox metrics to the active W&B run at training ``step``
        (names: ``cwsandbox/executions``...; ``aviato/...`` in the aviato spelling, see
        :data:`METRIC_NAMES`); return whether they were logged. With ``reset``, counting
        restarts, but only once they were logged."""
        if not self._reporting:
            return False
        before = self._reporter.delivered
        _off_loop(lambda: self._sync.log_metrics(step, reset=reset))
        return self._reporter.delivered > before

    def get_metrics(self) -> dict[str, float]:
        """The current metrics (the names ``log_metrics`` uses) without logging them;
        ``{}`` when reporting is disabled (``report_to=[]``)."""
        if not self._reporting:
            return {}
        return self._dialect.metrics(_off_loop(self._sync.metrics))

    def close(self) -> OperationRef[None]:
        """Stop every sandbox of the session (and those it adopted) and release it.
        Returns at once; idempotent."""
        if self._close_ref is not None:
            return self._close_ref
        self._closed = True
        adopted = builtins.list(self._adopted)

        def close() -> None:
            try:
                if adopted:
                    self._sync.delete(ids=adopted)
            finally:
                self._sync.close()

        self._close_ref = OperationRef(_in_thread(close, "close"), name="close")
        return self._close_ref

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc_val: BaseException | None,
        exc_tb: TracebackType | None,
    ) -> None:
        self.close().result()

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc_val: BaseException | None,
        exc_tb: TracebackType | None,
    ) -> None:
        await self.close()

    def __repr__(self) -> str:
        state = "closed" if self._closed else "open"
        return f"<{self._dialect.name}.Session {state} on {self._backend_name}>"


def _coerce_defaults(defaults: object) -> SandboxDefaults:
    if defaults is None:
        return SandboxDefaults()
    if isinstance(defaults, SandboxDefaults):
        return defaults
    if isinstance(defaults, NativeDefaults):
        raise CWSandboxValidationError(
            "defaults is asyncsandbox.SandboxDefaults; this API takes the SDK's "
            "(asyncsandbox.compat.cwsandbox.SandboxDefaults, with container_image=...)"
        )
    if isinstance(defaults, Mapping):
        return SandboxDefaults.from_dict(defaults)
    raise CWSandboxValidationError(
        f"defaults must be SandboxDefaults or a mapping, got {defaults!r}"
    )


def _check_report_to(report_to: object) -> bool:
    if report_to is None:
        return True
    if isinstance(report_to, str) or not isinstance(report_to, Iterable):
        raise CWSandboxValidationError(
            f"report_to must be a list such as ['wandb'], got {report_to!r}"
        )
    names = builtins.list(report_to)
    for name in names:
        if name != "wandb":
            raise CWSandboxValidationError(
                f"unknown report_to entry {name!r}: the SDK reports to 'wandb' only"
            )
    return bool(names)


def _check_main_process(command: object, args: object) -> None:
    given = tuple(args) if isinstance(args, Iterable) else ()
    if command != "/bin/sh" or given != KEEP_ALIVE_ARGS:
        raise UnsupportedFeatureError(
            "a main process (command=/args=) is not supported: asyncsandbox sandboxes "
            "have no main process; start the program with exec()"
        )


def _image(backend: str, container_image: str) -> str | None:
    """The image the backend runs for ``container_image``: the process backend runs the
    host's system (or a root filesystem directory), never a registry image."""
    if backend != "process" or container_image.startswith("/"):
        return container_image
    if container_image not in _images_noted:
        _images_noted.add(container_image)
        _log.info(
            "compat.image.not_applied",
            container_image=container_image,
            detail="the process backend runs the host's system; backend='docker' runs images",
        )
    return None


def _native_defaults(defaults: SandboxDefaults, backend: str) -> NativeDefaults:
    values: dict[str, Any] = {
        "image": _image(backend, defaults.container_image),
        "tags": defaults.tags,
        "env": dict(defaults.environment_variables),
    }
    if defaults.working_dir is not None:
        values["workdir"] = defaults.working_dir
    resources = native_resources(defaults.resources)
    if resources is not None:
        values["resources"] = resources
    network = native_network(defaults.network)
    if network is not None:
        values["network"] = network
    if defaults.max_lifetime_seconds is not None:
        values["max_lifetime"] = float(defaults.max_lifetime_seconds)
    return NativeDefaults(**values)


_SANDBOX_ARGUMENTS = frozenset(
    {f.name for f in dataclasses.fields(SandboxDefaults)} | {"mounted_files"}
)


def _resolve_settings(
    session_defaults: SandboxDefaults,
    base: SandboxDefaults,
    backend: str,
    kwargs: dict[str, Any],
    where: str,
) -> _Settings:
    """The sandbox options of ``base`` (the defaults in force) and ``kwargs``, as
    overrides of ``session_defaults`` (the SyncSession's)."""
    for name in kwargs:
        if name not in _SANDBOX_ARGUMENTS:
            raise unknown_argument(where, name, _SANDBOX_ARGUMENTS)
    mounted = _mounted_files(kwargs.pop("mounted_files", None))
    effective = base.with_overrides(
        **{k: v for k, v in kwargs.items() if k not in ("tags", "environment_variables")},
        tags=base.merge_tags(kwargs.get("tags")),
        environment_variables=base.merge_environment_variables(kwargs.get("environment_variables")),
    )
    for name in effective.cloud_options():
        raise cloud_only(f"{name}=", CLOUD_OPTIONS[name])
    _check_main_process(effective.command, effective.args)
    session_native = _native_defaults(session_defaults, backend)
    native = _native_defaults(effective, backend)
    overrides: dict[str, Any] = {}
    if native.tags[: len(session_native.tags)] == session_native.tags:
        extra = native.tags[len(session_native.tags) :]
        if extra:
            overrides["tags"] = extra
    else:  # other defaults than the session's (a standalone Sandbox(defaults=...))
        raise CWSandboxValidationError("these tags cannot be expressed over the session's")
    if native.env != session_native.env:
        overrides["env"] = native.env
    for name in ("image", "workdir", "resources", "network", "max_lifetime"):
        if getattr(native, name) != getattr(session_native, name):
            overrides[name] = getattr(native, name)
    return _Settings(overrides, float(effective.request_timeout_seconds), mounted)


def _mounted_files(value: object) -> tuple[tuple[str, bytes], ...]:
    if value is None:
        return ()
    items: Iterable[Any]
    if isinstance(value, Mapping):
        items = [{"mount_path": k, "file_content": v} for k, v in value.items()]
    elif isinstance(value, Iterable) and not isinstance(value, str | bytes):
        items = value
    else:
        raise CWSandboxValidationError(f"mounted_files must be a list or a mapping, got {value!r}")
    out = []
    for item in items:
        if not isinstance(item, Mapping) or "mount_path" not in item:
            raise CWSandboxValidationError(f"a mounted file needs mount_path, got {item!r}")
        content = item.get("file_content", item.get("content", b""))
        if isinstance(content, str):
            content = content.encode()
        if not isinstance(content, bytes | bytearray):
            raise CWSandboxValidationError(f"file_content must be bytes, got {content!r}")
        out.append((str(item["mount_path"]), bytes(content)))
    return tuple(out)


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


class Sandbox:
    """One sandbox (the SDK's class): lazy until ``start()`` or its first operation.

    Standalone (``Sandbox(...)``, ``Sandbox.run(...)``) it belongs to a process-wide
    session; from ``session.sandbox()`` to that session. Dropped without ``stop()``, it is
    stopped when collected. Cloud-only properties raise :class:`CloudOnlyFeatureError`.
    """

    _session: Session
    _sync: sync.SyncSandbox | None
    _info: SandboxInfo | None

    def __init__(
        self, *, defaults: SandboxDefaults | Mapping[str, Any] | None = None, **kwargs: Any
    ) -> None:
        session = _default_session()
        base = None if defaults is None else _coerce_defaults(defaults)
        self._setup(session, session._resolve(base, kwargs, "Sandbox()"))

    @classmethod
    def _new(cls, session: Session, settings: _Settings) -> Sandbox:
        sandbox = cls.__new__(cls)
        sandbox._setup(session, settings)
        return sandbox

    def _setup(self, session: Session, settings: _Settings) -> None:
        self._session = session
        self._settings = settings
        self._pending_files = builtins.list(settings.mounted_files)
        self._files_lock = threading.Lock()
        self._start: OperationRef[None] | None = None
        self._info = None
        try:
            self._sync = _off_loop(lambda: session._sync.sandbox(**settings.overrides))
        except Exception as exc:
            raise _translated(exc) from exc

    @classmethod
    def _discovered(cls, session: Session, info: SandboxInfo) -> Sandbox:
        sandbox = cls.__new__(cls)
        sandbox._session = session
        sandbox._settings = _Settings({}, session._defaults.request_timeout_seconds, ())
        sandbox._pending_files = []
        sandbox._files_lock = threading.Lock()
        sandbox._sync = None
        sandbox._info = info
        sandbox._start = OperationRef._done(None)
        return sandbox

    # -- construction helpers of the SDK -------------------------------------------------

    @classmethod
    def run(cls, *args: str, **kwargs: Any) -> Sandbox:
        """Create a sandbox and start it (blocks until it is accepted). ``args`` (a main
        process) are not supported: run programs with :meth:`exec`."""
        if args:
            _check_main_process(args[0], args[1:])
        sandbox = cls(**kwargs)
        sandbox.start().result()
        return sandbox

    @classmethod
    def session(
        cls, defaults: SandboxDefaults | Mapping[str, Any] | None = None, *, auth: Any = None
    ) -> Session:
        """A :class:`Session` with ``defaults``."""
        return Session(defaults, auth=auth)

    @classmethod
    def list(
        cls,
        *,
        tags: Iterable[str] | None = None,
        status: Any = None,
        runner_ids: Iterable[str] | None = None,
        show_terminated: bool = False,
        base_url: str | None = None,
        auth: Any = None,
        timeout_seconds: float | None = None,
        poll_retry_budget_seconds: float | None = None,
        poll_rpc_timeout_seconds: float | None = None,
        data_plane_mode: Any = None,
        volume_ids: Iterable[str] | None = None,
    ) -> OperationRef[builtins.list[Sandbox]]:
        """Sandboxes (of any session on this backend) carrying all ``tags``, optionally in
        ``status`` (a status or a list of them); active ones only unless
        ``show_terminated``. Those found can be inspected and stopped."""
        _check_cloud_arguments(
            "Sandbox.list",
            runner_ids=runner_ids,
            base_url=base_url,
            auth=auth,
            data_plane_mode=data_plane_mode,
            volume_ids=volume_ids,
        )
        return _default_session()._list(normalize_tags(tags or ()), status, show_terminated)

    @classmethod
    def from_id(cls, sandbox_id: str, **kwargs: Any) -> OperationRef[Sandbox]:
        """The sandbox with this id (it can be inspected and stopped)."""
        _check_cloud_arguments("Sandbox.from_id", **_cloud_only_kwargs(kwargs))
        return _default_session().from_id(sandbox_id, adopt=False)

    @classmethod
    def delete(
        cls,
        sandbox_id: str,
        *,
        base_url: str | None = None,
        auth: Any = None,
        timeout_seconds: float | None = None,
        missing_ok: bool = False,
    ) -> OperationRef[None]:
        """Remove the sandbox with this id. ``SandboxNotFoundError`` if there is none,
        unless ``missing_ok``."""
        _check_cloud_arguments("Sandbox.delete", base_url=base_url, auth=auth)
        session = _default_session()
        found = session.from_id(sandbox_id, adopt=False)
        try:
            found.result()
        except SandboxNotFoundError:
            if missing_ok:
                return OperationRef._done(None)
            raise
        return OperationRef(
            _in_thread(lambda: session._sync.delete(ids=[sandbox_id]), "delete"),
            lambda _: None,
            name="delete",
        )

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
            self._start = OperationRef(_off_loop(sandbox.start), lambda _: None, name="start")
        return self._start

    def start(self) -> OperationRef[None]:
        """Start the sandbox (idempotent); the ref resolves once it is running."""
        _off_loop(self._live)
        return self._start_ref()

    def wait(self, timeout: float | None = None) -> Sandbox:
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
    ) -> OperationRef[Sandbox]:
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
                _in_thread(lambda: self._session._sync.delete(ids=[sandbox_id]), "stop"),
                lambda _: None,
                name="stop",
            )
        return OperationRef(_off_loop(self._sync.stop), name="stop")

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
            handle = _off_loop(
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
        handle = _off_loop(lambda: self._live().read_file(filepath))
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
        handle = _off_loop(lambda: self._live().write_file(filepath, data))
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
    def run_from_template(cls, template_id: str, /, *args: Any, **kwargs: Any) -> Sandbox:
        """Cloud-only: sandbox templates."""
        raise cloud_only("Sandbox.run_from_template()", "sandbox templates")

    @classmethod
    def run_from_file(cls, contents: Any, /, **kwargs: Any) -> Sandbox:
        """Cloud-only: sandboxes from Compose files."""
        raise cloud_only("Sandbox.run_from_file()", "Compose sandboxes")

    def __repr__(self) -> str:
        return f"<Sandbox {self.sandbox_id or '(not started)'} {self.status.value}>"


def _cloud_only_kwargs(kwargs: dict[str, Any]) -> dict[str, Any]:
    known = {
        "base_url",
        "auth",
        "timeout_seconds",
        "poll_retry_budget_seconds",
        "poll_rpc_timeout_seconds",
        "data_plane_mode",
    }
    for name in kwargs:
        if name not in known:
            raise unknown_argument("Sandbox.from_id()", name, known)
    return {k: v for k, v in kwargs.items() if k in ("base_url", "auth", "data_plane_mode")}


def _translated(exc: BaseException) -> BaseException:
    return translate(exc)


# -- the process-wide session of standalone sandboxes ---------------------------------------

_default: Session | None = None
_default_lock = threading.Lock()


def _default_session() -> Session:
    global _default
    with _default_lock:
        if _default is None or _default._closed:
            _default = Session(report_to=[])
        return _default


# -- module functions of the SDK -----------------------------------------------------------


def disable_signal_handlers() -> None:
    """Nothing to do: asyncsandbox installs no signal handlers (sessions left open are
    closed at interpreter exit)."""


def set_auth_mode(name: str, get_auth: Callable[..., Any] | None = None) -> None:
    """Cloud-only: authentication to the CoreWeave API."""
    raise cloud_only("set_auth_mode()", CLOUD_OPTIONS["auth"])


def list_runners(**kwargs: Any) -> builtins.list[Any]:
    """Cloud-only: runner discovery."""
    raise cloud_only("list_runners()", "runner discovery")


def get_runner(runner_id: str, **kwargs: Any) -> Any:
    """Cloud-only: runner discovery."""
    raise cloud_only("get_runner()", "runner discovery")


def format_bytes(value: int) -> str:
    """``value`` bytes for display (KiB, MiB, GiB...)."""
    size = float(value)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(size) < 1024 or unit == "TiB":
            return f"{size:.0f} {unit}" if unit == "B" else f"{size:.1f} {unit}"
        size /= 1024
    raise AssertionError("unreachable")  # pragma: no cover


def format_cpu(millicores: int) -> str:
    """CPU millicores for display (``1500`` -> ``1.5 cores``)."""
    return f"{millicores / 1000:g} cores"
