"""The seed SDK's ``Session``, the constructors of its ``Sandbox`` and its module
functions, over :mod:`asyncsandbox.sync`.

Every sandbox is an :class:`asyncsandbox.sync.SyncSandbox` of a
:class:`~asyncsandbox.sync.SyncSession`; every operation is one of its handles, wrapped in
the SDK's future types. This package adds no runtime: it renames, converts results, and
translates errors (:func:`._types.translate`) at its boundary. The futures are
``_futures.py``'s, the options' translation ``_settings.py``'s, a sandbox's operations
``_sandbox.py``'s; a session and the sandboxes it makes (and a sandbox's
``Sandbox.session()``) need each other, so they are here together.
"""

from __future__ import annotations

import builtins
import os
import threading
import weakref
from collections.abc import Callable, Iterable, Mapping, Sequence
from types import TracebackType
from typing import Any, ClassVar, Self

from .. import sync
from .._config import Limits, Timeouts
from .._errors import InvalidArgument
from .._metrics import wandb_run
from .._models import SandboxInfo
from ..abc import Backend
from ._futures import OperationRef, in_thread, off_loop, resolved
from ._sandbox import Owner, SandboxBase
from ._settings import (
    Settings,
    check_cloud_arguments,
    check_main_process,
    check_report_to,
    cloud_only_kwargs,
    coerce_defaults,
    native_defaults,
    resolve_settings,
    statuses,
)
from ._types import (
    ACTIVE,
    CLOUD_OPTIONS,
    CWSANDBOX,
    Dialect,
    SandboxDefaults,
    SandboxError,
    SandboxNotFoundError,
    SandboxStatus,
    UnsupportedFeatureError,
    cloud_only,
    normalize_tags,
    translate,
)

# -- sessions -------------------------------------------------------------------------------


class _MetricsReporter:
    """Sends the session's metrics to the active W&B run, under a dialect's names."""

    def __init__(self, dialect: Dialect) -> None:
        self.dialect = dialect
        self.delivered = 0

    def __call__(self, metrics: Mapping[str, float], step: int | None) -> None:
        run = wandb_run()
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
        self._defaults = coerce_defaults(defaults)
        if auth is not None:
            raise cloud_only("auth", CLOUD_OPTIONS["auth"])
        for name in self._defaults.cloud_options():
            raise cloud_only(f"SandboxDefaults({name}=...)", CLOUD_OPTIONS[name])
        check_main_process(self._defaults.command, self._defaults.args)
        chosen = backend if backend is not None else os.environ.get("ASYNCSANDBOX_BACKEND")
        self._backend: str | Backend = chosen or "process"
        self._backend_name = self._backend if isinstance(self._backend, str) else self._backend.name
        self._reporter = _MetricsReporter(self._dialect)
        self._reporting = check_report_to(report_to)
        timeout = self._defaults.request_timeout_seconds
        try:
            native = native_defaults(self._defaults, self._backend_name)
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
        self._owner = Owner(self._sync, timeout)
        self._sandboxes: weakref.WeakSet[Sandbox] = weakref.WeakSet()  # made by sandbox()
        self._own: weakref.WeakSet[SandboxBase] = weakref.WeakSet()  # and found, standalone
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
        return sum(1 for sb in list(self._sandboxes) if sb.status is not SandboxStatus.TERMINATED)

    def _check_open(self) -> None:
        if self._closed:
            raise SandboxError("the session is closed")

    def sandbox(self, **kwargs: Any) -> Sandbox:
        """A new sandbox with the session's defaults and ``kwargs`` (any
        :class:`SandboxDefaults` field, plus ``mounted_files``). Not started: it starts on
        its first operation, or ``start()``. Unknown arguments raise ``TypeError``."""
        self._check_open()
        sandbox = Sandbox._made(self, self._resolve(None, kwargs, "Session.sandbox()"), None)
        self._sandboxes.add(sandbox)
        return sandbox

    def _resolve(
        self, defaults: SandboxDefaults | None, kwargs: dict[str, Any], where: str
    ) -> Settings:
        base = self._defaults if defaults is None else coerce_defaults(defaults)
        return resolve_settings(self._defaults, base, self._backend_name, kwargs, where)

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
        check_cloud_arguments("Session.list", runner_ids=runner_ids, volume_ids=volume_ids)
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
            wanted = statuses(status)
            self._check_open()
            infos = off_loop(lambda: self._sync.list(tags=normalize_tags(tags)))
        except Exception as exc:  # noqa: BLE001 - delivered by the ref, as the SDK would
            return resolved(error=translate(exc))
        found = []
        for info in infos:
            compat_status = SandboxStatus.from_native(info.status)
            if wanted is not None:
                if compat_status not in wanted:
                    continue
            elif not show_terminated and compat_status not in ACTIVE:
                continue
            found.append(Sandbox._made(self, None, info))
        return resolved(found)

    def from_id(self, sandbox_id: str, *, adopt: bool = True) -> OperationRef[Sandbox]:
        """The sandbox with this id (of any session on this backend), adopted by default:
        this session's close stops it. It can be stopped, not used (see ``Sandbox.list``)."""
        found = self._list((), None, True)
        if not found.done():  # pragma: no cover - _list resolves at once
            raise AssertionError("listing resolves at once")
        try:
            sandbox = next(s for s in found.result() if s.sandbox_id == sandbox_id)
        except StopIteration:
            return resolved(
                error=SandboxNotFoundError(
                    f"sandbox {sandbox_id!r} not found", sandbox_id=sandbox_id
                )
            )
        except Exception as exc:  # noqa: BLE001 - delivered by the ref
            return resolved(error=exc)
        if adopt:
            self.adopt(sandbox)
        return resolved(sandbox)

    def adopt(self, sandbox: Sandbox) -> None:
        """Let this session's close stop ``sandbox`` too."""
        self._check_open()
        if sandbox.sandbox_id is None:
            raise SandboxError("cannot adopt a sandbox that has no id yet")
        if sandbox not in self._own:
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
        off_loop(lambda: self._sync.log_metrics(step, reset=reset))
        return self._reporter.delivered > before

    def get_metrics(self) -> dict[str, float]:
        """The current metrics (the names ``log_metrics`` uses) without logging them;
        ``{}`` when reporting is disabled (``report_to=[]``)."""
        if not self._reporting:
            return {}
        return self._dialect.metrics(off_loop(self._sync.metrics))

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

        self._close_ref = OperationRef(in_thread(close, "close"), name="close")
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


