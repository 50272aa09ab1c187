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

import anyio
from starlette.requests import Request
from starlette.responses import Response
from starlette.types import Receive, Scope, Send

from asyncsandbox import ExecResult, ExecTimeout, SandboxError
from asyncsandbox.log import get_logger

from . import _wire as w
from ._errors import HttpError, error_for
from ._serverstate import ServerState
from ._streaming import Streamed, decode, json_response, start_response, until_disconnect

__all__ = ("ExecHandlers",)

log = get_logger("asyncsandbox.remote")


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
            started = False
            failure: HttpError | None = None

            async def emit(frame: w.ExecFrame) -> None:
                line = w.FRAME.encode(frame) + b"\n"
                await send({"type": "http.response.body", "body": line, "more_body": True})

            async def work() -> None:
                nonlocal started, failure
                try:
                    async with record.sandbox.exec_stream(
                        body.argv,
                        cwd=body.cwd,
                        env=body.env,
                        stdin=body.stdin,
                        timeout=body.timeout,
                        max_output_bytes=1,  # output goes out as frames; keep none here
                    ) as stream:
                        await start_response(send, "application/x-ndjson")
                        started = True
                        while True:
                            with anyio.move_on_after(ping) as quiet:
                                try:
                                    chunk = await stream.__anext__()
                                except StopAsyncIteration:
                                    break
                            if quiet.cancelled_caught:
                                await emit(w.PingFrame())
                            else:
                                await emit(w.OutputFrame(stream=chunk.stream, data=chunk.data))
                        try:
                            result = await stream.wait()
                        except ExecTimeout as exc:
                            result = exc.result
                    await emit(
                        w.ExitFrame(
                            returncode=result.returncode,
                            signal=result.signal,
                            oom_killed=result.oom_killed,
                            timed_out=result.timed_out,
                            duration=result.duration,
                            stdout_size=result.stdout_size,
                            stderr_size=result.stderr_size,
                        )
                    )
                except SandboxError as exc:
                    failure = error_for(exc, record.id)
                    if started:
                        await emit(w.ErrorFrame(error=failure.body))

            try:
                async with self.tenancy.use(tenant, record, exec_id=body.exec_id) as activity:
                    with activity.scope:
                        if await until_disconnect(receive, work):
                            self.metrics.disconnect_kills += 1
                            log.info("remote.exec.disconnected", sandbox_id=record.id)
                            return
                    if activity.scope.cancelled_caught:
                        failure = HttpError(409, "exec_cancelled", "the command was cancelled")
                        if started:
                            await emit(w.ErrorFrame(error=failure.body))
            except HttpError as exc:
                failure = exc
            if started:
                await send({"type": "http.response.body", "body": b"", "more_body": False})
            elif failure is not None:
                await failure.response()(scope, receive, send)

        return Streamed(run)

    # -- the code interpreter -------------------------------------------------

    async def run_code(self, request: Request) -> Response:
        tenant = self.tenancy.authenticate(request)
        record = self.tenancy.record(tenant, request.path_params["sandbox_id"])
        body = await decode(request, w.CODE_REQUEST, self.config.max_request_bytes)
        ping = self.config.ping_interval

        async def run(scope: Scope, receive: Receive, send: Send) -> None:
            started = False
            failure: HttpError | None = None

            async def emit(frame: w.CodeFrame) -> None:
                # The answer starts with its first frame: an error before any (an unknown
                # context, a sandbox without python3) still gets its status.
                nonlocal started
                if not started:
                    await start_response(send, "application/x-ndjson")
                    started = True
                line = w.CODE_FRAME.encode(frame) + b"\n"
                await send({"type": "http.response.body", "body": line, "more_body": True})

            async def work() -> None:
                nonlocal failure
                try:
                    async with record.sandbox.run_code_stream(
                        body.code,
                        context=body.context,
                        timeout=body.timeout,
                        env=body.env,
                        max_output_bytes=body.max_output_bytes,
                    ) as stream:
                        while True:
                            with anyio.move_on_after(ping) as quiet:
                                try:
                                    event = await stream.__anext__()
                                except StopAsyncIteration:
                                    break
                            await emit(w.PingFrame() if quiet.cancelled_caught else event)
                        try:
                            execution = await stream.wait()
                        except ExecTimeout as exc:
                            if exc.execution is None:  # not the code's own: cannot be
                                raise
                            execution = exc.execution
                    await emit(w.CodeEndFrame(execution=execution))
                except SandboxError as exc:
                    failure = error_for(exc, record.id)
                    if started:
                        await emit(w.ErrorFrame(error=failure.body))

            try:
                async with self.tenancy.use(tenant, record) as activity:
                    with activity.scope:
                        if await until_disconnect(receive, work):
                            # The code was interrupted (the runtime does it as it cancels).
                            self.metrics.disconnect_kills += 1
                            log.info("remote.run_code.disconnected", sandbox_id=record.id)
                            return
                    if activity.scope.cancelled_caught:
                        failure = HttpError(409, "exec_cancelled", "the code was cancelled")
                        if started:
                            await emit(w.ErrorFrame(error=failure.body))
            except HttpError as exc:
                failure = exc
            if started:
                await send({"type": "http.response.body", "body": b"", "more_body": False})
            elif failure is not None:
                await failure.response()(scope, receive, send)

        return Streamed(run)

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
    )
