"""The inspect_ai sandbox provider: ``sandbox="asyncsandbox"`` (or ``("asyncsandbox", config)``).

Lifecycle as inspect drives it:

- ``task_init``: opens one :class:`asyncsandbox.Session` for the task's config, on the
  backend the config names (``process`` by default).
- ``sample_init``: starts one sandbox of that session for the sample (the ``default``
  environment); inspect then writes the sample's files and runs its setup script in it.
- ``sample_cleanup``: removes the sample's sandbox.
- ``task_cleanup``: closes the session, which removes anything still running.
- ``cli_cleanup`` (``inspect sandbox cleanup asyncsandbox [ID]``): removes the given
  sandbox, or every sandbox whose owner is gone (``asyncsandbox gc``).

A Session must be opened and closed in one task; inspect calls ``task_init`` and
``task_cleanup`` from tasks of its own choosing. So each session lives in a task of ours
(:class:`_Keeper`), and sandboxes are used from inspect's sample tasks, which a Session
allows.
"""

from __future__ import annotations

import asyncio
import errno
import os
from collections.abc import Awaitable, Callable, Coroutine
from pathlib import Path
from typing import Any, Literal, TypeVar, overload

import anyio
import anyio.lowlevel
import sniffio
import structlog
import yaml  # type: ignore[import-untyped]  # inspect_ai's dependency, without stubs
from inspect_ai.util import (
    ExecResult,
    OutputLimitExceededError,
    SandboxEnvironment,
    SandboxEnvironmentConfigType,
    SandboxEnvironmentLimits,
    SandboxUnavailableError,
    SandboxUserUnsupportedError,
    sandboxenv,
)
from pydantic import BaseModel, ConfigDict
from typing_extensions import override

import asyncsandbox
from asyncsandbox import (
    FileErrorReason,
    Limits,
    SandboxClosed,
    SandboxDefaults,
    SandboxDied,
    SandboxFileError,
    SandboxNotFound,
    Session,
)

log = structlog.get_logger("asyncsandbox.inspect")

T = TypeVar("T")


