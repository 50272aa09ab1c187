"""The handlers of commands and code (``exec``, ``exec_stream``, ``run_code``, code
contexts, ``cancel_exec``): one method per operation of :data:`~._openapi.OPERATIONS`, by
its name, through the server's state (:mod:`._serverstate`). They answer errors by raising
them; the application (:mod:`._app`) turns what they raise into answers.

**Cancellation.** Exec requests watch for the client's disconnect and cancel the command,
and ``DELETE .../execs/{exec_id}`` cancels it by id and answers once the process tree is
gone; the runtime kills the tree in both cases. A command's own ``timeout`` is enforced
here too (by the server's Session), so a client whose command times out needs no request
to kill it.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any, TypeVar

import anyio
from starlette.requests import Request
from starlette.responses import Response
from starlette.types import Receive, Scope, Send

from asyncsandbox import ExecResult, ExecTimeout, OutputChunk, SandboxError
from asyncsandbox.log import get_logger

from . import _wire as w
from ._errors import HttpError, error_for
from ._serverstate import ServerState
from ._streaming import Streamed, decode, json_response, start_response, until_disconnect
from ._tenancy import Record, TenantState

__all__ = ("ExecHandlers",)

log = get_logger("asyncsandbox.remote")

T = TypeVar("T")


class ExecHandlers:
    """The command and code handlers of one server (see the module docstring)."""

    def __init__(self, server: ServerState) -> None:
        self.server = server
        self.config = server.config
        self.tenancy = server.tenancy
        self.metrics = server.metrics

    # -- commands -------------------------------------------------------------

    async def exec(self, request: Request) -> Response:
        tenant = self.tenancy.authenticate(request)
        record = self.tenancy.record(tenant, request.path_params["sandbox_id"])
        body = await decode(request, w.EXEC, self.config.max_request_bytes)
        result: ExecResult | None = None

        async def work() -> None:
            nonlocal result
            try:
                result = await record.sandbox.exec(
                    body.argv,
                    cwd=body.cwd,
                    env=body.env,
                    stdin=body.stdin,
                    timeout=body.timeout,
                    max_output_bytes=body.max_output_bytes,
                )
            except ExecTimeout as exc:
                result = exc.result

        async with self.tenancy.use(tenant, record, exec_id=body.exec_id) as activity:
            with activity.scope:
                if await until_disconnect(request.receive, work):
                    self.metrics.disconnect_kills += 1
                    log.info("remote.exec.disconnected", sandbox_id=record.id)
        if result is None:
            raise HttpError(409, "exec_cancelled", "the command was cancelled")
        return json_response(w.EXEC_RESPONSE, _exec_response(result))

    async def exec_stream(self, request: Request) -> Response:
        tenant = self.tenancy.authenticate(request)
        record = self.tenancy.record(tenant, request.path_params["sandbox_id"])
        body = await decode(request, w.EXEC, self.config.max_request_bytes)
        ping = self.config.ping_interval

        async def run(scope: Scope, receive: Receive, send: Send) -> None:
            answer = _Frames(send, w.FRAME)

            async def work() -> None:
                try:
                    async with record.sandbox.exec_stream(
                        body.argv,
                        cwd=body.cwd,
                        env=body.env,
                        stdin=body.stdin,
                        timeout=body.timeout,
                        max_output_bytes=1,  # output goes out as frames; keep none here
                    ) as stream:
                        await answer.start()  # the command started: 200, then its frames
                        await answer.relay(stream, ping, _output_frame)
                        try:
                            result = await stream.wait()
                        except ExecTimeout as exc:
                            result = exc.result
                    await answer.emit(
                        w.ExitFrame(
                            returncode=result.returncode,
                            signal=result.signal,
                            oom_killed=result.oom_killed,
                            timed_out=result.timed_out,
                            duration=result.duration,
                            stdout_size=result.stdout_size,
                            stderr_size=result.stderr_size,
                            cpu_time=result.cpu_time,
                        )
                    )
                except SandboxError as exc:
                    await answer.fail(error_for(exc, record.id))

            await self._streamed(
                answer, work, tenant, record, scope, receive, what="exec", exec_id=body.exec_id
            )

        return Streamed(run)

    # -- the code interpreter -------------------------------------------------

    async def run_code(self, request: Request) -> Response:
        tenant = self.tenancy.authenticate(request)
        record = self.tenancy.record(tenant, request.path_params["sandbox_id"])
        body = await decode(request, w.CODE_REQUEST, self.config.max_request_bytes)
        ping = self.config.ping_interval

        async def run(scope: Scope, receive: Receive, send: Send) -> None:
            # The answer starts with its first frame: an error before any (an unknown
            # context, a sandbox without python3) still gets its status.
            answer = _Frames(send, w.CODE_FRAME)

            async def work() -> None:
                try:
                    async with record.sandbox.run_code_stream(
                        body.code,
                        context=body.context,
                        timeout=body.timeout,
                        env=body.env,
                        max_output_bytes=body.max_output_bytes,
                    ) as stream:
                        await answer.relay(stream, ping, lambda event: event)
                        try:
                            execution = await stream.wait()
                        except ExecTimeout as exc:
                            if exc.execution is None:  # not the code's own: cannot be
                                raise
                            execution = exc.execution
                    await answer.emit(w.CodeEndFrame(execution=execution))
                except SandboxError as exc:
                    await answer.fail(error_for(exc, record.id))

            # Disconnected: the code was interrupted (the runtime does it as it cancels).
            await self._streamed(answer, work, tenant, record, scope, receive, what="run_code")

        return Streamed(run)

    async def _streamed(
        self,
        answer: _Frames,
        work: Callable[[], Awaitable[None]],
        tenant: TenantState,
        record: Record,
        scope: Scope,
        receive: Receive,
        *,
        what: str,
        exec_id: str | None = None,
    ) -> None:
        """Run ``work``, which answers through ``answer``, as one operation of the tenant
        on ``record`` (cancelled by ``cancel_exec`` under ``exec_id``, or by the client's
        disconnect), then end the answer."""
        try:
            async with self.tenancy.use(tenant, record, exec_id=exec_id) as activity:
                with activity.scope:
                    if await until_disconnect(receive, work):
                        self.metrics.disconnect_kills += 1
                        log.info(f"remote.{what}.disconnected", sandbox_id=record.id)
                        return
                if activity.scope.cancelled_caught:
                    noun = "command" if what == "exec" else "code"
                    await answer.fail(HttpError(409, "exec_cancelled", f"the {noun} was cancelled"))
        except HttpError as exc:
            answer.failure = exc
        await answer.end(scope, receive)

    async def create_code_context(self, request: Request) -> Response:
        tenant = self.tenancy.authenticate(request)
        record = self.tenancy.record(tenant, request.path_params["sandbox_id"])
        body = await decode(request, w.NEW_CONTEXT, self.config.max_request_bytes)
        async with self.tenancy.use(tenant, record):
            context = await record.sandbox.create_code_context(cwd=body.cwd, language=body.language)
        return json_response(w.CONTEXT, context, status=201)

    async def list_code_contexts(self, request: Request) -> Response:
        tenant = self.tenancy.authenticate(request)
        record = self.tenancy.record(tenant, request.path_params["sandbox_id"])
        contexts = await record.sandbox.list_code_contexts()
        return json_response(w.CONTEXTS, w.CodeContextList(items=contexts))

    async def restart_code_context(self, request: Request) -> Response:
        tenant = self.tenancy.authenticate(request)
        record = self.tenancy.record(tenant, request.path_params["sandbox_id"])
        async with self.tenancy.use(tenant, record):
            await record.sandbox.restart_code_context(request.path_params["context_id"])
        return Response(status_code=204)

    async def remove_code_context(self, request: Request) -> Response:
        tenant = self.tenancy.authenticate(request)
        record = self.tenancy.record(tenant, request.path_params["sandbox_id"])
        async with self.tenancy.use(tenant, record):
            await record.sandbox.remove_code_context(request.path_params["context_id"])
        return Response(status_code=204)

    async def cancel_exec(self, request: Request) -> Response:
        tenant = self.tenancy.authenticate(request)
        record = self.tenancy.record(tenant, request.path_params["sandbox_id"])
        exec_id = request.path_params["exec_id"]
        activity = record.execs.get(exec_id)
        if activity is None:
            record.cancelled_execs.append(exec_id)  # refuse it if it arrives later
        else:
            activity.scope.cancel()
            # The runtime kills the process tree before the cancellation completes.
            with anyio.move_on_after(self.config.timeouts.cleanup):
                await activity.done.wait()
        return Response(status_code=204)


class _Frames:
    """One streamed answer of NDJSON frames: its status (200) goes out at :meth:`start`
    or with the first frame; a failure before that gets its own status, one after it is
    the answer's last frame (an error frame)."""

    def __init__(self, send: Send, codec: w.Codec[Any]) -> None:
        self._send = send
        self._codec = codec
        self.started = False
        self.failure: HttpError | None = None

    async def start(self) -> None:
        if not self.started:
            await start_response(self._send, "application/x-ndjson")
            self.started = True

    async def emit(self, frame: w.ExecFrame | w.CodeFrame) -> None:
        await self.start()
        line = self._codec.encode(frame) + b"\n"
        await self._send({"type": "http.response.body", "body": line, "more_body": True})

    async def relay(
        self,
        items: AsyncIterator[T],
        ping: float,
        frame: Callable[[T], w.ExecFrame | w.CodeFrame],
    ) -> None:
        """A frame of each item as it comes, and a ping frame after every ``ping`` seconds
        without one (a quiet command is not a dead link)."""
        while True:
            with anyio.move_on_after(ping) as quiet:
                try:
                    item = await items.__anext__()
                except StopAsyncIteration:
                    return
            await self.emit(w.PingFrame() if quiet.cancelled_caught else frame(item))

    async def fail(self, failure: HttpError) -> None:
        self.failure = failure
        if self.started:
            await self.emit(w.ErrorFrame(error=failure.body))

    async def end(self, scope: Scope, receive: Receive) -> None:
        if self.started:
            await self._send({"type": "http.response.body", "body": b"", "more_body": False})
        elif self.failure is not None:
            await self.failure.response()(scope, receive, self._send)


def _output_frame(chunk: OutputChunk) -> w.OutputFrame:
    return w.OutputFrame(stream=chunk.stream, data=chunk.data)


def _exec_response(result: ExecResult) -> w.ExecResponse:
    return w.ExecResponse(
        returncode=result.returncode,
        stdout=result.stdout,
        stderr=result.stderr,
        duration=result.duration,
        timed_out=result.timed_out,
        stdout_truncated=result.stdout_truncated,
        stderr_truncated=result.stderr_truncated,
        stdout_size=result.stdout_size,
        stderr_size=result.stderr_size,
        signal=result.signal,
        oom_killed=result.oom_killed,
        cpu_time=result.cpu_time,
    )
