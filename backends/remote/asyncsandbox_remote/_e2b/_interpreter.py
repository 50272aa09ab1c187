"""E2B's code interpreter (a sandbox's port 49999, ``e2b-code-interpreter``), served by
asyncsandbox's own (:meth:`Sandbox.run_code` and its contexts).

Routes, as E2B's interpreter server (``template/server/main.py`` of e2b-dev/code-interpreter)
answers them: ``POST /execute`` ``{code, context_id, language, env_vars}`` streams NDJSON
lines (``stdout``/``stderr`` ``{text, timestamp}``, ``result`` with one field per format,
images base64, ``error`` ``{name, value, traceback}``, ``number_of_executions``,
``keepalive`` while the code is quiet, and last ``end_of_execution``); ``POST /contexts``
``{language, cwd}``, ``GET /contexts``, ``POST /contexts/{id}/restart``, ``DELETE
/contexts/{id}``; ``GET /health``. Errors are plain text, as there (the SDK shows the text:
404 is its ``NotFoundException``, another status its ``SandboxException``).

The SDK's ``timeout`` is its own deadline on the answer: at its end it goes away, and so
does any client that disconnects; the code is then interrupted (killed if it ignores the
interrupt, its context restarted), as E2B's server interrupts its kernel. A sandbox that
ends under a running call (killed, or at its timeout) ends the answer without its last
line, as a sandbox that vanishes does: the SDK then finds it not running and says so.
"""

from __future__ import annotations

import base64
import datetime
from collections.abc import Awaitable, Callable
from typing import Any

import anyio
import msgspec
from starlette.requests import ClientDisconnect, Request
from starlette.responses import PlainTextResponse, Response
from starlette.types import Receive, Scope, Send

from asyncsandbox import (
    CodeContext,
    ExecTimeout,
    Execution,
    ExecutionError,
    InvalidArgument,
    OutputMessage,
    Result,
    Sandbox,
    SandboxError,
)

from .._errors import HttpError, error_for
from .._streaming import read_body, start_response, until_disconnect
from ._state import E2bSandbox

__all__ = ("Interpreter",)

LANGUAGES = {"": "python", "python": "python", "js": "javascript", "ts": "typescript"}
"""E2B's spellings of a language (``normalize_language``); only python is run."""
KEEPALIVE = 5.0
"""Seconds of quiet after which a ``keepalive`` line is sent (E2B's interval)."""
MAX_BODY = 16 * 1024 * 1024


class ExecuteBody(msgspec.Struct, forbid_unknown_fields=False):
    """``POST /execute`` (E2B's ``ExecutionRequest``)."""

    code: str
    context_id: str | None = None
    language: str | None = None
    env_vars: dict[str, str] | None = None


class ContextBody(msgspec.Struct, forbid_unknown_fields=False):
    """``POST /contexts`` (E2B's ``CreateContext``)."""

    cwd: str | None = None
    language: str | None = None


class _Refused(Exception):
    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