class AsyncSandboxConfig(BaseModel):
    """The provider's config: ``sandbox=("asyncsandbox", AsyncSandboxConfig(...))``, or the
    path of a YAML (or JSON) file holding these fields.

    :param backend: the asyncsandbox backend (``"process"``, ``"docker"``, ``"remote"``).
    :param backend_options: keyword arguments of that backend (e.g. ``{"url": ...}``).
    :param defaults: how each sample's sandbox looks: fields of
        :class:`asyncsandbox.SandboxDefaults` (``image``, ``env``, ``workdir``,
        ``resources``, ``network``, ...).
    :param max_live: at most this many sandboxes at once (``Limits.max_live``).
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    backend: str = "process"
    backend_options: dict[str, Any] = {}
    defaults: dict[str, Any] = {}
    max_live: int | None = None

    def __hash__(self) -> int:  # inspect keys its sandbox caches by config
        return hash(self.model_dump_json())


@sandboxenv(name="asyncsandbox")
class AsyncSandboxEnvironment(SandboxEnvironment):
    """One asyncsandbox sandbox, seen by inspect as a sample's sandbox environment.

    Commands run as the sandbox's own unprivileged user; ``exec(user=...)`` accepts that
    user (by name or uid) and raises :class:`SandboxUserUnsupportedError` for any other,
    root included. ``timeout`` is the command's own limit: when it expires the whole
    process tree is killed and ``TimeoutError`` is raised (``timeout_retry`` is not
    needed: no transport can hang the call). ``concurrency`` is ignored: the session
    bounds concurrency itself.
    """

    def __init__(self, sandbox: asyncsandbox.Sandbox) -> None:
        super().__init__()
        self.sandbox = sandbox
        self._user: tuple[str, str] | None = None  # (name, uid) of the sandbox's user

    # -- lifecycle ----------------------------------------------------------------------

    @override
    @classmethod
    def config_deserialize(cls, config: dict[str, Any]) -> BaseModel:
        return AsyncSandboxConfig(**config)

    @override
    @classmethod
    async def task_init(cls, task_name: str, config: SandboxEnvironmentConfigType | None) -> None:
        await _keeper(_resolve_config(config))

    @override
    @classmethod
    async def sample_init(
        cls,
        task_name: str,
        config: SandboxEnvironmentConfigType | None,
        metadata: dict[str, str],
    ) -> dict[str, SandboxEnvironment]:
        keeper = await _keeper(_resolve_config(config))
        sandbox = keeper.session.sandbox(tags=("inspect", f"task:{task_name}"))
        await sandbox.start()
        return {"default": cls(sandbox)}

    @override
    @classmethod
    async def sample_cleanup(
        cls,
        task_name: str,
        config: SandboxEnvironmentConfigType | None,
        environments: dict[str, SandboxEnvironment],
        interrupted: bool,
    ) -> None:
        # Shielded by inspect when the sample was interrupted; stop() bounds itself.
        for environment in environments.values():
            await environment.as_type(AsyncSandboxEnvironment).sandbox.stop()

    @override
    @classmethod
    async def task_cleanup(
        cls, task_name: str, config: SandboxEnvironmentConfigType | None, cleanup: bool
    ) -> None:
        keeper = _keepers.pop(_key(_resolve_config(config)), None)
        if keeper is None:
            return
        if not cleanup and keeper.session.statistics().live.active:
            log.warning(
                "inspect.no_cleanup_unsupported",
                detail="asyncsandbox removes a task's sandboxes when the task ends; "
                "--no-sandbox-cleanup cannot keep them",
            )
        await keeper.close()

    @override
    @classmethod
    async def cli_cleanup(cls, id: str | None) -> None:
        async with Session(_cleanup_backend()) as session:
            if id is not None:
                known = {info.id for info in await session.list()}
                if id in known:
                    await session.delete(ids=[id])
                print(f"removed {id}" if id in known else f"no sandbox {id}")  # noqa: T201
            else:
                for info, reason in await session.gc():
                    print(f"removed {info.id}: {reason}")  # noqa: T201 - a command's output

    @override
    def default_polling_interval(self) -> float:
        return 0.2

    # -- commands -----------------------------------------------------------------------

    @override
    async def exec(
        self,
        cmd: list[str],
        input: str | bytes | None = None,
        cwd: str | None = None,
        env: dict[str, str] | None = None,
        user: str | None = None,
        timeout: int | None = None,
        timeout_retry: bool = True,
        concurrency: bool = True,
    ) -> ExecResult[str]:
        if user is not None:
            await self._check_user(user)
        limit = SandboxEnvironmentLimits.MAX_EXEC_OUTPUT_SIZE
        result = await _unavailable_on_death(
            lambda: self.sandbox.exec(
                cmd, cwd=cwd, env=env, stdin=input, timeout=timeout, max_output_bytes=limit
            )
        )
        if result.returncode == 126 and b"ermission denied" in result.stderr:
            raise PermissionError(errno.EACCES, result.stderr_text.strip(), cmd[0])
        if result.stdout_truncated or result.stderr_truncated:
            raise OutputLimitExceededError(
                SandboxEnvironmentLimits.MAX_EXEC_OUTPUT_SIZE_STR,
                truncated_output=result.stdout_text,
            )
        return ExecResult(
            success=result.returncode == 0,
            returncode=result.returncode,
            stdout=result.stdout_text,
            stderr=result.stderr_text,
        )

    async def _check_user(self, user: str) -> None:
        if self._user is None:
            who = await _unavailable_on_death(
                lambda: self.sandbox.exec(["sh", "-c", "id -un; id -u"], check=True)
            )
            name, uid = who.stdout_text.split()
            self._user = (name, uid)
        if user not in self._user:
            raise SandboxUserUnsupportedError(
                f"asyncsandbox runs every command as the sandbox's own user "
                f"({self._user[0]}, uid {self._user[1]}); running as {user!r} is not supported"
            )

    # -- files --------------------------------------------------------------------------

    @override
    async def write_file(self, file: str, contents: str | bytes) -> None:
        try:
            await _unavailable_on_death(lambda: self.sandbox.write_file(file, contents))
        except SandboxFileError as exc:
            raise _builtin_error(exc, file) from exc

    @overload
    async def read_file(self, file: str, text: Literal[True] = True) -> str: ...

    @overload
    async def read_file(self, file: str, text: Literal[False]) -> bytes: ...

    @override
    async def read_file(self, file: str, text: bool = True) -> str | bytes:
        limit = SandboxEnvironmentLimits.MAX_READ_FILE_SIZE
        try:
            data = await _unavailable_on_death(
                lambda: self.sandbox.read_file(file, max_bytes=limit)
            )
        except SandboxFileError as exc:
            if exc.reason == FileErrorReason.TOO_LARGE:
                raise OutputLimitExceededError(
                    SandboxEnvironmentLimits.MAX_READ_FILE_SIZE_STR, truncated_output=None
                ) from exc
            raise _builtin_error(exc, file) from exc
        return data.decode("utf-8") if text else data


async def _unavailable_on_death(call: Callable[[], Awaitable[T]]) -> T:
    """inspect's word for a sandbox that is gone: :class:`SandboxUnavailableError`."""
    try:
        return await call()
    except (SandboxDied, SandboxClosed, SandboxNotFound) as exc:
        raise SandboxUnavailableError(str(exc)) from exc


