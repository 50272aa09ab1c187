"""The handlers: what each operation of the API does (one method per operation of
:data:`~._openapi.OPERATIONS`, by its name), through the server's Session, its tenancy and
its helpers for bodies that stream. They answer errors by raising them; the application
(:mod:`._app`) turns what they raise into answers and counts every answer.

* **Cancellation.** Exec requests watch for the client's disconnect and cancel the
  command, and ``DELETE .../execs/{exec_id}`` cancels it by id and answers once the
  process tree is gone; the runtime kills the tree in both cases. A command's own
  ``timeout`` is enforced here too (by the server's Session), so a client whose command
  times out needs no request to kill it.
* **Archives** go through the public :class:`asyncsandbox.Sandbox` like everything else
  (the Session's limits, error translation and dead-sandbox marking apply).
"""

from __future__ import annotations

import hashlib
import time
from collections.abc import Iterable
from contextlib import AsyncExitStack
from typing import TYPE_CHECKING, Any

import anyio
import msgspec
from starlette.requests import Request
from starlette.responses import Response
from starlette.types import Receive, Scope, Send

from asyncsandbox import (
    ExecResult,
    ExecTimeout,
    Resources,
    SandboxClosed,
    SandboxDied,
    SandboxError,
    SandboxNotFound,
    SandboxStatus,
)
from asyncsandbox.judge import JudgeResult, judge
from asyncsandbox.log import get_logger

from . import _wire as w
from ._errors import CLIENT_CLOSED_REQUEST, HttpError, bad_request, error_for, not_found
from ._openapi import openapi
from ._streaming import (
    RequestBody,
    Streamed,
    decode,
    json_response,
    read_body,
    start_response,
    until_disconnect,
)
from ._tenancy import Creation, CreationState, Record, TenantState

if TYPE_CHECKING:
    from ._app import RemoteServer

__all__ = ("Handlers",)

log = get_logger("asyncsandbox.remote")

DEFAULT_READ_LIMIT = 100 * 1024 * 1024
LOOKAHEAD = 1024 * 1024
"""Bytes of an archive read before answering, so that its errors can still get a status."""


