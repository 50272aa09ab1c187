"""One E2B sandbox as an asyncsandbox :class:`~asyncsandbox.abc.SandboxHandle`.

* **Commands** are envd ``Start`` calls of the shepherd (``_shepherd.py``), which owns the
  command's process tree; stdin is a file uploaded first (the shepherd opens and unlinks
  it), so every command costs one request more only when it has stdin. Output arrives as
  envd's data events. Cancelling (the runtime's timeout included) sends ``SIGTERM`` to
  the shepherd, which kills the tree and exits; its end event confirms it, and ``SIGKILL``
  follows if it does not come. The events are read by a task of their own in a shielded
  scope, so that a cancellation never cuts a read short (httpx then drops the
  connection) and the end can still be received.
* **Files** are envd's ``/files``; directories are tar files in the sandbox's ``/tmp``
  moved through ``/files`` and packed or unpacked by ``tar`` in the sandbox.
* The backend's own small commands (``mkdir``, ``chmod``, ``tar``) run without the
  shepherd.
"""

from __future__ import annotations

import secrets
from collections.abc import AsyncGenerator, AsyncIterable, AsyncIterator, Callable, Mapping
from contextlib import aclosing, asynccontextmanager, suppress
from datetime import datetime
from pathlib import Path
from typing import Any, Protocol, cast

import anyio
import httpx
import msgspec
from anyio import TypedAttributeSet, typed_attribute

from asyncsandbox import (
    BackendUnavailable,
    FileErrorReason,
    InfrastructureError,
    LaunchError,
    SandboxDied,
    SandboxError,
    SandboxFileError,
    SandboxInfo,
    SandboxNotFound,
    SandboxStatus,
    Timeouts,
)
from asyncsandbox.abc import ExitStatus, OutputCallback, SandboxHandle
from asyncsandbox.log import get_logger

from ._errors import ConnectFailure, connect_error, file_error, launch_error, transport_error
from ._transport import Envd, Messages, decode
from ._wire import (
    EndEvent,
    ListedSandbox,
    ProcessConfig,
    SandboxDetail,
    SendSignal,
    StartRequest,
    StartResponse,
    pid_selector,
)

__all__ = ("E2bAttributes", "E2bSandbox", "Owner", "sandbox_info")

log = get_logger("asyncsandbox.e2b")

SHEPHERD = Path(__file__).with_name("_shepherd.py").read_text()
SHEPHERD_GRACE = 2.0
"""The shepherd kills a command this long after its timeout by itself: for a client that
vanished (the client's own deadline comes first and kills it through the shepherd)."""
TIMEOUT_GRACE = 1.0
"""How long past a command's timeout an exec waits for the runtime's cancellation when
the shepherd's kill arrived first (its status would otherwise pass for the command's)."""
SIGNALS = {"killed": 9, "terminated": 15, "interrupt": 2, "hangup": 1, "aborted": 6}
STATUSES = {"running": SandboxStatus.RUNNING, "paused": SandboxStatus.STOPPED}
CHUNK = 1 << 20
TMP = "/tmp/.asyncsandbox"
DEFAULT_MODE = 0o644
"""The mode envd gives a file it creates (``/files``): a write with another one chmods."""

# The backend's own scripts ($1... are their arguments; LC_ALL=C keeps messages parseable).
PREPARE = (
    'command -v python3 >/dev/null 2>&1 || { echo "python3 is missing" >&2; exit 90; }; '
    'mkdir -p -- "$1" 2>/dev/null && [ -w "$1" ] || exit 91'
)
PREPARE_AS_ROOT = 'mkdir -p -- "$1" && chown -- "$2" "$1"'
CHMOD = 'chmod "$2" -- "$1"'
PUT_ARCHIVE = (
    'mkdir -p -- "$1" && tar -x -f "$2" -C "$1" --no-same-owner --no-overwrite-dir; '
    's=$?; rm -f -- "$2"; exit $s'
)
GET_ARCHIVE = (
    '[ -e "$1" ] || [ -L "$1" ] || exit 22; '
    'cd -- "$(dirname -- "$1")" && exec tar -c -f "$2" -- "$(basename -- "$1")"'
)


class E2bAttributes(TypedAttributeSet):
    """Typed attributes of E2B sandboxes (``sandbox.extra(E2bAttributes.template)``)."""

    template: str = typed_attribute()
    """The template (or snapshot) the sandbox was created from."""
    envd_url: str = typed_attribute()
    """Where its envd is reached (with the ``E2b-Sandbox-Id`` header)."""
    api_url: str = typed_attribute()
    """The E2B API it belongs to."""


