"""E2B's control plane (``X-API-KEY``): create, connect (and resume), info, list, kill,
timeout, filesystem-only pause, fork; errors as E2B's ``{code, message}``.

Sandboxes are made through the server's Session like every other sandbox, held as the
tenancy's records (quotas, ``DELETE`` by the server's own API, removal on shutdown), with
a fixed lifetime instead of a lease: E2B's ``timeout``, which ``set_timeout`` and
``connect`` move. What the runtime cannot honestly give answers an error the SDK raises:
a memory-preserving pause, auto-pause and auto-resume, network and internet access
controls, MCP, IAM, volumes, template builds, secrets, metrics and logs.
"""

from __future__ import annotations

import re
import secrets
import time
from collections.abc import Awaitable, Callable
from contextlib import suppress
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any
from urllib.parse import parse_qsl

import anyio
import msgspec
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from asyncsandbox import Sandbox, SandboxError

from .._errors import HttpError, error_for
from .._serverstate import ServerState
from .._streaming import read_body
from .._tenancy import Record, TenantState
from . import _wire as w
from ._envd import SandboxOf
from ._fs import HOME, Filesystem
from ._openapi import CONTROL, e2b_openapi
from ._processes import Processes
from ._state import ENVD_VERSION, E2bSandbox, Registry, new_id
from ._watch import Watchers

__all__ = ("DEFAULT_TEMPLATES", "ControlPlane", "e2b_error")

DEFAULT_TEMPLATES = ("base", "code-interpreter-v1")
WORKDIR_HEADER = "x-asyncsandbox-workdir"
"""An extension of the create: the sandbox's working directory instead of E2B's home
(the e2b backend sends it; E2B's own sandboxes let ``root`` make one, ours have none)."""
DEFAULT_TIMEOUT = w.DEFAULT_TIMEOUT
NAME = re.compile(r"[a-z0-9._-]{1,100}")
UNSUPPORTED_PREFIXES = (
    "/templates",
    "/v2/templates",
    "/v3/templates",
    "/secrets",
    "/volumes",
    "/teams",
    "/nodes",
    "/access-tokens",
    "/api-keys",
)


def e2b_error(status: int, message: str, headers: dict[str, str] | None = None) -> Response:
    """An error as E2B's API answers it."""
    body = w.encode(w.E2bError(code=status, message=message))
    return Response(body, status_code=status, media_type="application/json", headers=headers)


class _E2bError(Exception):
    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


def _private(network: Any) -> bool:
    """``network`` asks for nothing but what every sandbox here is: no public traffic
    (E2B's ``allowPublicTraffic: false``: its ports want the sandbox's traffic token)."""
    return isinstance(network, dict) and all(
        key == "allowPublicTraffic" and value in (False, None) for key, value in network.items()
    )


def _unsupported(what: str, why: str) -> _E2bError:
    return _E2bError(400, f"{what} is not supported by asyncsandbox serve: {why}")


@dataclass(eq=False)
class E2bSnapshot:
    """A filesystem-only snapshot taken through E2B's API: a template of its tenant's."""

    id: str
    tenant: TenantState
    source: str
    template: str
    image: str | None
    workdir: str
    name: str | None


def _timestamp(value: str | None) -> float | None:
    if not value:
        return None
    try:
        return datetime.fromisoformat(value).timestamp()
    except ValueError:
        raise _E2bError(400, f"startedAfter must be an RFC 3339 time, got {value[:40]!r}") from None


def _iso(ts: float) -> str:
    return datetime.fromtimestamp(ts, UTC).isoformat().replace("+00:00", "Z")


