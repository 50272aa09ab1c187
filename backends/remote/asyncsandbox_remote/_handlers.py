"""The handlers of the server and of sandboxes (the server's health, info, metrics and
OpenAPI document; creating, listing, describing, resetting and deleting sandboxes, their
leases and snapshots; judging): one method per operation of :data:`~._openapi.OPERATIONS`, by its
name, through the server's state (:mod:`._serverstate`): its Session, its tenancy and its
helpers for bodies that stream. They answer errors by raising them; the application
(:mod:`._app`) turns what they raise into answers and counts every answer. Commands and
code are :mod:`._exec_handlers`', files :mod:`._file_handlers`'.
"""

from __future__ import annotations

import hashlib
import time
from collections.abc import Iterable
from typing import Any

import anyio
import msgspec
from starlette.requests import Request
from starlette.responses import Response

from asyncsandbox import (
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
from ._serverstate import ServerState
from ._streaming import (
    decode,
    json_response,
    until_disconnect,
)
from ._tenancy import Creation, CreationState, Record, TenantState

__all__ = ("Handlers",)

log = get_logger("asyncsandbox.remote")


class Handlers:
    """The server and sandbox handlers of one server (see the module docstring)."""

    def __init__(self, server: ServerState) -> None:
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
                    reset=caps.reset if caps else False,
                ),
                lease_seconds=self.config.lease_seconds,
                max_lease_seconds=self.config.max_lease_seconds,
                max_live=tenant.max_live,
                max_execs=tenant.max_execs,
                max_request_bytes=self.config.max_request_bytes,
                max_file_bytes=self.config.max_file_bytes,
                max_upload_bytes=self.config.max_upload_bytes,
                ping_interval=self.config.ping_interval,
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

    async def reset_sandbox(self, request: Request) -> Response:
        tenant = self.tenancy.authenticate(request)
        record = self.tenancy.record(tenant, request.path_params["sandbox_id"])
        async with self.tenancy.use(tenant, record):
            # Failed, the sandbox is in no known state: the client's runtime removes it.
            await record.sandbox.reset()
        return Response(status_code=204)

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