def _timestamp(value: str) -> float | None:
    if not value:
        return None
    try:
        return datetime.fromisoformat(value).timestamp()
    except ValueError:
        return None


def sandbox_info(item: ListedSandbox) -> SandboxInfo:
    """A sandbox of the control plane's answers as asyncsandbox describes it."""
    return SandboxInfo(
        id=item.sandbox_id,
        status=STATUSES.get(item.state, SandboxStatus.DEAD),
        labels=dict(item.metadata or {}),
        image=item.template_id or None,
        created_at=_timestamp(item.started_at),
        backend="e2b",
    )


def exit_status(end: EndEvent) -> ExitStatus:
    """How envd says a process ended, as an exit status (or the error that it never ran)."""
    if end.exited:
        return ExitStatus(returncode=end.exit_code & 0xFF)
    if end.status.startswith("signal:"):
        number = SIGNALS.get(end.status.partition(":")[2].strip(), 9)
        return ExitStatus(returncode=128 + number, signal=number)
    error = end.error or end.status or "no exit status"
    if (launch := launch_error(error)) is not None:
        raise launch
    raise InfrastructureError(f"the E2B sandbox could not run the command: {error}")


class _Process:
    """One ``Start`` call's events, read by :meth:`read` in a task of its own (see the
    module docstring)."""

    def __init__(self, messages: Messages, on_output: OutputCallback | None) -> None:
        self._messages = messages
        self._on_output = on_output
        self.scope = anyio.CancelScope(shield=True)
        self.started = anyio.Event()
        """The pid is known, or the stream is over."""
        self.done = anyio.Event()
        self.pid: int | None = None
        self.end: EndEvent | None = None
        self.error: Exception | None = None
        self.stdout = bytearray()
        self.stderr = bytearray()

    async def read(self) -> None:
        with self.scope:
            try:
                async for raw in self._messages:
                    event = decode(raw, StartResponse, "exec").event
                    if event is None:
                        continue
                    if event.start is not None:
                        self.pid = event.start.pid
                        self.started.set()
                    elif event.data is not None:
                        await self._deliver(event.data.stdout, event.data.stderr)
                    elif event.end is not None:
                        self.end = event.end
            except Exception as exc:  # noqa: BLE001 - raised by the exec, in its own task
                if self.end is None:
                    self.error = exc
        self.started.set()
        self.done.set()

    async def _deliver(self, stdout: bytes | None, stderr: bytes | None) -> None:
        if self._on_output is None:  # the backend's own script: keep its output
            self.stdout += stdout or b""
            self.stderr += stderr or b""
            return
        if stdout:
            await self._on_output("stdout", stdout)
        if stderr:
            await self._on_output("stderr", stderr)


class Owner(Protocol):
    """What a sandbox asks of the backend that made it (:class:`E2bBackend`, which
    imports this module: the sandbox knows it by this shape only)."""

    api_url: str
    timeouts: Timeouts

    async def detail(self, sandbox_id: str) -> SandboxDetail: ...

    async def kill(self, sandbox_id: str) -> None: ...

    async def snapshot_of(self, sandbox_id: str) -> str: ...


