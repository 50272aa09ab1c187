"""One sandbox on the server (:class:`RemoteSandbox`): its commands, code interpreter,
files and state, each a call or a stream through the backend's transport."""

from __future__ import annotations

import builtins
import uuid
from collections.abc import AsyncIterable, AsyncIterator, Callable, Mapping
from contextlib import aclosing, asynccontextmanager
from typing import Any
from urllib.parse import quote

import anyio
import httpx
from anyio import TypedAttributeSet, typed_attribute

from asyncsandbox import (
    BackendUnavailable,
    CodeContext,
    Execution,
    RequestNotSent,
    SandboxError,
    SandboxInfo,
    SandboxNotFound,
    SandboxStatus,
)
from asyncsandbox.abc import (
    CodeEventCallback,
    CodeRequest,
    ExitStatus,
    OutputCallback,
    SandboxHandle,
)
from asyncsandbox.log import get_logger

from . import _wire as w
from ._frames import Chunks, Frames, code_frames
from ._transport import JSON_HEADERS, Api, decode, died, sandbox_path

__all__ = ("BACKEND_NAME", "RemoteAttributes", "RemoteSandbox", "info")

BACKEND_NAME = "remote"
MAX_TIMEOUT = 10 * 365 * 86400.0
"""Longest command timeout the wire takes; a longer one is sent as none (the runtime
enforces it all the same)."""

log = get_logger("asyncsandbox.remote")


class RemoteAttributes(TypedAttributeSet):
    """Typed attributes of remote sandboxes (``sandbox.extra(RemoteAttributes.base_url)``)."""

    base_url: str = typed_attribute()
    """The server the sandbox lives on."""
    server_backend: str = typed_attribute()
    """The backend the server runs it on (``process``, ``docker``, ...)."""


def _status(value: str) -> SandboxStatus:
    try:
        return SandboxStatus(value)
    except ValueError:
        return SandboxStatus.DEAD


def info(item: w.SandboxDescription) -> SandboxInfo:
    """What the server says of a sandbox, as :class:`~asyncsandbox.SandboxInfo`."""
    return SandboxInfo(
        id=item.id,
        status=_status(item.status),
        labels=dict(item.labels),
        image=item.image,
        created_at=item.created_at,
        backend=BACKEND_NAME,
    )


async def _aiter(chunks: AsyncIterable[bytes]) -> AsyncIterator[bytes]:
    async for chunk in chunks:
        yield chunk


