"""envd's Connect services (``process.Process``, ``filesystem.Filesystem``), served by
the ``connectrpc`` package on the stubs E2B's SDK carries (JSON and binary codecs; the
framing is the package's). The request reached here through :mod:`._router`, which found
its sandbox and checked its access token.

Deadlines: ``Connect-Timeout-Ms`` is enforced here (the clients do not enforce it): a
unary call past it answers DEADLINE_EXCEEDED; a ``Start`` stream past it kills its
process and ends DEADLINE_EXCEEDED; ``Connect`` and ``WatchDir`` streams end so and leave
the process or directory alone. Streams send a keepalive after the client's
``Keepalive-Ping-Interval`` of silence, which is also when a client that left is noticed.
"""

from __future__ import annotations

import math
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any, TypeVar

import anyio
from connectrpc.code import Code
from connectrpc.codec import Codec, proto_binary_codec, proto_json_codec
from connectrpc.errors import ConnectError
from connectrpc.request import RequestContext
from e2b.envd.filesystem import filesystem_pb
from e2b.envd.filesystem.filesystem_connect import FilesystemASGIApplication
from e2b.envd.process import process_pb
from e2b.envd.process.process_connect import ProcessASGIApplication
from protobuf import Oneof

from ._fs import resolve
from ._processes import Proc, follow
from ._state import E2bSandbox

__all__ = ("FilesystemService", "ProcessService", "SandboxOf", "applications")

T = TypeVar("T")
SandboxOf = Callable[[RequestContext[object, object]], E2bSandbox]
DEFAULT_KEEPALIVE = 10.0
READ_MAX_BYTES = 16 * 1024 * 1024


def _deadline(ctx: RequestContext[object, object]) -> float:
    """The request's deadline on anyio's clock (inf without ``Connect-Timeout-Ms``)."""
    remaining = ctx.timeout_ms
    if remaining is None:
        return math.inf
    return anyio.current_time() + max(0.0, remaining) / 1000


def _keepalive(ctx: RequestContext[object, object]) -> float:
    raw = ctx.request_headers.get("keepalive-ping-interval")
    try:
        value = float(raw) if raw else DEFAULT_KEEPALIVE
    except ValueError:
        value = DEFAULT_KEEPALIVE
    return min(max(value, 1.0), 60.0)


async def _bounded(ctx: RequestContext[object, object], call: Awaitable[T]) -> T:
    """``call`` within the request's deadline (DEADLINE_EXCEEDED past it)."""
    deadline = _deadline(ctx)
    result: list[T] = []
    with anyio.move_on_after(deadline - anyio.current_time()):
        result.append(await call)
    if not result:
        raise ConnectError(Code.DEADLINE_EXCEEDED, "the request's deadline was exceeded")
    return result[0]


def _processes(sandbox: E2bSandbox):  # type: ignore[no-untyped-def]
    if sandbox.processes is None:
        raise ConnectError(Code.UNAVAILABLE, f"sandbox {sandbox.id} was not found")
    return sandbox.processes