class E2bSandbox(SandboxHandle):
    """One sandbox of an E2B-compatible API (see the module docstring)."""

    def __init__(
        self,
        backend: Owner,
        envd: Envd,
        *,
        template: str,
        user: str,
        labels: Mapping[str, str],
        created_at: float | None,
    ) -> None:
        self._backend = backend
        self._envd = envd
        self._id = envd.sandbox_id
        self._template = template
        self._user = user
        self._labels = dict(labels)
        self._created_at = created_at

    def __repr__(self) -> str:
        return f"<E2bSandbox {self._id} template={self._template!r}>"

    @property
    def id(self) -> str:
        return self._id

    @property
    def extra_attributes(self) -> Mapping[Any, Callable[[], Any]]:
        return {
            E2bAttributes.template: lambda: self._template,
            E2bAttributes.envd_url: lambda: self._envd.url,
            E2bAttributes.api_url: lambda: self._backend.api_url,
        }

    # -- commands ---------------------------------------------------------------------

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
        deadline = None if timeout is None else anyio.current_time() + timeout
        stdin_path = "-"
        if stdin:
            stdin_path = f"{TMP}-stdin-{secrets.token_hex(8)}"
            await self._upload(stdin_path, stdin, what="exec (stdin)")
        shepherd_deadline = "-" if timeout is None else f"{timeout + SHEPHERD_GRACE:.3f}"
        config = ProcessConfig(
            cmd="python3",
            args=["-I", "-S", "-c", SHEPHERD, shepherd_deadline, stdin_path, cwd, *argv],
            envs=dict(env),
        )
        started = False
        try:
            process = await self._start(config, on_output, what="exec")
            started = process.pid is not None
        finally:
            if stdin_path != "-" and not started:
                # The shepherd never ran, so nobody removed the stdin file: we do.
                with (
                    anyio.CancelScope(shield=True),
                    anyio.move_on_after(self._cleanup),
                    suppress(SandboxError),
                ):
                    await self._script(("rm", "-f", "--", stdin_path), what="exec (stdin)")
        assert process.end is not None
        status = exit_status(process.end)
        if deadline is not None and anyio.current_time() >= deadline:
            # The shepherd's own kill at the timeout came first: the runtime's
            # cancellation (the command's timeout) is on its way; a status returned now
            # would pass for the command's own end.
            with anyio.move_on_after(TIMEOUT_GRACE):
                await anyio.sleep_forever()
        return status

    @property
    def _cleanup(self) -> float:
        return self._backend.timeouts.cleanup

    async def _start(
        self,
        config: ProcessConfig,
        on_output: OutputCallback | None,
        *,
        what: str,
        envd: Envd | None = None,
    ) -> _Process:
        """Start a process and wait for its end (the end event is on the result); kill it
        if cancelled. Raise the asyncsandbox error for a stream that ended without it."""
        body = msgspec.json.encode(StartRequest(process=config, stdin=False))
        envd = envd or self._envd
        try:
            async with envd.stream("process.Process/Start", body, what=what) as messages:
                process = _Process(messages, on_output)
                async with anyio.create_task_group() as tg:
                    tg.start_soon(process.read)
                    try:
                        await process.done.wait()
                    except anyio.get_cancelled_exc_class():
                        confirmed = await self._stop(envd, process)
                        if not confirmed:
                            # Not the cancellation: it would pass the command off as
                            # killed (and its timeout as its own outcome).
                            raise BackendUnavailable(
                                f"the E2B sandbox {self._id} did not confirm that the "
                                "command was killed; it may still run",
                                retryable=False,
                            ) from None
                        raise
        except ConnectFailure as failure:
            # The start itself was refused (no stream).
            if "starting process" in failure.message:
                raise LaunchError(
                    f"envd could not start the command: {failure.message}", retryable=True
                ) from None
            raise await self._meaning(failure, what) from None
        if process.end is not None:
            return process
        error = process.error or InfrastructureError(f"envd ended {what} without its end")
        if process.pid is not None:
            await self._stop(envd, process)  # the link broke while it may run: kill it
        if isinstance(error, ConnectFailure):
            raise await self._meaning(error, what) from None
        if isinstance(error, BackendUnavailable):
            raise await self._gone_or(error) from error.__cause__
        raise error

    async def _stop(self, envd: Envd, process: _Process) -> bool:
        """Kill a process whose exec is cancelled and wait until it is gone (shielded,
        bounded by ``Timeouts.cleanup``); whether its end was seen (or it never started).
        The shepherd gets ``SIGTERM`` (it kills the tree) and half of what is left of the
        deadline before ``SIGKILL``."""
        with anyio.CancelScope(shield=True):
            with anyio.move_on_after(self._cleanup) as scope:
                await process.started.wait()  # a start on its way: wait for its pid
                pid = process.pid
                if pid is not None and not process.done.is_set():
                    await self._signal(envd, pid, "SIGNAL_SIGTERM")
                    with anyio.move_on_after((scope.deadline - anyio.current_time()) / 2):
                        await process.done.wait()
                    if not process.done.is_set():
                        await self._signal(envd, pid, "SIGNAL_SIGKILL")
                        await process.done.wait()
            process.scope.cancel()
        return process.pid is None or process.end is not None or process.done.is_set()

    async def _signal(self, envd: Envd, pid: int, signal: str) -> None:
        message = msgspec.json.encode(SendSignal(process=pid_selector(pid), signal=signal))
        try:
            await envd.unary("process.Process/SendSignal", message, what="kill")
        except ConnectFailure as failure:
            if failure.code != "not_found":  # not_found: it ended already
                log.debug("e2b.exec.signal_failed", sandbox=self._id, error=str(failure))
        except SandboxError as exc:
            log.debug("e2b.exec.signal_failed", sandbox=self._id, error=str(exc))

    async def _meaning(self, failure: ConnectFailure, what: str) -> SandboxError:
        error = connect_error(failure, sandbox_id=self._id, what=what)
        if isinstance(error, BackendUnavailable) and failure.code == "unavailable":
            return await self._gone_or(error)
        return error

    async def _gone_or(self, error: SandboxError) -> SandboxError:
        """``SandboxDied`` if the control plane says the sandbox is gone, else ``error``
        (a stream that broke off does not say which)."""
        with anyio.move_on_after(self._cleanup):
            try:
                detail = await self._backend.detail(self._id)
            except SandboxNotFound:
                return SandboxDied(self._id, f"the E2B sandbox is gone ({error})")
            except SandboxError:
                return error
            if detail.state != "running":
                return SandboxDied(self._id, f"the E2B sandbox is {detail.state} ({error})")
        return error

    async def _script(
        self, argv: tuple[str, ...], *, what: str, envd: Envd | None = None
    ) -> tuple[int, str]:
        """Run one of the backend's own commands (no shepherd); its status and stderr."""
        config = ProcessConfig(cmd=argv[0], args=list(argv[1:]), envs={"LC_ALL": "C"})
        process = await self._start(config, None, what=what, envd=envd)
        assert process.end is not None
        status = exit_status(process.end)
        return status.returncode, process.stderr.decode(errors="replace").strip()

    async def sh(
        self, script: str, *args: str, what: str, envd: Envd | None = None
    ) -> tuple[int, str]:
        """``sh -c script sh args...`` (one of the backend's own scripts): its exit status
        and stderr.

        Cancellation: the script is killed (as a command is).
        """
        return await self._script(("/bin/sh", "-c", script, "sh", *args), what=what, envd=envd)

    async def prepare(self, workdir: str) -> None:
        """Make the workdir exist (created by the sandbox's user, else by ``root`` and
        given to the user, where the server offers ``root``); check that ``python3``,
        which runs the shepherd, is there. Raise :class:`~asyncsandbox.LaunchError` if not.

        Cancellation: the backend removes the sandbox (see :meth:`E2bBackend.create`).
        """
        code, detail = await self.sh(PREPARE, workdir, what="create (workdir)")
        if code == 90:
            raise LaunchError(
                f"the E2B template {self._template!r} has no python3, which the e2b backend "
                "needs to run commands (it kills their process trees)",
                retryable=False,
            )
        if code == 0:
            return
        try:
            code, detail = await self.sh(
                PREPARE_AS_ROOT,
                workdir,
                self._user,
                what="create (workdir, as root)",
                envd=self._envd.as_user("root"),
            )
        except SandboxError as exc:
            code, detail = -1, str(exc)
        if code != 0:
            raise LaunchError(
                f"the workdir {workdir} cannot be made in the E2B sandbox, neither by "
                f"{self._user!r} nor by 'root' ({detail}); choose one the sandbox's user "
                "can create (SandboxDefaults(workdir=...), say under /home/user or /tmp)",
                retryable=False,
            )

    # -- files ------------------------------------------------------------------------

    def _params(self, path: str) -> dict[str, str]:
        return {"path": path, "username": self._user}

    async def _upload(self, path: str, content: Any, *, what: str) -> None:
        envd = self._envd
        request = envd.request(
            "POST",
            "/files",
            params=self._params(path),
            content=content,
            headers={"content-type": "application/octet-stream"},
        )
        response = await envd.http.send(request, what=what, origin=envd.url)
        if response.status_code != 200:
            raise file_error(response, path=path, sandbox_id=self._id, what=what)

    @asynccontextmanager
    async def _download(self, path: str, *, what: str) -> AsyncIterator[httpx.Response]:
        envd = self._envd
        request = envd.request(
            "GET", "/files", params=self._params(path), headers={"accept-encoding": "identity"}
        )
        response = await envd.http.send(request, what=what, origin=envd.url, stream=True)
        try:
            if response.status_code != 200:
                try:
                    await response.aread()
                except httpx.HTTPError as exc:
                    raise transport_error(exc, envd.url, what) from exc
                raise file_error(response, path=path, sandbox_id=self._id, what=what)
            yield response
        finally:
            await envd.http.close_response(response)

    async def read_file(self, path: str, *, max_bytes: int) -> bytes:
        async with self._download(path, what="read file") as response:
            size = response.headers.get("content-length", "")
            if size.isdigit() and int(size) > max_bytes:
                raise SandboxFileError(
                    FileErrorReason.TOO_LARGE, path, f"{size} bytes, more than {max_bytes}"
                )
            data = bytearray()
            async with aclosing(_chunks(response, self._envd.url, "read file")) as chunks:
                async for chunk in chunks:
                    data += chunk
                    if len(data) > max_bytes:
                        raise SandboxFileError(
                            FileErrorReason.TOO_LARGE, path, f"more than {max_bytes} bytes"
                        )
            return bytes(data)

    async def write_file(self, path: str, data: bytes, *, mode: int) -> None:
        await self._upload(path, data, what="write file")
        if mode != DEFAULT_MODE:
            code, detail = await self.sh(CHMOD, path, format(mode, "o"), what="write file")
            if code != 0:
                raise SandboxFileError(FileErrorReason.PERMISSION, path, detail[-300:])

    async def put_archive(self, path: str, archive: AsyncIterable[bytes]) -> None:
        staged = f"{TMP}-put-{secrets.token_hex(8)}.tar"
        try:
            await self._upload(staged, _aiter(archive), what="upload")
            code, detail = await self.sh(PUT_ARCHIVE, path, staged, what="upload")
        except BaseException:
            await self._remove_staged(staged)
            raise
        if code != 0:
            raise _tar_error(path, code, detail)

    @asynccontextmanager
    async def get_archive(self, path: str) -> AsyncIterator[AsyncIterator[bytes]]:
        staged = f"{TMP}-get-{secrets.token_hex(8)}.tar"
        try:
            code, detail = await self.sh(GET_ARCHIVE, path, staged, what="download")
            if code != 0:
                raise _tar_error(path, code, detail)
            async with (
                self._download(staged, what="download") as response,
                aclosing(_chunks(response, self._envd.url, "download")) as chunks,
            ):
                yield chunks
        finally:
            await self._remove_staged(staged)

    async def _remove_staged(self, staged: str) -> None:
        # Shielded and bounded: a staged tar file must not be left in the sandbox.
        with (
            anyio.CancelScope(shield=True),
            anyio.move_on_after(self._cleanup),
            suppress(SandboxError),
        ):
            await self._script(("rm", "-f", "--", staged), what="remove staged file")

    # -- lifecycle --------------------------------------------------------------------

    async def inspect(self) -> SandboxInfo:
        return sandbox_info(await self._backend.detail(self._id))

    async def remove(self) -> None:
        await self._backend.kill(self._id)

    async def snapshot(self, *, labels: Mapping[str, str] | None = None) -> str:
        # E2B's snapshots carry no labels (a name at most): one a crashed owner left is
        # not found by gc, and stays the API's until deleted (Backend.list_snapshots: none).
        return await self._backend.snapshot_of(self._id)