class RemoteSandbox(SandboxHandle):
    """One sandbox on the server.

    :param api: the backend's transport.
    :param forget: called with its id once it is removed (its lease is not renewed any
        more)."""

    def __init__(
        self, api: Api, description: w.SandboxDescription, *, forget: Callable[[str], None]
    ) -> None:
        self._api = api
        self._id = description.id
        self._server_backend = description.backend
        self._forget = forget

    @property
    def id(self) -> str:
        return self._id

    @property
    def extra_attributes(self) -> Mapping[Any, Any]:
        return {
            RemoteAttributes.base_url: lambda: self._api.base_url,
            RemoteAttributes.server_backend: lambda: self._server_backend,
        }

    async def exec(
        self,
        argv: tuple[str, ...],
        *,
        cwd: str,
        env: Mapping[str, str],
        stdin: bytes | None,
        on_output: OutputCallback,
        timeout: float | None = None,  # advisory (see the contract)
    ) -> ExitStatus:
        api = self._api
        exec_id = uuid.uuid4().hex
        # The server enforces the command's timeout itself: it kills the process tree and
        # ends the stream with the exit frame, which is all a timed-out command costs.
        deadline = None if timeout is None else anyio.current_time() + timeout
        body = w.EXEC.encode(
            w.ExecRequest(
                argv=list(argv),
                cwd=cwd,
                env=dict(env),
                stdin=stdin,
                timeout=timeout if timeout is not None and timeout <= MAX_TIMEOUT else None,
                exec_id=exec_id,
            )
        )
        frames: Frames | None = None
        over = cancelled = False  # over: the server said the command ended (or never ran)
        try:
            async with api.stream(
                "POST",
                sandbox_path(self._id, "/exec/stream"),
                what="exec",
                sandbox_id=self._id,
                content=body,
                headers=JSON_HEADERS,
                timeout=api.pinged(),
            ) as response:
                frames = Frames(response, on_output, base_url=api.base_url, sandbox_id=self._id)
                async with anyio.create_task_group() as tg:
                    tg.start_soon(frames.read)
                    try:
                        await frames.done.wait()
                    except anyio.get_cancelled_exc_class():
                        await frames.end_at(deadline, cleanup=api.cleanup)
                        raise
                return await frames.outcome()
        except SandboxError as exc:
            # An error answer, or the error the server reported instead of an exit status:
            # the command is over. Only a lost connection leaves it maybe running (not one
            # that was never established: the command was never sent).
            over = isinstance(exc, RequestNotSent) or not isinstance(exc, BackendUnavailable)
            raise died(exc) from exc.__cause__
        except anyio.get_cancelled_exc_class():
            cancelled = True
            raise
        finally:
            if frames is not None and frames.over:
                over = True
            if not over:
                # Cancelled (or the link broke) while the command may run: kill it by id and
                # wait until the server says its process tree is gone (shielded, bounded).
                unconfirmed = await self._kill(exec_id)
                if cancelled and unconfirmed is not None:
                    # Not the cancellation: it would pass the command off as killed (and
                    # its timeout as its own outcome), while it may still run.
                    raise BackendUnavailable(
                        f"the sandbox server at {self._api.base_url} did not confirm that "
                        f"the command was killed ({unconfirmed}); it may still run",
                        retryable=False,
                    )

    async def _kill(self, exec_id: str) -> str | None:
        """Kill a command by its id, shielded and bounded by ``Timeouts.cleanup``: None
        once the server confirmed that its process tree is gone, else why it did not."""
        api = self._api
        with anyio.CancelScope(shield=True), anyio.move_on_after(api.cleanup):
            try:
                await api.call(
                    "DELETE",
                    sandbox_path(self._id, f"/execs/{exec_id}"),
                    what="cancel exec",
                    sandbox_id=self._id,
                )
            except SandboxNotFound:
                return None  # the sandbox is gone, and the command with it
            except SandboxError as exc:
                log.debug("remote.exec.cancel_failed", error=str(exc))
                return str(exc)
            return None
        return "no answer"

    # -- the code interpreter: run where the sandbox is (a CodeInterpreter) ---------------

    async def run_code(self, request: CodeRequest, *, on_event: CodeEventCallback) -> Execution:
        """The whole call on the server (``POST .../code/run``), its events delivered as
        its frames come. The server enforces the timeout (a timed-out execution comes back
        as data); leaving early closes the connection, which interrupts the code there."""
        api = self._api
        try:
            async with api.stream(
                "POST",
                sandbox_path(self._id, "/code/run"),
                what="run_code",
                sandbox_id=self._id,
                content=w.CODE_REQUEST.encode(request),
                headers=JSON_HEADERS,
                timeout=api.pinged(),
            ) as response:
                return await code_frames(
                    response, on_event, base_url=api.base_url, sandbox_id=self._id
                )
        except SandboxError as exc:
            raise died(exc) from exc.__cause__

    async def create_code_context(self, *, cwd: str, language: str) -> CodeContext:
        response = await self._code_call(
            "POST",
            "/code/contexts",
            "create code context",
            content=w.NEW_CONTEXT.encode(w.NewCodeContext(cwd=cwd, language=language)),
        )
        context: CodeContext = decode(w.CONTEXT, response)
        return context

    async def list_code_contexts(self) -> builtins.list[CodeContext]:
        response = await self._code_call("GET", "/code/contexts", "list code contexts")
        listed: w.CodeContextList = decode(w.CONTEXTS, response)
        return listed.items

    async def restart_code_context(self, context_id: str) -> None:
        await self._code_call(
            "POST", f"/code/contexts/{quote(context_id, safe='')}/restart", "restart code context"
        )

    async def remove_code_context(self, context_id: str) -> None:
        await self._code_call(
            "DELETE", f"/code/contexts/{quote(context_id, safe='')}", "remove code context"
        )

    async def _code_call(
        self, method: str, suffix: str, what: str, *, content: bytes | None = None
    ) -> httpx.Response:
        try:
            return await self._api.call(
                method,
                sandbox_path(self._id, suffix),
                what=what,
                sandbox_id=self._id,
                content=content,
                headers=JSON_HEADERS if content is not None else None,
            )
        except SandboxError as exc:
            raise died(exc) from None

    # -- files -------------------------------------------------------------------------

    async def read_file(self, path: str, *, max_bytes: int) -> bytes:
        try:
            response = await self._api.call(
                "GET",
                sandbox_path(self._id, "/files"),
                what="read file",
                sandbox_id=self._id,
                params={"path": path, "max_bytes": max_bytes},
            )
        except SandboxError as exc:
            raise died(exc) from None
        return response.content

    async def write_file(self, path: str, data: bytes, *, mode: int) -> None:
        try:
            await self._api.call(
                "PUT",
                sandbox_path(self._id, "/files"),
                what="write file",
                sandbox_id=self._id,
                params={"path": path, "mode": format(mode, "o")},
                content=data,
                headers={"content-type": "application/octet-stream"},
            )
        except SandboxError as exc:
            raise died(exc) from None

    async def put_archive(self, path: str, archive: AsyncIterable[bytes]) -> None:
        try:
            await self._api.call(
                "PUT",
                sandbox_path(self._id, "/archive"),
                what="upload",
                sandbox_id=self._id,
                params={"path": path},
                content=_aiter(archive),
                headers={"content-type": "application/x-tar"},
            )
        except SandboxError as exc:
            raise died(exc) from None

    @asynccontextmanager
    async def get_archive(self, path: str) -> AsyncIterator[AsyncIterator[bytes]]:
        api = self._api
        try:
            async with (
                api.stream(
                    "GET",
                    sandbox_path(self._id, "/archive"),
                    what="download",
                    sandbox_id=self._id,
                    params={"path": path},
                ) as response,
                aclosing(Chunks(response, self._api.base_url)) as chunks,
            ):
                yield chunks
        except SandboxError as exc:
            raise died(exc) from None

    async def inspect(self) -> SandboxInfo:
        response = await self._api.call(
            "GET", sandbox_path(self._id), what="inspect", sandbox_id=self._id
        )
        return info(decode(w.DESCRIPTION, response))

    async def snapshot(self, *, labels: Mapping[str, str] | None = None) -> str:
        # The server keeps a tenant's snapshots until the tenant deletes them: labels are
        # for backends that list their snapshots for gc, which this one does not.
        # Sent once (a retry would take another snapshot); its answer lost, the snapshot
        # stays the tenant's until the server goes (it is not this session's to delete).
        response = await self._api.call(
            "POST",
            sandbox_path(self._id) + "/snapshot",
            what="snapshot",
            sandbox_id=self._id,
        )
        created: w.SnapshotCreated = decode(w.SNAPSHOT, response)
        return created.id

    async def reset(self) -> None:
        """``POST .../reset``: the server resets the sandbox in place (same id). Where it
        cannot, its answer is :class:`~asyncsandbox.InvalidArgument`; a sandbox it no
        longer has, :class:`~asyncsandbox.SandboxDied`."""
        try:
            await self._api.call(
                "POST",
                sandbox_path(self._id, "/reset"),
                what="reset",
                sandbox_id=self._id,
                timeout=self._api.within(self._api.timeouts.remove),
            )
        except SandboxError as exc:
            raise died(exc) from None

    async def remove(self) -> None:
        try:
            await self._api.call(
                "DELETE",
                sandbox_path(self._id),
                what="remove",
                sandbox_id=self._id,
                timeout=self._api.within(self._api.timeouts.remove),
            )
        except SandboxNotFound:
            pass  # already gone: removing is idempotent
        finally:
            self._forget(self._id)