class ProcessService:
    """``process.Process`` (see the module docstring and :mod:`._processes`)."""

    def __init__(self, sandbox_of: SandboxOf) -> None:
        self._sandbox_of = sandbox_of

    async def list(
        self, request: process_pb.ListRequest, ctx: RequestContext[object, object], /
    ) -> process_pb.ListResponse:
        procs = _processes(self._sandbox_of(ctx)).list()
        return process_pb.ListResponse(processes=[p.info() for p in procs])

    async def start(
        self, request: process_pb.StartRequest, ctx: RequestContext[object, object], /
    ) -> AsyncIterator[process_pb.StartResponse]:
        sandbox = self._sandbox_of(ctx)
        processes = _processes(sandbox)
        config = request.process or process_pb.ProcessConfig()
        deadline = _deadline(ctx)
        config = process_pb.ProcessConfig(
            cmd=config.cmd,
            args=list(config.args),
            envs=dict(config.envs),
            cwd=resolve(config.cwd) if config.has_field("cwd") and config.cwd else None,
        )
        tag = request.tag if request.has_field("tag") else None
        stdin = bool(request.stdin) if request.has_field("stdin") else False
        proc, events = await _bounded(
            ctx, processes.start(config, tag, stdin=stdin, pty=request.pty, deadline=deadline)
        )

        async def kill() -> None:
            with anyio.CancelScope(shield=True):  # the process goes even if we are cancelled
                await processes.kill(proc)

        async for event in follow(
            proc, events, keepalive=_keepalive(ctx), deadline=deadline, on_deadline=kill
        ):
            yield process_pb.StartResponse(event=event)

    async def connect(
        self, request: process_pb.ConnectRequest, ctx: RequestContext[object, object], /
    ) -> AsyncIterator[process_pb.ConnectResponse]:
        proc = _processes(self._sandbox_of(ctx)).find(request.process)
        events = proc.follow()
        start = process_pb.ProcessEvent.StartEvent(pid=proc.pid)
        yield process_pb.ConnectResponse(
            event=process_pb.ProcessEvent(event=Oneof("start", start))  # type: ignore[arg-type]
        )

        async def nothing() -> None:
            pass

        async for event in follow(
            proc, events, keepalive=_keepalive(ctx), deadline=_deadline(ctx), on_deadline=nothing
        ):
            yield process_pb.ConnectResponse(event=event)

    async def update(
        self, request: process_pb.UpdateRequest, ctx: RequestContext[object, object], /
    ) -> process_pb.UpdateResponse:
        processes = _processes(self._sandbox_of(ctx))
        proc = processes.find(request.process)
        size = request.pty.size if request.pty is not None else None
        if size is None:
            raise ConnectError(Code.INVALID_ARGUMENT, "pty.size is required")
        await _bounded(ctx, processes.resize(proc, size.rows, size.cols))
        return process_pb.UpdateResponse()

    async def stream_input(
        self,
        request: AsyncIterator[process_pb.StreamInputRequest],
        ctx: RequestContext[object, object],
        /,
    ) -> process_pb.StreamInputResponse:
        processes = _processes(self._sandbox_of(ctx))
        proc: Proc | None = None
        async for message in request:
            match message.event:
                case Oneof(
                    field="start", value=process_pb.StreamInputRequest.StartEvent() as start
                ):
                    proc = processes.find(start.process)
                case Oneof(field="data", value=process_pb.StreamInputRequest.DataEvent() as data):
                    if proc is None:
                        raise ConnectError(
                            Code.INVALID_ARGUMENT, "the input stream must start with a start event"
                        )
                    await _bounded(ctx, processes.send_input(proc, _input(data.input)))
        return process_pb.StreamInputResponse()

    async def send_input(
        self, request: process_pb.SendInputRequest, ctx: RequestContext[object, object], /
    ) -> process_pb.SendInputResponse:
        processes = _processes(self._sandbox_of(ctx))
        proc = processes.find(request.process)
        await _bounded(ctx, processes.send_input(proc, _input(request.input)))
        return process_pb.SendInputResponse()

    async def send_signal(
        self, request: process_pb.SendSignalRequest, ctx: RequestContext[object, object], /
    ) -> process_pb.SendSignalResponse:
        processes = _processes(self._sandbox_of(ctx))
        proc = processes.find(request.process)
        if request.signal not in (
            process_pb.Signal.SIGKILL,
            process_pb.Signal.SIGTERM,
        ):
            raise ConnectError(Code.INVALID_ARGUMENT, "signal must be SIGKILL or SIGTERM")
        # Both end the whole process tree (SIGKILL): see the module docstring of _processes.
        await _bounded(ctx, processes.kill(proc))
        return process_pb.SendSignalResponse()

    async def close_stdin(
        self, request: process_pb.CloseStdinRequest, ctx: RequestContext[object, object], /
    ) -> process_pb.CloseStdinResponse:
        processes = _processes(self._sandbox_of(ctx))
        processes.close_stdin(processes.find(request.process))
        return process_pb.CloseStdinResponse()


def _input(value: process_pb.ProcessInput | None) -> bytes:
    match value.input if value is not None else None:
        case Oneof(field="stdin", value=data):
            return bytes(data)
        case Oneof(field="pty", value=data):
            return bytes(data)
    raise ConnectError(Code.INVALID_ARGUMENT, "input.stdin or input.pty is required")