def _tar_error(path: str, code: int, detail: str) -> SandboxFileError:
    if code == 22:
        return SandboxFileError(FileErrorReason.NOT_FOUND, path)
    lowered = detail.lower()
    for needle, reason in (
        ("no such file", FileErrorReason.NOT_FOUND),
        ("not a directory", FileErrorReason.NOT_A_DIRECTORY),
        ("file exists", FileErrorReason.NOT_A_DIRECTORY),
        ("permission denied", FileErrorReason.PERMISSION),
        ("read-only", FileErrorReason.PERMISSION),
    ):
        if needle in lowered:
            return SandboxFileError(reason, path, detail[-300:])
    return SandboxFileError(FileErrorReason.OTHER, path, detail[-300:] or f"tar exited {code}")


async def _aiter(chunks: AsyncIterable[bytes]) -> AsyncIterator[bytes]:
    async for chunk in chunks:
        yield chunk


async def _chunks(response: httpx.Response, origin: str, what: str) -> AsyncGenerator[bytes, None]:
    """The body of a download, its transport errors translated."""
    raw = cast(AsyncGenerator[bytes, None], response.aiter_raw(CHUNK))
    try:
        async with aclosing(raw):
            async for chunk in raw:
                yield chunk
    except httpx.HTTPError as exc:
        raise transport_error(exc, origin, what) from exc