def _builtin_error(exc: SandboxFileError, file: str) -> OSError:
    """The builtin exception inspect's callers expect for a failed file operation."""
    kinds: dict[FileErrorReason, tuple[type[OSError], int]] = {
        FileErrorReason.NOT_FOUND: (FileNotFoundError, errno.ENOENT),
        FileErrorReason.IS_A_DIRECTORY: (IsADirectoryError, errno.EISDIR),
        FileErrorReason.NOT_A_DIRECTORY: (NotADirectoryError, errno.ENOTDIR),
        FileErrorReason.PERMISSION: (PermissionError, errno.EACCES),
    }
    kind, code = kinds.get(exc.reason, (OSError, errno.EIO))
    return kind(code, str(exc), file)


# -- the sessions of running tasks -------------------------------------------------------


class _Keeper:
    """Opens a Session, holds it open until :meth:`close`, and closes it: in one task of
    its own, as a Session requires."""

    def __init__(self, config: AsyncSandboxConfig) -> None:
        self.config = config
        self._session: Session | None = None
        self._error: BaseException | None = None
        self._opened = anyio.Event()
        self._closing = anyio.Event()
        self._closed = anyio.Event()

    @property
    def session(self) -> Session:
        if self._session is None:
            raise SandboxUnavailableError("the task's asyncsandbox session is closed")
        return self._session

    async def open(self) -> None:
        _spawn(self._hold)
        await self._opened.wait()
        if self._error is not None:
            raise self._error

    async def close(self) -> None:
        self._closing.set()
        with anyio.CancelScope(shield=True):  # the session's own close is bounded
            await self._closed.wait()
        if self._error is not None:
            raise self._error

    async def _hold(self) -> None:
        config = self.config
        try:
            defaults = SandboxDefaults(**config.defaults)
            async with Session(
                config.backend,
                backend_options=config.backend_options,
                defaults=defaults,
                limits=Limits(max_live=config.max_live) if config.max_live else Limits(),
            ) as session:
                self._session = session
                self._opened.set()
                await self._closing.wait()
        except Exception as exc:  # noqa: BLE001 - handed to whoever waits on open or close
            self._error = exc
        finally:
            self._session = None
            self._opened.set()
            self._closed.set()


_keepers: dict[tuple[object, str], _Keeper] = {}


def _key(config: AsyncSandboxConfig) -> tuple[object, str]:
    # One session per event loop and config: tests run tasks on asyncio and trio in turn.
    return (anyio.lowlevel.current_token(), config.model_dump_json())


async def _keeper(config: AsyncSandboxConfig) -> _Keeper:
    key = _key(config)
    keeper = _keepers.get(key)
    if keeper is None:
        keeper = _keepers[key] = _Keeper(config)
        try:
            await keeper.open()
        except BaseException:
            del _keepers[key]
            raise
    else:
        await keeper._opened.wait()
        keeper.session  # noqa: B018 - raises if it failed to open
    return keeper


def _spawn(hold: Callable[[], Coroutine[Any, Any, None]]) -> None:
    """Run ``hold`` in a task that outlives the caller's scopes (anyio has no such call)."""
    if sniffio.current_async_library() == "trio":
        import trio

        trio.lowlevel.spawn_system_task(hold)
    else:
        task = asyncio.get_running_loop().create_task(hold())
        _tasks.add(task)
        task.add_done_callback(_tasks.discard)


_tasks: set[asyncio.Task[None]] = set()


def _resolve_config(config: SandboxEnvironmentConfigType | None) -> AsyncSandboxConfig:
    if config is None:
        return AsyncSandboxConfig()
    if isinstance(config, AsyncSandboxConfig):
        return config
    if isinstance(config, str):
        loaded = yaml.safe_load(Path(config).read_text()) or {}
        if not isinstance(loaded, dict):
            raise TypeError(f"{config}: expected a mapping of AsyncSandboxConfig fields")
        return AsyncSandboxConfig(**loaded)
    if isinstance(config, BaseModel):
        return AsyncSandboxConfig(**config.model_dump())
    raise TypeError(f"unsupported asyncsandbox config: {config!r}")


def _cleanup_backend() -> str:
    return os.environ.get("ASYNCSANDBOX_INSPECT_BACKEND", "process")