class Handlers:
    """The request handlers of one server (see the module docstring)."""

    def __init__(self, server: RemoteServer) -> None:
        self.server = server
        self.config = server.config
        self.tenancy = server.tenancy
        self.metrics = server.metrics
        self._openapi = w.Codec[Any](dict).encode(openapi(server.version))

    # -- server ---------------------------------------------------------------

    async def health(self, request: Request) -> Response:
        status = "shutting_down" if self.server.closing else "ok"
        return json_response(w.HEALTH, w.Health(status=status, version=self.server.version))

    async def info(self, request: Request) -> Response:
        tenant = self.tenancy.authenticate(request)
        served = self.server.served
        caps = served.capabilities if served is not None else None
        networks = sorted(caps.network_modes) if caps else ["none"]
        if not self.config.allow_host_network:
            networks = [n for n in networks if n != "host"]
        return json_response(
            w.INFO,
            w.ServerInfo(
                tenant=tenant.name,
                backend=served.inner.name if served is not None else self.config.backend,
                version=self.server.version,
                capabilities=w.Capabilities(
                    isolation=caps.isolation if caps else "",
                    enforced_limits=sorted(caps.enforced_limits) if caps else [],
                    best_effort_limits=caps.best_effort_limits if caps else False,
                    limits_note=caps.limits_note if caps else "",
                    network_modes=networks,
                    reports_signal=caps.reports_signal if caps else False,
                    snapshots=caps.snapshots if caps else False,
                ),
                lease_seconds=self.config.lease_seconds,
                max_lease_seconds=self.config.max_lease_seconds,
                max_live=tenant.max_live,
                max_execs=tenant.max_execs,
                max_request_bytes=self.config.max_request_bytes,
                max_file_bytes=self.config.max_file_bytes,
                max_upload_bytes=self.config.max_upload_bytes,
            ),
        )

    async def metrics_text(self, request: Request) -> Response:
        session = self.server.running
        text = self.metrics.render(
            tenants=self.tenancy.counts(),
            statistics=session.statistics() if session is not None else None,
        )
        return Response(text, media_type="text/plain; version=0.0.4; charset=utf-8")

    async def openapi_json(self, request: Request) -> Response:
        return Response(self._openapi, media_type="application/json")

    # -- sandboxes ------------------------------------------------------------

    def _sandbox_arguments(self, tenant: TenantState, spec: w.CreateSandbox) -> dict[str, Any]:
        """``Session.sandbox`` arguments for a tenant's sandbox as ``spec`` asks, once this
        server allows it."""
        if spec.network != "none" and not (
            spec.network == "host" and self.config.allow_host_network
        ):
            raise bad_request(f"network={spec.network!r} is not allowed on this server")
        res = spec.resources
        arguments: dict[str, Any] = {
            "image": spec.image,
            "env": spec.env,
            "workdir": spec.workdir,
            "resources": Resources(cpus=res.cpus, memory_mb=res.memory_mb, pids=res.pids),
            "network": spec.network,
            "max_lifetime": spec.max_lifetime,
            "tags": (tenant.tag,),
        }
        if spec.snapshot is not None:
            if spec.snapshot not in tenant.snapshots:
                raise bad_request(f"no snapshot {spec.snapshot!r} of this tenant")
            arguments["from_snapshot"] = spec.snapshot
        return arguments

    async def create_sandbox(self, request: Request) -> Response:
        tenant = self.tenancy.authenticate(request)
        key = request.headers.get("idempotency-key")
        if key is not None and not (
            0 < len(key) <= 255 and key.isascii() and key.isprintable() and " " not in key
        ):
            raise bad_request("Idempotency-Key must be 1-255 printable ASCII characters")
        spec = await decode(request, w.CREATE, self.config.max_request_bytes)
        fingerprint = hashlib.sha256(w.CREATE.encode(spec)).digest()
        if key is not None:
            replayed = await self.tenancy.replay(tenant, key, fingerprint)
            if replayed is not None:
                return json_response(
                    w.DESCRIPTION, replayed, 200, **{"Idempotent-Replayed": "true"}
                )
        if self.server.closing:
            raise HttpError(503, "shutting_down", "the server is shutting down", retryable=True)
        self.tenancy.check_live_quota(tenant)
        try:
            sandbox = self.server.session.sandbox(**self._sandbox_arguments(tenant, spec))
        except SandboxError as exc:
            raise error_for(exc) from None
        lease = min(spec.lease_seconds or self.config.lease_seconds, self.config.max_lease_seconds)
        creation: Creation | None = None
        if key is not None:
            creation = tenant.keys[key] = Creation(fingerprint)
        tenant.creating += 1
        try:
            with anyio.CancelScope() as scope:
                if creation is not None:
                    creation.scope = scope
                await sandbox.start()
            if creation is not None and creation.state == CreationState.ABANDONED:
                await sandbox.stop()
                raise HttpError(409, "create_abandoned", "the create with this key was abandoned")
            assert sandbox.id is not None
            record = Record(
                id=sandbox.id,
                tenant=tenant,
                sandbox=sandbox,
                labels=dict(spec.labels),
                image=spec.image,
                workdir=sandbox.config.workdir,
                created_at=round(time.time(), 3),
                lease_seconds=lease,
                sandbox_backend=self.server.served.inner.name if self.server.served else "",
            )
            self.tenancy.add(record)
            answer = record.describe(SandboxStatus.RUNNING.value)
            if creation is not None:
                creation.state = CreationState.DONE
                creation.answer = answer
                creation.sandbox_id = record.id
        except BaseException:
            if creation is not None and creation.state == CreationState.PENDING:
                tenant.keys.pop(key or "", None)
            raise
        finally:
            tenant.creating -= 1
            if creation is not None:
                creation.scope = None
                creation.done.set()
        log.debug("remote.sandbox.created", sandbox_id=record.id, tenant=tenant.name)
        return json_response(w.DESCRIPTION, answer, 201)

    async def abandon_create(self, request: Request) -> Response:
        tenant = self.tenancy.authenticate(request)
        await self.tenancy.abandon(tenant, request.path_params["idempotency_key"])
        return Response(status_code=204)

    async def _statuses_of(self, tenant: TenantState) -> dict[str, str]:
        infos = await self.server.session.list(tags=[tenant.tag], this_session=True)
        return {i.id: i.status.value for i in infos}

    def _select(
        self, tenant: TenantState, request: Request
    ) -> tuple[list[Record], set[str] | None]:
        labels = _labels_filter(request.query_params.getlist("label"))
        wanted = _statuses(request.query_params.getlist("status"))
        chosen = [
            r
            for r in list(tenant.records.values())
            if not r.removing and all(r.labels.get(k) == v for k, v in labels.items())
        ]
        return chosen, wanted

    async def list_sandboxes(self, request: Request) -> Response:
        tenant = self.tenancy.authenticate(request)
        chosen, wanted = self._select(tenant, request)
        statuses = await self._statuses_of(tenant) if chosen else {}
        items = []
        for record in chosen:
            status = statuses.get(record.id, SandboxStatus.DEAD.value)
            if wanted is None or status in wanted:
                items.append(record.describe(status))
        return json_response(w.LIST, w.SandboxList(items=items))

    async def delete_sandboxes(self, request: Request) -> Response:
        tenant = self.tenancy.authenticate(request)
        if not request.query_params.getlist("label"):
            raise bad_request("deleting needs at least one label filter (refusing to delete all)")
        chosen, wanted = self._select(tenant, request)
        if wanted is not None and chosen:
            statuses = await self._statuses_of(tenant)
            chosen = [r for r in chosen if statuses.get(r.id, SandboxStatus.DEAD.value) in wanted]
        async with anyio.create_task_group() as tg:
            for record in chosen:
                tg.start_soon(self.tenancy.drop, record)
        return json_response(w.DELETED, w.DeletedSandboxes(ids=[r.id for r in chosen]))

    # -- snapshots ------------------------------------------------------------

    async def snapshot_sandbox(self, request: Request) -> Response:
        tenant = self.tenancy.authenticate(request)
        record = self.tenancy.record(tenant, request.path_params["sandbox_id"])
        async with self.tenancy.use(tenant, record):
            snapshot = await record.sandbox.snapshot(keep=True)  # the tenant's to delete
        tenant.snapshots.add(snapshot.id)
        return json_response(w.SNAPSHOT, w.SnapshotCreated(id=snapshot.id), 201)

    async def delete_snapshot(self, request: Request) -> Response:
        tenant = self.tenancy.authenticate(request)
        snapshot_id = request.path_params["snapshot_id"]
        if snapshot_id in tenant.snapshots:  # (another tenant's: as if it did not exist)
            await self.server.session.delete_snapshot(snapshot_id)
            tenant.snapshots.discard(snapshot_id)
        return Response(status_code=204)

    async def get_sandbox(self, request: Request) -> Response:
        tenant = self.tenancy.authenticate(request)
        record = self.tenancy.record(tenant, request.path_params["sandbox_id"])
        record.renew()
        try:
            info = await record.sandbox.info()
            status = info.status.value
        except SandboxDied:
            status = SandboxStatus.DEAD.value
        except (SandboxNotFound, SandboxClosed):
            await self.tenancy.drop(record)
            raise not_found(record.id) from None
        return json_response(w.DESCRIPTION, record.describe(status))

    async def delete_sandbox(self, request: Request) -> Response:
        tenant = self.tenancy.authenticate(request)
        record = self.tenancy.record(tenant, request.path_params["sandbox_id"])
        await self.tenancy.drop(record)
        return Response(status_code=204)

    async def renew_lease(self, request: Request) -> Response:
        tenant = self.tenancy.authenticate(request)
        record = self.tenancy.record(tenant, request.path_params["sandbox_id"])
        record.renew()
        return json_response(
            w.LEASES, w.Leases(renewed=[record.id], lease_seconds=record.lease_seconds)
        )

    async def renew_leases(self, request: Request) -> Response:
        tenant = self.tenancy.authenticate(request)
        renewal = await decode(request, w.RENEWAL, self.config.max_request_bytes)
        renewed, missing = [], []
        for sandbox_id in dict.fromkeys(renewal.ids):
            record = tenant.records.get(sandbox_id)
            if record is None or record.removing:
                missing.append(sandbox_id)
            else:
                record.renew()
                renewed.append(sandbox_id)
        return json_response(
            w.LEASES,
            w.Leases(renewed=renewed, missing=missing, lease_seconds=self.config.lease_seconds),
        )

    # -- judging --------------------------------------------------------------

    async def judge(self, request: Request) -> Response:
        tenant = self.tenancy.authenticate(request)
        body = await decode(request, w.JUDGE, self.config.max_request_bytes)
        if self.server.closing:
            raise HttpError(503, "shutting_down", "the server is shutting down", retryable=True)
        try:  # the sandbox, as a create's body would ask for it (and checked as one)
            spec = msgspec.convert(msgspec.to_builtins(body.sandbox or {}), w.CreateSandbox)
        except msgspec.ValidationError as exc:
            raise bad_request(f"invalid sandbox: {exc}") from None
        arguments = self._sandbox_arguments(tenant, spec)
        result: JudgeResult | None = None

        async def work() -> None:
            nonlocal result
            session = self.server.session
            result = await judge(lambda: session.sandbox(**arguments, recyclable=True), body)

        async with self.tenancy.ephemeral(tenant):
            if await until_disconnect(request.receive, work):
                self.metrics.disconnect_kills += 1
                log.info("remote.judge.disconnected", tenant=tenant.name)
        if result is None:  # the client left: nobody reads this
            return Response(status_code=CLIENT_CLOSED_REQUEST)
        return json_response(w.JUDGE_RESULT, result)

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

    # -- files ----------------------------------------------------------------

    async def read_file(self, request: Request) -> Response:
        tenant = self.tenancy.authenticate(request)
        record = self.tenancy.record(tenant, request.path_params["sandbox_id"])
        path = _query_path(request)
        limit = _query_int(request, "max_bytes", DEFAULT_READ_LIMIT)
        if limit < 1:
            raise bad_request("max_bytes must be >= 1")
        limit = min(limit, self.config.max_file_bytes)
        async with self.tenancy.use(tenant, record):
            data = await record.sandbox.read_file(path, max_bytes=limit)
        return Response(data, media_type="application/octet-stream")

    async def write_file(self, request: Request) -> Response:
        tenant = self.tenancy.authenticate(request)
        record = self.tenancy.record(tenant, request.path_params["sandbox_id"])
        path = _query_path(request)
        mode = _query_int(request, "mode", 0o644, base=8)
        if not 0 <= mode <= 0o7777:
            raise bad_request("mode must be permission bits in octal, such as 644")
        async with self.tenancy.use(tenant, record):
            data = await read_body(request, self.config.max_file_bytes)
            await record.sandbox.write_file(path, data, mode=mode)
        return Response(status_code=204)

    async def upload_archive(self, request: Request) -> Response:
        tenant = self.tenancy.authenticate(request)
        record = self.tenancy.record(tenant, request.path_params["sandbox_id"])
        path = _query_path(request)
        body = RequestBody(request, self.config.max_upload_bytes)
        async with self.tenancy.use(tenant, record):
            try:
                await record.sandbox.put_archive(path, body)
            except Exception:
                body.raise_stopped()
                raise
        return Response(status_code=204)

    async def download_archive(self, request: Request) -> Response:
        tenant = self.tenancy.authenticate(request)
        record = self.tenancy.record(tenant, request.path_params["sandbox_id"])
        path = _query_path(request)

        async def run(scope: Scope, receive: Receive, send: Send) -> None:
            started = False
            failure: HttpError | None = None

            async def work() -> None:
                nonlocal started, failure

                async def emit(chunk: bytes) -> None:
                    nonlocal started
                    if not started:
                        await start_response(send, "application/x-tar")
                        started = True
                    await send({"type": "http.response.body", "body": chunk, "more_body": True})

                try:
                    # Look ahead up to LOOKAHEAD bytes before answering: an archive that
                    # fits is answered only once the backend said it succeeded, so its
                    # errors get a proper status. Past that, it streams (bounded memory),
                    # and a late error can only cut the stream.
                    head = bytearray()
                    ended = False
                    async with record.sandbox.get_archive(path) as chunks:
                        iterator = aiter(chunks)
                        while not ended and len(head) < LOOKAHEAD:
                            try:
                                head += await anext(iterator)
                            except StopAsyncIteration:
                                ended = True
                        if not ended:
                            await emit(bytes(head))
                            head.clear()
                            async for chunk in iterator:
                                await emit(chunk)
                    if ended:
                        await emit(bytes(head))
                except SandboxError as exc:
                    failure = error_for(exc, record.id)
                    if started:
                        # Too late for a status: cut the stream so the client sees it broke.
                        log.warning("remote.archive.failed", sandbox_id=record.id, error=str(exc))
                        raise

            try:
                async with AsyncExitStack() as stack:
                    await stack.enter_async_context(self.tenancy.use(tenant, record))
                    if await until_disconnect(receive, work):
                        return
            except HttpError as exc:
                failure = exc
            except SandboxError as exc:
                failure = failure or error_for(exc, record.id)
                if started:
                    return  # an incomplete body: the client reports a broken transfer
            if started:
                await send({"type": "http.response.body", "body": b"", "more_body": False})
            elif failure is not None:
                await failure.response()(scope, receive, send)

        return Streamed(run)


def _labels_filter(values: Iterable[str]) -> dict[str, str]:
    labels: dict[str, str] = {}
    for item in values:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise bad_request(f"label filters are KEY=VALUE, got {item[:100]!r}")
        labels[key] = value
    return labels


def _statuses(values: Iterable[str]) -> set[str] | None:
    wanted = set(values)
    known = {s.value for s in SandboxStatus}
    if wanted - known:
        raise bad_request(f"unknown status {sorted(wanted - known)}; known: {sorted(known)}")
    return wanted or None


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


def _query_int(request: Request, name: str, default: int, *, base: int = 10) -> int:
    raw = request.query_params.get(name)
    if raw is None:
        return default
    try:
        value = int(raw, base)
    except ValueError:
        raise bad_request(f"{name} must be an integer, got {raw[:50]!r}") from None
    return value


def _query_path(request: Request) -> str:
    path = request.query_params.get("path")
    if not path:
        raise bad_request("the 'path' query parameter is required")
    return path