class ControlPlane:
    """The control-plane routes (see the module docstring). Their sandboxes are in
    :attr:`registry`, which envd's routes (:mod:`._router`) look up."""

    def __init__(self, server: ServerState) -> None:
        self.server = server
        self.config = server.config
        self.tenancy = server.tenancy
        self.registry = Registry()
        self.templates: dict[str, str | None] = dict.fromkeys(DEFAULT_TEMPLATES)
        self.templates.update(self.config.e2b_templates)
        self.snapshots: dict[str, E2bSnapshot] = {}
        """Snapshots taken through E2B's API (``POST /sandboxes/{id}/snapshots``), by id."""

    # -- plumbing ---------------------------------------------------------------------

    def routes(self, endpoint: Callable[..., Any]) -> list[Route]:
        """The routes (:data:`._openapi.CONTROL`), each wrapped by ``endpoint(name,
        handler)`` (the application's accounting), and their OpenAPI document."""
        routes = [
            Route(
                op.path,
                endpoint(f"e2b_{op.handler}", self._guard(getattr(self, op.handler))),
                methods=[op.method],
            )
            for op in CONTROL
        ]
        routes.append(Route("/e2b/openapi.json", self.openapi_json, methods=["GET"]))
        unsupported = endpoint("e2b_not_offered", self._guard(self.not_offered))
        methods = ["GET", "POST", "PUT", "PATCH", "DELETE"]
        for prefix in UNSUPPORTED_PREFIXES:
            routes.append(Route(prefix, unsupported, methods=methods))
            routes.append(Route(prefix + "/{rest:path}", unsupported, methods=methods))
        return routes

    def _guard(
        self, handler: Callable[[Request], Awaitable[Response]]
    ) -> Callable[[Request], Awaitable[Response]]:
        async def guarded(request: Request) -> Response:
            try:
                return await handler(request)
            except _E2bError as exc:
                return e2b_error(exc.status, str(exc))
            except HttpError as exc:
                return e2b_error(exc.status, exc.body.message, exc.headers)
            except SandboxError as exc:
                answer = error_for(exc)
                return e2b_error(answer.status, answer.body.message)

        guarded.__name__ = handler.__name__
        return guarded

    def _tenant(self, request: Request) -> TenantState:
        key = request.headers.get("x-api-key", "")
        tenant = self.tenancy.tenant_of(key)
        if tenant is None:
            self.tenancy.refused(request, had_key=bool(key))
            raise _E2bError(401, "invalid or missing API key: send it as X-API-KEY")
        return tenant

    def _sandbox(self, tenant: TenantState, request: Request) -> E2bSandbox:
        sandbox_id = request.path_params["sandbox_id"]
        found = self.registry.get(sandbox_id)
        if found is None or found.tenant is not tenant:
            # Another tenant's sandbox answers exactly like one that does not exist.
            raise _E2bError(404, f"sandbox {sandbox_id[:64]!r} not found")
        return found

    async def _body(self, request: Request, kind: type[Any]) -> Any:
        data = await read_body(request, self.config.max_request_bytes)
        try:
            return msgspec.json.decode(data or b"{}", type=kind)
        except msgspec.DecodeError as exc:
            raise _E2bError(400, f"invalid request body: {exc}") from None

    def _timeout(self, value: int | None, default: float = DEFAULT_TIMEOUT) -> float:
        if value is None:
            return default
        if value < 0:
            raise _E2bError(400, "timeout must be a number of seconds >= 0")
        return float(min(value, self.config.e2b_max_timeout)) or float(DEFAULT_TIMEOUT)

    def sandbox_of(self) -> SandboxOf:
        """What envd's services call to find a request's sandbox (checked by the router)."""

        def of(ctx: Any) -> E2bSandbox:
            from connectrpc.code import Code
            from connectrpc.errors import ConnectError

            sandbox_id = ctx.request_headers.get("e2b-sandbox-id", "")
            found = self.registry.get(sandbox_id)
            if found is None or not found.running:
                raise ConnectError(Code.UNAVAILABLE, f"sandbox {sandbox_id[:64]} was not found")
            return found

        return of

    # -- creating and resuming ---------------------------------------------------------

    async def _launch(
        self, sandbox: E2bSandbox, timeout: float, *, from_snapshot: str | None = None
    ) -> None:
        """Start the backend's sandbox of ``sandbox`` and make it a tenancy record."""
        tenant = sandbox.tenant
        if self.server.closing:
            raise HttpError(503, "shutting_down", "the server is shutting down", retryable=True)
        self.tenancy.check_live_quota(tenant)
        arguments: dict[str, Any] = {
            "image": sandbox.image,
            "env": sandbox.env,
            "workdir": sandbox.workdir,
            "tags": (tenant.tag,),
        }
        if from_snapshot is not None:
            arguments["from_snapshot"] = from_snapshot
        try:
            made = self.server.session.sandbox(**arguments)
        except SandboxError as exc:
            raise error_for(exc) from None
        tenant.creating += 1
        try:
            await made.start()
        finally:
            tenant.creating -= 1
        self._adopt(sandbox, made, timeout)

    def _adopt(self, sandbox: E2bSandbox, made: Sandbox, timeout: float) -> None:
        assert made.id is not None
        served = self.server.served
        record = Record(
            id=made.id,
            tenant=sandbox.tenant,
            sandbox=made,
            labels={"e2b.sandbox": sandbox.id, "e2b.template": sandbox.template},
            image=sandbox.image,
            workdir=made.config.workdir,
            created_at=round(time.time(), 3),
            lease_seconds=timeout,
            sandbox_backend=served.inner.name if served is not None else "",
        )
        record.set_lifetime(timeout)
        sandbox.record = record
        sandbox.snapshot = None
        sandbox.started_at = time.time()
        sandbox.end_at = sandbox.started_at + timeout
        sandbox.processes = Processes(made, lambda: self.server.task_group)
        fs = Filesystem(made)
        sandbox.fs = fs
        sandbox.watchers = Watchers(fs, lambda: self.server.task_group)
        resources = made.config.resources
        sandbox.cpu_count = max(1, round(resources.cpus or 1))
        sandbox.memory_mb = resources.memory_mb or 512
        self.tenancy.add(record)

    def _answer(self, sandbox: E2bSandbox) -> w.CreatedSandbox:
        return w.CreatedSandbox(
            template_id=sandbox.template,
            sandbox_id=sandbox.id,
            client_id="asyncsandbox",
            envd_version=ENVD_VERSION,
            envd_access_token=sandbox.token,
            traffic_access_token=sandbox.traffic_token,
        )

    def _json(self, value: Any, status: int = 200, **headers: str) -> Response:
        return Response(
            w.encode(value),
            status_code=status,
            media_type="application/json",
            headers=headers or None,
        )

    async def openapi_json(self, request: Request) -> Response:
        """The OpenAPI document of E2B's routes (no authentication)."""
        return self._json(e2b_openapi(self.server.version))

    def _refuse_unsupported(self, body: w.NewSandbox) -> None:
        if body.auto_pause:
            raise _unsupported("auto-pause", "a sandbox cannot be frozen; it ends at its timeout")
        if body.auto_resume:
            raise _unsupported("auto-resume", "a paused sandbox resumes by connect() only")
        if body.allow_internet_access:
            raise _unsupported(
                "internet access", "sandboxes have no network (allow_internet_access=False)"
            )
        if body.network and not _private(body.network):
            raise _unsupported(
                "network configuration",
                "sandboxes have no network (only allowPublicTraffic: false is taken: a "
                "sandbox's code interpreter needs its traffic token anyway)",
            )
        if body.mcp:
            raise _unsupported("MCP gateways", "sandboxes have no network")
        if body.iam:
            raise _unsupported("IAM workload identities", "sandboxes have no network")
        if body.volume_mounts:
            raise _unsupported("volumes", "sandboxes have no shared storage")

    async def create(self, request: Request) -> Response:
        tenant = self._tenant(request)
        body: w.NewSandbox = await self._body(request, w.NewSandbox)
        self._refuse_unsupported(body)
        snapshot = self._snapshot_named(tenant, body.template_id)
        if body.template_id not in self.templates and snapshot is None:
            known = ", ".join(sorted(self.templates))
            raise _E2bError(
                404,
                f"template {body.template_id[:100]!r} not found; this server's templates: "
                f"{known} (asyncsandbox serve --e2b-template NAME=IMAGE adds more), and "
                "this tenant's snapshots",
            )
        sandbox = E2bSandbox(
            id=new_id(),
            tenant=tenant,
            template=body.template_id,
            image=snapshot.image if snapshot else self.templates[body.template_id],
            metadata=dict(body.metadata or {}),
            env=dict(body.env_vars or {}),
            token=secrets.token_urlsafe(24),
            started_at=time.time(),
            end_at=time.time(),
            # A snapshot's files are where its source had them.
            workdir=snapshot.workdir if snapshot else request.headers.get(WORKDIR_HEADER) or HOME,
        )
        sandbox.busy += 1
        self.registry.add(sandbox)
        try:
            await self._launch(
                sandbox,
                self._timeout(body.timeout),
                from_snapshot=snapshot.id if snapshot else None,
            )
        except BaseException:
            self.registry.forget(sandbox.id)
            raise
        finally:
            sandbox.busy -= 1
        return self._json(self._answer(sandbox), 201)

    async def connect(self, request: Request) -> Response:
        tenant = self._tenant(request)
        sandbox = self._sandbox(tenant, request)
        body: w.TimeoutBody = await self._body(request, w.TimeoutBody)
        if body.auto_pause:
            raise _unsupported("auto-pause", "a sandbox cannot be frozen; it ends at its timeout")
        timeout = self._timeout(body.timeout)
        if sandbox.running:
            if time.time() + timeout > sandbox.end_at:
                sandbox.set_timeout(timeout)
            return self._json(self._answer(sandbox), 200)
        await self._resume(sandbox, timeout)
        return self._json(self._answer(sandbox), 201)

    async def _resume(self, sandbox: E2bSandbox, timeout: float) -> None:
        if sandbox.busy:
            raise _E2bError(409, f"sandbox {sandbox.id} is being paused or resumed")
        snapshot = sandbox.snapshot
        assert snapshot is not None
        sandbox.busy += 1
        try:
            await self._launch(sandbox, timeout, from_snapshot=snapshot)
        finally:
            sandbox.busy -= 1
        with anyio.CancelScope(shield=True):
            with suppress(SandboxError):  # a leftover snapshot: the backend's gc removes it
                await self.server.session.delete_snapshot(snapshot)
        sandbox.tenant.snapshots.discard(snapshot)

    async def pause(self, request: Request) -> Response:
        tenant = self._tenant(request)
        sandbox = self._sandbox(tenant, request)
        body: w.PauseBody = await self._body(request, w.PauseBody)
        if body.memory is not False:
            raise _unsupported(
                "a memory-preserving pause",
                "processes cannot be frozen here; pause(keep_memory=False) (mode='filesystem') "
                "keeps the sandbox's id, token and files, and ends its processes",
            )
        if sandbox.paused:
            raise _E2bError(409, f"sandbox {sandbox.id} is already paused")
        if sandbox.busy:
            raise _E2bError(409, f"sandbox {sandbox.id} is being paused or resumed")
        record = sandbox.record
        assert record is not None
        sandbox.busy += 1
        try:
            async with self.tenancy.use(tenant, record):
                snap = await record.sandbox.snapshot(keep=True)
            tenant.snapshots.add(snap.id)
            sandbox.snapshot = snap.id
            await self.tenancy.drop(record)
            sandbox.record = None
            sandbox.processes = None
            sandbox.fs = None
            if sandbox.watchers is not None:
                sandbox.watchers.close()
            sandbox.watchers = None
        finally:
            sandbox.busy -= 1
        return Response(status_code=204)

    async def fork(self, request: Request) -> Response:
        tenant = self._tenant(request)
        source = self._sandbox(tenant, request)
        body: w.ForkBody = await self._body(request, w.ForkBody)
        count = body.count if body.count is not None else 1
        if not 1 <= count <= 64:
            raise _E2bError(400, "count must be 1-64")
        if not source.running or source.record is None:
            raise _E2bError(409, f"sandbox {source.id} is paused: connect() to it first")
        timeout = self._timeout(body.timeout)
        held = len(tenant.records) + tenant.creating + tenant.ephemeral
        if tenant.max_live is not None and held + count > tenant.max_live:
            self.tenancy.check_live_quota(tenant)  # the usual 429, when it is the reason
            raise _E2bError(
                429, f"forking {count} would exceed tenant {tenant.name!r}'s max_live quota"
            )
        record = source.record
        tenant.creating += count
        try:
            async with self.tenancy.use(tenant, record):
                children = await record.sandbox.fork(count)
        finally:
            tenant.creating -= count
        results = []
        for child in children:
            forked = E2bSandbox(
                id=new_id(),
                tenant=tenant,
                template=source.template,
                image=source.image,
                metadata=dict(source.metadata),
                env=dict(source.env),
                token=secrets.token_urlsafe(24),
                started_at=time.time(),
                end_at=time.time(),
                workdir=source.workdir,
            )
            self.registry.add(forked)
            self._adopt(forked, child, timeout)
            results.append(w.ForkResult(sandbox=self._answer(forked)))
        return self._json(results, 201)

    # -- snapshots (templates of their tenant) ---------------------------------------

    def _snapshot_named(self, tenant: TenantState, name: str) -> E2bSnapshot | None:
        """The tenant's snapshot whose id or name is ``name`` (another tenant's: None)."""
        found = self.snapshots.get(name)
        if found is None:
            found = next((s for s in self.snapshots.values() if s.name == name), None)
        return found if found is not None and found.tenant is tenant else None

    def _snapshot_answer(self, snapshot: E2bSnapshot) -> w.SnapshotInfo:
        return w.SnapshotInfo(snapshot_id=snapshot.id, names=[snapshot.name or snapshot.id])

    async def snapshot(self, request: Request) -> Response:
        tenant = self._tenant(request)
        sandbox = self._sandbox(tenant, request)
        body: w.SnapshotBody = await self._body(request, w.SnapshotBody)
        if body.memory is not False:
            raise _unsupported(
                "a memory snapshot",
                "processes cannot be frozen here; create_snapshot(memory=False) keeps the "
                "sandbox's files (a sandbox made from it starts without its processes)",
            )
        if body.name is not None and not NAME.fullmatch(body.name):
            raise _E2bError(400, "a snapshot name is 1-100 of a-z, 0-9, '.', '_', '-'")
        if body.name is not None and self._snapshot_named(tenant, body.name) is not None:
            raise _E2bError(409, f"this tenant has a snapshot named {body.name!r} already")
        if not sandbox.running or sandbox.record is None:
            raise _E2bError(409, f"sandbox {sandbox.id} is paused: connect() to it first")
        record = sandbox.record
        async with self.tenancy.use(tenant, record):
            taken = await record.sandbox.snapshot(keep=True)  # the tenant's to delete
        tenant.snapshots.add(taken.id)
        snapshot = E2bSnapshot(
            id=taken.id,
            tenant=tenant,
            source=sandbox.id,
            template=sandbox.template,
            image=sandbox.image,
            workdir=sandbox.workdir,
            name=body.name,
        )
        self.snapshots[snapshot.id] = snapshot
        return self._json(self._snapshot_answer(snapshot), 201)

    async def list_snapshots(self, request: Request) -> Response:
        tenant = self._tenant(request)
        query = request.query_params
        source, name = query.get("sandboxID"), query.get("name")
        chosen = sorted(
            (
                s
                for s in self.snapshots.values()
                if s.tenant is tenant
                and (source is None or s.source == source)
                and (name is None or name in (s.name, s.id))
            ),
            key=lambda s: s.id,
        )
        return self._json([self._snapshot_answer(s) for s in chosen])

    async def delete_template(self, request: Request) -> Response:
        tenant = self._tenant(request)
        template_id = request.path_params["template_id"]
        snapshot = self._snapshot_named(tenant, template_id)
        if snapshot is None:
            if template_id in self.templates:
                raise _E2bError(400, f"template {template_id!r} is this server's (--e2b-template)")
            raise _E2bError(404, f"template {template_id[:100]!r} not found")
        self.snapshots.pop(snapshot.id, None)
        tenant.snapshots.discard(snapshot.id)
        # Sandboxes made from it keep working (their files are their own).
        with anyio.CancelScope(shield=True):
            with suppress(SandboxError):  # a leftover snapshot: the backend's gc removes it
                await self.server.session.delete_snapshot(snapshot.id)
        return Response(status_code=204)

    # -- describing -----------------------------------------------------------------------

    def _listed(self, sandbox: E2bSandbox) -> w.ListedSandbox:
        return w.ListedSandbox(**self._described(sandbox))

    def _detail(self, sandbox: E2bSandbox) -> w.SandboxDetail:
        return w.SandboxDetail(**self._described(sandbox), envd_access_token=sandbox.token)

    def _described(self, sandbox: E2bSandbox) -> dict[str, Any]:
        return {
            "template_id": sandbox.template,
            "sandbox_id": sandbox.id,
            "client_id": "asyncsandbox",
            "started_at": _iso(sandbox.started_at),
            "end_at": _iso(sandbox.end_at),
            "envd_version": ENVD_VERSION,
            "cpu_count": sandbox.cpu_count,
            "memory_mb": sandbox.memory_mb,
            "disk_size_mb": 0,
            "metadata": sandbox.metadata,
            "state": sandbox.state,
        }

    async def info(self, request: Request) -> Response:
        tenant = self._tenant(request)
        return self._json(self._detail(self._sandbox(tenant, request)))

    def _select(self, tenant: TenantState, request: Request) -> list[E2bSandbox]:
        query = request.query_params
        wanted_meta = dict(parse_qsl(query.get("metadata", ""), keep_blank_values=True))
        states = {s for s in query.get("state", "").split(",") if s}
        unknown = states - {"running", "paused"}
        if unknown:
            raise _E2bError(400, f"unknown state {sorted(unknown)}; known: paused, running")
        template = query.get("template")
        after = _timestamp(query.get("startedAfter"))
        chosen = [
            s
            for s in self.registry.of(tenant)
            if all(s.metadata.get(k) == v for k, v in wanted_meta.items())
            and (not states or s.state in states)
            and (template is None or s.template == template)
            and (after is None or s.started_at >= after - 1e-3)
        ]
        order = query.get("order") or "desc"
        if order not in ("asc", "desc"):
            raise _E2bError(400, "order must be asc or desc")
        # Newest first unless asked otherwise, as E2B lists them.
        chosen.sort(key=lambda s: (s.started_at, s.id), reverse=order == "desc")
        return chosen

    async def list_v1(self, request: Request) -> Response:
        tenant = self._tenant(request)
        return self._json([self._listed(s) for s in self._select(tenant, request)])

    async def list_v2(self, request: Request) -> Response:
        tenant = self._tenant(request)
        chosen = self._select(tenant, request)
        raw_limit = request.query_params.get("limit")
        try:
            limit = int(raw_limit) if raw_limit else 100
        except ValueError:
            raise _E2bError(400, "limit must be an integer") from None
        if not 1 <= limit <= 1000:
            raise _E2bError(400, "limit must be 1-1000")
        token = request.query_params.get("nextToken")
        if token:
            ids = [s.id for s in chosen]
            start = ids.index(token) if token in ids else len(ids)
            chosen = chosen[start:]
        page, rest = chosen[:limit], chosen[limit:]
        headers = {"x-next-token": rest[0].id} if rest else {}
        return self._json([self._listed(s) for s in page], 200, **headers)

    # -- ending and extending ----------------------------------------------------------------

    async def kill(self, request: Request) -> Response:
        tenant = self._tenant(request)
        sandbox = self._sandbox(tenant, request)
        self.registry.forget(sandbox.id)
        if sandbox.watchers is not None:
            sandbox.watchers.close()
        if sandbox.record is not None:
            await self.tenancy.drop(sandbox.record)
        if sandbox.snapshot is not None:
            with anyio.CancelScope(shield=True):
                with suppress(SandboxError):  # a leftover snapshot: the backend's gc removes it
                    await self.server.session.delete_snapshot(sandbox.snapshot)
            tenant.snapshots.discard(sandbox.snapshot)
        return Response(status_code=204)

    async def set_timeout(self, request: Request) -> Response:
        tenant = self._tenant(request)
        sandbox = self._sandbox(tenant, request)
        body: w.TimeoutBody = await self._body(request, w.TimeoutBody)
        if body.timeout is None:
            raise _E2bError(400, "timeout is required")
        if sandbox.running:
            sandbox.set_timeout(self._timeout(body.timeout))
        return Response(status_code=204)

    async def refresh(self, request: Request) -> Response:
        tenant = self._tenant(request)
        sandbox = self._sandbox(tenant, request)
        body: w.RefreshBody = await self._body(request, w.RefreshBody)
        timeout = self._timeout(body.duration)
        if sandbox.running and time.time() + timeout > sandbox.end_at:
            sandbox.set_timeout(timeout)
        return Response(status_code=204)

    async def not_offered(self, request: Request) -> Response:
        self._tenant(request)
        raise _E2bError(
            501,
            f"{request.method} {request.url.path[:200]} is not offered by asyncsandbox serve "
            "(template builds, snapshots as templates, secrets, volumes, metrics, logs and "
            "network controls are E2B cloud features)",
        )