class Sandbox(SandboxBase):
    """One sandbox (the SDK's class): lazy until ``start()`` or its first operation.

    Standalone (``Sandbox(...)``, ``Sandbox.run(...)``) it belongs to a process-wide
    session; from ``session.sandbox()`` to that session. Dropped without ``stop()``, it is
    stopped when collected. Cloud-only properties raise :class:`CloudOnlyFeatureError`.
    """

    def __init__(
        self, *, defaults: SandboxDefaults | Mapping[str, Any] | None = None, **kwargs: Any
    ) -> None:
        session = _default_session()
        base = None if defaults is None else coerce_defaults(defaults)
        super().__init__(session._owner, session._resolve(base, kwargs, "Sandbox()"))
        session._own.add(self)

    @classmethod
    def _made(cls, session: Session, settings: Settings | None, info: SandboxInfo | None) -> Self:
        """A sandbox of ``session`` (new with ``settings``, or found: ``info``)."""
        sandbox = cls.__new__(cls)
        SandboxBase.__init__(sandbox, session._owner, settings, info=info)
        session._own.add(sandbox)
        return sandbox

    # -- construction helpers of the SDK -------------------------------------------------

    @classmethod
    def run(cls, *args: str, **kwargs: Any) -> Sandbox:
        """Create a sandbox and start it (blocks until it is accepted). ``args`` (a main
        process) are not supported: run programs with :meth:`exec`."""
        if args:
            check_main_process(args[0], args[1:])
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
        check_cloud_arguments(
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
        check_cloud_arguments("Sandbox.from_id", **cloud_only_kwargs(kwargs))
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
        check_cloud_arguments("Sandbox.delete", base_url=base_url, auth=auth)
        session = _default_session()
        found = session.from_id(sandbox_id, adopt=False)
        try:
            found.result()
        except SandboxNotFoundError:
            if missing_ok:
                return resolved(None)
            raise
        return OperationRef(
            in_thread(lambda: session._sync.delete(ids=[sandbox_id]), "delete"),
            lambda _: None,
            name="delete",
        )


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