class Interpreter:
    """The interpreter routes of one server (see the module docstring)."""

    def __init__(self, *, keepalive: float = KEEPALIVE) -> None:
        self.keepalive = keepalive

    async def __call__(
        self, scope: Scope, receive: Receive, send: Send, sandbox: E2bSandbox
    ) -> None:
        path: str = scope["path"]
        method: str = scope["method"]
        request = Request(scope, receive)
        try:
            if path == "/execute" and method == "POST":
                await self._execute(request, send, sandbox)
                return
            if path == "/health" and method == "GET":
                response: Response = Response(b'"OK"', media_type="application/json")
            elif path == "/contexts" and method == "POST":
                response = await self._create(request, sandbox)
            elif path == "/contexts" and method == "GET":
                response = await self._list(sandbox)
            elif path.startswith("/contexts/"):
                response = await self._context(path, method, sandbox)
            else:
                raise _Refused(404, f"Not Found: {path[:200]}")
        except _Refused as exc:
            response = PlainTextResponse(str(exc), status_code=exc.status)
        except ClientDisconnect:
            return  # before its request was read: nothing was started
        await response(scope, receive, send)

    # -- contexts -------------------------------------------------------------------------

    async def _create(self, request: Request, sandbox: E2bSandbox) -> Response:
        body = await _decode(request, ContextBody)
        _language(body.language)
        target = _target(sandbox)
        try:
            context = await target.create_code_context(cwd=body.cwd or None)
        except (InvalidArgument, SandboxError) as exc:
            raise _failure(exc) from None
        return Response(msgspec.json.encode(_context(context)), media_type="application/json")

    async def _list(self, sandbox: E2bSandbox) -> Response:
        try:
            contexts = await _target(sandbox).list_code_contexts()
        except SandboxError as exc:
            raise _failure(exc) from None
        return Response(
            msgspec.json.encode([_context(c) for c in contexts]), media_type="application/json"
        )

    async def _context(self, path: str, method: str, sandbox: E2bSandbox) -> Response:
        context_id, _, action = path[len("/contexts/") :].partition("/")
        if (method, action) not in (("POST", "restart"), ("DELETE", "")):
            raise _Refused(404, f"Not Found: {path[:200]}")
        target = _target(sandbox)
        await _known(sandbox, context_id)
        try:
            if action == "restart":
                await target.restart_code_context(context_id)
            else:
                await target.remove_code_context(context_id)
        except (InvalidArgument, SandboxError) as exc:
            raise _failure(exc) from None
        return Response(b"null", media_type="application/json")

    # -- running code ---------------------------------------------------------------------

    async def _execute(self, request: Request, send: Send, sandbox: E2bSandbox) -> None:
        body = await _decode(request, ExecuteBody)
        if body.context_id and body.language:
            raise _Refused(400, "Only one of context_id or language can be provided")
        context: str | None = None
        if body.context_id:
            await _known(sandbox, body.context_id)
            context = body.context_id
        elif body.language is not None:
            _language(body.language)
        target = _target(sandbox)
        code = _cell(body.code)
        env = dict(body.env_vars or {})
        keepalive = self.keepalive

        async def emit(line: dict[str, Any]) -> None:
            data = msgspec.json.encode(line) + b"\n"
            await send({"type": "http.response.body", "body": data, "more_body": True})

        failure: Exception | None = None

        async def work() -> None:
            nonlocal failure
            errored = False
            try:
                async with target.run_code_stream(code, context=context, env=env) as stream:
                    while True:
                        with anyio.move_on_after(keepalive) as quiet:
                            try:
                                event = await stream.__anext__()
                            except StopAsyncIteration:
                                break
                        if quiet.cancelled_caught:
                            await emit({"type": "keepalive"})
                            continue
                        errored = errored or isinstance(event, ExecutionError)
                        await emit(_line(event))
                    try:
                        execution = await stream.wait()
                    except ExecTimeout as exc:  # no timeout is given: cannot be
                        if exc.execution is None:
                            raise
                        execution = exc.execution
            except (InvalidArgument, SandboxError) as exc:
                failure = exc
                return
            await _finish(emit, execution, errored)

        # The answer starts at once, as E2B's (a stream from its first byte): what fails
        # from here on is a line of it, or, if the sandbox ended, its missing end.
        await start_response(send, "application/x-ndjson")
        if await until_disconnect(request.receive, work):
            return  # the code was interrupted (the runtime does it as it cancels)
        if failure is not None:
            if not sandbox.running:
                # The sandbox ended under the call: end the answer without its last line,
                # as the connection to a vanished sandbox ends.
                raise _SandboxEnded(
                    f"the sandbox {sandbox.id} ended while its code ran ({failure})"
                ) from None
            await emit(_error_line(type(failure).__name__, str(failure)))
            await emit({"type": "end_of_execution"})
        await send({"type": "http.response.body", "body": b"", "more_body": False})


class _SandboxEnded(Exception):
    """Ends an answer without its end (the server closes the connection)."""


async def _finish(
    emit: Callable[[dict[str, Any]], Awaitable[None]], execution: Execution, errored: bool
) -> None:
    if execution.error is not None and not errored:
        await emit(_line(execution.error))
    if execution.execution_count is not None:
        await emit({"type": "number_of_executions", "execution_count": execution.execution_count})
    await emit({"type": "end_of_execution"})