class FilesystemService:
    """``filesystem.Filesystem`` (see :mod:`._fs` and :mod:`._watch`)."""

    def __init__(self, sandbox_of: SandboxOf) -> None:
        self._sandbox_of = sandbox_of

    def _parts(self, ctx: RequestContext[object, object]):  # type: ignore[no-untyped-def]
        sandbox = self._sandbox_of(ctx)
        if sandbox.watchers is None or sandbox.fs is None:
            raise ConnectError(Code.UNAVAILABLE, f"sandbox {sandbox.id} was not found")
        return sandbox.fs, sandbox.watchers

    async def stat(
        self, request: filesystem_pb.StatRequest, ctx: RequestContext[object, object], /
    ) -> filesystem_pb.StatResponse:
        fs, _ = self._parts(ctx)
        entry = await _bounded(ctx, fs.stat(resolve(request.path)))
        return filesystem_pb.StatResponse(entry=entry)

    async def make_dir(
        self, request: filesystem_pb.MakeDirRequest, ctx: RequestContext[object, object], /
    ) -> filesystem_pb.MakeDirResponse:
        fs, _ = self._parts(ctx)
        entry = await _bounded(ctx, fs.make_dir(resolve(request.path)))
        return filesystem_pb.MakeDirResponse(entry=entry)

    async def move(
        self, request: filesystem_pb.MoveRequest, ctx: RequestContext[object, object], /
    ) -> filesystem_pb.MoveResponse:
        fs, _ = self._parts(ctx)
        entry = await _bounded(ctx, fs.move(resolve(request.source), resolve(request.destination)))
        return filesystem_pb.MoveResponse(entry=entry)

    async def list_dir(
        self, request: filesystem_pb.ListDirRequest, ctx: RequestContext[object, object], /
    ) -> filesystem_pb.ListDirResponse:
        fs, _ = self._parts(ctx)
        depth = max(1, min(int(request.depth or 1), 64))
        entries = await _bounded(ctx, fs.entries(resolve(request.path), depth))
        return filesystem_pb.ListDirResponse(entries=[e.info() for e in entries])

    async def remove(
        self, request: filesystem_pb.RemoveRequest, ctx: RequestContext[object, object], /
    ) -> filesystem_pb.RemoveResponse:
        fs, _ = self._parts(ctx)
        await _bounded(ctx, fs.remove(resolve(request.path)))
        return filesystem_pb.RemoveResponse()

    async def watch_dir(
        self, request: filesystem_pb.WatchDirRequest, ctx: RequestContext[object, object], /
    ) -> AsyncIterator[filesystem_pb.WatchDirResponse]:
        _, watchers = self._parts(ctx)
        deadline = _deadline(ctx)
        keepalive = _keepalive(ctx)
        watcher = await _bounded(
            ctx,
            watchers.create(
                resolve(request.path),
                recursive=request.recursive,
                include_entry=request.include_entry,
            ),
        )
        try:
            start = filesystem_pb.WatchDirResponse.StartEvent()
            yield filesystem_pb.WatchDirResponse(event=Oneof("start", start))  # type: ignore[arg-type]
            while True:
                now = anyio.current_time()
                if now >= deadline:
                    raise ConnectError(
                        Code.DEADLINE_EXCEEDED, "the request's deadline was exceeded"
                    )
                with anyio.move_on_after(min(keepalive, deadline - now)):
                    await watcher.changed.wait()
                events = watcher.take()
                if not events:
                    keep = filesystem_pb.WatchDirResponse.KeepAlive()
                    yield filesystem_pb.WatchDirResponse(event=Oneof("keepalive", keep))  # type: ignore[arg-type]
                for event in events:
                    yield filesystem_pb.WatchDirResponse(event=Oneof("filesystem", event))  # type: ignore[arg-type]
        finally:
            watchers.remove(watcher.id)

    async def create_watcher(
        self, request: filesystem_pb.CreateWatcherRequest, ctx: RequestContext[object, object], /
    ) -> filesystem_pb.CreateWatcherResponse:
        _, watchers = self._parts(ctx)
        watcher = await _bounded(
            ctx,
            watchers.create(
                resolve(request.path),
                recursive=request.recursive,
                include_entry=request.include_entry,
            ),
        )
        return filesystem_pb.CreateWatcherResponse(watcher_id=watcher.id)

    async def get_watcher_events(
        self,
        request: filesystem_pb.GetWatcherEventsRequest,
        ctx: RequestContext[object, object],
        /,
    ) -> filesystem_pb.GetWatcherEventsResponse:
        _, watchers = self._parts(ctx)
        watcher = watchers.get(request.watcher_id)
        await _bounded(ctx, watcher.scan())
        return filesystem_pb.GetWatcherEventsResponse(events=watcher.take())

    async def remove_watcher(
        self, request: filesystem_pb.RemoveWatcherRequest, ctx: RequestContext[object, object], /
    ) -> filesystem_pb.RemoveWatcherResponse:
        _, watchers = self._parts(ctx)
        watchers.get(request.watcher_id)
        watchers.remove(request.watcher_id)
        return filesystem_pb.RemoveWatcherResponse()


class _Refusing:
    """A codec whose messages that do not decode (a string where a number belongs, a
    number out of range, an unknown enum) are the client's error, INVALID_ARGUMENT, as
    envd answers them, never an internal error of the server's."""

    def __init__(self, codec: Codec[Any, Any]) -> None:
        self._codec = codec

    def name(self) -> str:
        return self._codec.name()

    def encode(self, message: Any) -> bytes:
        return self._codec.encode(message)

    def decode(self, data: bytes | bytearray, message_class: type[Any]) -> Any:
        try:
            return self._codec.decode(data, message_class)
        except ConnectError:
            raise
        except Exception as exc:  # noqa: BLE001 - whatever a malformed message raises
            name = getattr(message_class, "__name__", "message")
            raise ConnectError(Code.INVALID_ARGUMENT, f"invalid {name}: {exc}"[:500]) from None


CODECS = (_Refusing(proto_json_codec()), _Refusing(proto_binary_codec()))


def applications(
    sandbox_of: SandboxOf,
) -> dict[str, ProcessASGIApplication | FilesystemASGIApplication]:
    """The two Connect applications, by path prefix."""
    return {
        "/process.Process/": ProcessASGIApplication(
            ProcessService(sandbox_of),  # type: ignore[arg-type]
            read_max_bytes=READ_MAX_BYTES,
            compressions=(),
            codecs=CODECS,
        ),
        "/filesystem.Filesystem/": FilesystemASGIApplication(
            FilesystemService(sandbox_of),  # type: ignore[arg-type]
            read_max_bytes=READ_MAX_BYTES,
            compressions=(),
            codecs=CODECS,
        ),
    }