def _line(event: OutputMessage | Result | ExecutionError) -> dict[str, Any]:
    """One NDJSON line of ``/execute`` for an event of ``run_code``."""
    if isinstance(event, OutputMessage):
        # E2B's server sends the kernel's ISO 8601 date (the SDK passes it on as is).
        stamp = datetime.datetime.fromtimestamp(event.timestamp / 1e9, datetime.UTC)
        return {
            "type": "stderr" if event.error else "stdout",
            "text": event.line,
            "timestamp": stamp.isoformat(),
        }
    if isinstance(event, ExecutionError):
        return _error_line(event.name, event.value, event.traceback)
    return _result(event)


def _error_line(name: str, value: str, traceback: str = "") -> dict[str, Any]:
    return {"type": "error", "name": name, "value": value, "traceback": traceback}


def _result(result: Result) -> dict[str, Any]:
    """A result as E2B's server sends it: one field per format (images base64), E2B's own
    ``data`` and ``chart`` from their MIME types, the other MIME types in ``extra``."""
    line: dict[str, Any] = {"type": "result"}
    text = result.text
    if text is not None and len(text) >= 2 and text[0] == text[-1] and text[0] in "'\"":
        text = text[1:-1]  # as E2B's server shows a string: without its quotes
    fields: dict[str, Any] = {
        "text": text,
        "html": result.html,
        "markdown": result.markdown,
        "svg": result.svg,
        "latex": result.latex,
        "json": result.json,
        "javascript": result.javascript,
    }
    for name in ("png", "jpeg", "pdf"):
        raw: bytes | None = getattr(result, name)
        fields[name] = None if raw is None else base64.b64encode(raw).decode()
    extra = dict(result.extra)
    fields["data"] = extra.pop("e2b/data", None)
    fields["chart"] = extra.pop("e2b/chart", None)
    line.update((k, v) for k, v in fields.items() if v is not None)
    line["extra"] = extra
    line["is_main_result"] = result.is_main_result
    return line


def _cell(code: str) -> str:
    """The code as IPython runs a cell: leading blank lines dropped and the first line's
    indentation taken off every line that has it (``leading_indent``). E2B's users indent
    code in triple-quoted strings, and its kernel accepts that."""
    lines = code.splitlines(keepends=True)
    while lines and not lines[0].strip():
        lines.pop(0)
    if not lines:
        return code
    first = lines[0]
    indent = first[: len(first) - len(first.lstrip(" \t"))]
    if not indent:
        return code
    return "".join(line.removeprefix(indent) for line in lines)


def _context(context: CodeContext) -> dict[str, str]:
    return {"id": context.id, "language": context.language, "cwd": context.cwd}


def _language(language: str | None) -> None:
    name = (language or "").strip().lower()
    if LANGUAGES.get(name, name) != "python":
        raise _Refused(
            400,
            f"language {name[:40]!r} is not available: asyncsandbox's code interpreter "
            "runs python only",
        )


def _target(sandbox: E2bSandbox) -> Sandbox:
    record = sandbox.record
    if record is None:
        raise _Refused(502, f"The sandbox {sandbox.id} was not found")
    return record.sandbox


async def _known(sandbox: E2bSandbox, context_id: str) -> None:
    try:
        contexts = await _target(sandbox).list_code_contexts()
    except SandboxError as exc:
        raise _failure(exc) from None
    if context_id not in [c.id for c in contexts]:
        raise _Refused(404, f"Context {context_id[:100]} not found")


async def _decode(request: Request, kind: type[Any]) -> Any:
    try:
        data = await read_body(request, MAX_BODY)
    except HttpError as exc:  # 413, or an invalid Content-Length
        raise _Refused(exc.status, exc.body.message) from None
    try:
        return msgspec.json.decode(data or b"{}", type=kind)
    except msgspec.DecodeError as exc:
        raise _Refused(400, f"invalid request body: {exc}") from None


def _failure(exc: Exception) -> _Refused:
    if isinstance(exc, InvalidArgument):
        return _Refused(400, str(exc))
    answer = error_for(exc) if isinstance(exc, SandboxError) else None
    if answer is None:
        return _Refused(500, "internal error")
    status = 502 if answer.status == 410 else answer.status
    return _Refused(status, f"{type(exc).__name__}: {answer.body.message}")
