"""Who owns what, for how long, and how much of it: tenants and their API keys, the
records of their sandboxes, leases, quotas, and what their idempotency keys stand for.

* **Tenancy.** Every sandbox is a record owned by one tenant; a lookup by another tenant
  answers 404 exactly as an unknown id does, so ids of others cannot be probed. The
  client's labels are stored in the record and returned verbatim; on the backend the
  sandbox carries the server's own owner labels plus a ``remote-tenant:NAME`` tag.
* **Quotas** refuse at once (429) rather than queue: they are counters checked before
  any work starts (the server Session's limits, which protect the backend, queue).
* **Leases.** Each record has a lease, renewed by every use and by heartbeats;
  :meth:`Tenancy.reap` removes sandboxes whose lease expired and that have no request in
  flight: the sandboxes of a client that vanished.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import time
from collections import OrderedDict, deque
from collections.abc import AsyncIterator, Iterable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from enum import StrEnum

import anyio
from starlette.requests import Request

from asyncsandbox import InvalidArgument, Sandbox, SandboxError
from asyncsandbox.log import get_logger

from . import _wire as w
from ._config import ServerConfig, Tenant
from ._errors import HttpError, bad_request, not_found
from ._metrics import Metrics

__all__ = ("Activity", "Creation", "CreationState", "Record", "TenantState", "Tenancy")

log = get_logger("asyncsandbox.remote")

TENANT_TAG_PREFIX = "remote-tenant:"
MAX_TOMBSTONES = 1024
"""Ids of commands cancelled before they arrived, remembered per sandbox."""


@dataclass(eq=False)
class Activity:
    """One request working on a sandbox; ``scope`` cancels it."""

    scope: anyio.CancelScope = field(default_factory=anyio.CancelScope)
    done: anyio.Event = field(default_factory=anyio.Event)


@dataclass(eq=False)
class Record:
    """One sandbox of a tenant."""

    id: str
    tenant: TenantState
    sandbox: Sandbox
    labels: dict[str, str]
    image: str | None
    workdir: str
    created_at: float
    lease_seconds: float
    lease_deadline: float = 0.0
    busy: int = 0
    execs: dict[str, Activity] = field(default_factory=dict)
    cancelled_execs: deque[str] = field(default_factory=lambda: deque(maxlen=MAX_TOMBSTONES))
    removing: bool = False
    sandbox_backend: str = ""
    lifetime_deadline: float | None = None
    """A fixed end (``time.monotonic()``) instead of a lease: use does not extend it, and
    the reaper removes the sandbox at that time even while it is in use (E2B's
    ``timeout``)."""

    def renew(self) -> None:
        if self.lifetime_deadline is not None:
            self.lease_deadline = self.lifetime_deadline
        else:
            self.lease_deadline = time.monotonic() + self.lease_seconds

    def set_lifetime(self, seconds: float) -> None:
        """End the sandbox ``seconds`` from now (see :attr:`lifetime_deadline`)."""
        self.lifetime_deadline = time.monotonic() + seconds
        self.renew()

    def describe(self, status: str) -> w.SandboxDescription:
        remaining = max(0.0, self.lease_deadline - time.monotonic())
        return w.SandboxDescription(
            id=self.id,
            status=status,
            labels=self.labels,
            image=self.image,
            workdir=self.workdir,
            created_at=self.created_at,
            lease_expires_at=round(time.time() + remaining, 3),
            backend=self.sandbox_backend,
        )


class CreationState(StrEnum):
    PENDING = "pending"
    DONE = "done"
    ABANDONED = "abandoned"


@dataclass(eq=False)
class Creation:
    """What an idempotency key stands for."""

    fingerprint: bytes
    state: CreationState = CreationState.PENDING
    scope: anyio.CancelScope | None = None
    done: anyio.Event = field(default_factory=anyio.Event)
    answer: w.SandboxDescription | None = None
    sandbox_id: str | None = None
    at: float = field(default_factory=time.monotonic)


@dataclass(eq=False)
class TenantState:
    name: str
    max_live: int | None
    max_execs: int | None
    records: dict[str, Record] = field(default_factory=dict)
    creating: int = 0
    ephemeral: int = 0  # sandboxes that live for one request (SandboxFusion's /run_code)
    in_flight: int = 0
    keys: OrderedDict[str, Creation] = field(default_factory=OrderedDict)
    snapshots: set[str] = field(default_factory=set)  # snapshots it took and not deleted

    @property
    def tag(self) -> str:
        return TENANT_TAG_PREFIX + self.name


class Tenancy:
    """The tenants of one server and the records of their sandboxes."""

    def __init__(self, config: ServerConfig, tenants: Iterable[Tenant], metrics: Metrics) -> None:
        self.config = config
        self.metrics = metrics
        self._keys: list[tuple[bytes, TenantState]] = []
        self.tenants: dict[str, TenantState] = {}
        for tenant in tenants:
            state = self.tenants.get(tenant.name)
            if state is None:
                state = self.tenants[tenant.name] = TenantState(
                    tenant.name,
                    tenant.max_live if tenant.max_live is not None else config.max_live_per_tenant,
                    tenant.max_execs
                    if tenant.max_execs is not None
                    else config.max_execs_per_tenant,
                )
            self._keys.append((tenant.key_digest, state))
        if not self._keys:
            raise InvalidArgument(
                "the server needs at least one API key: pass --keys FILE or set "
                "ASYNCSANDBOX_API_KEYS (TENANT:KEY entries)"
            )
        self.records: dict[str, Record] = {}
        """Every tenant's records, by sandbox id."""

    # -- who is asking --------------------------------------------------------------------

    def authenticate(self, request: Request) -> TenantState:
        """The tenant whose key the request carries (401 if none): as a bearer token, or
        as the password of HTTP Basic, which is how clients that cannot send a header
        carry it (``http://user:KEY@host:port``; the user name is not read)."""
        header = request.headers.get("authorization", "")
        scheme, _, credentials = header.partition(" ")
        token = _token(scheme.lower(), credentials.strip())
        found = self.tenant_of(token)
        if found is None:
            self.refused(request, had_key=bool(token))
            raise HttpError(
                401,
                "unauthorized",
                "missing or invalid API key: send 'Authorization: Bearer <key>', or the key "
                "as the password of HTTP Basic (http://user:KEY@host:port)",
                headers={
                    "WWW-Authenticate": 'Bearer realm="asyncsandbox", Basic realm="asyncsandbox"'
                },
            )
        return found

    def tenant_of(self, key: str) -> TenantState | None:
        """The tenant of API key ``key`` (None if it is nobody's), compared in constant
        time. Callers that refuse on None count the failure (:meth:`refuse`)."""
        found: TenantState | None = None
        if key:
            presented = hashlib.sha256(key.encode("utf-8", "surrogateescape")).digest()
            # Constant time: compare against every key, never stop at the first match.
            for key_digest, tenant in self._keys:
                if hmac.compare_digest(presented, key_digest):
                    found = tenant
        return found

    def refused(self, request: Request, *, had_key: bool) -> None:
        """Count and log a request refused for want of a valid key or token."""
        self.metrics.auth_failures += 1
        client = request.client.host if request.client else "?"
        log.warning("remote.auth.failed", client=client, had_token=had_key)

    def record(self, tenant: TenantState, sandbox_id: str) -> Record:
        """The tenant's sandbox ``sandbox_id`` (404 if it has none by that id)."""
        found = tenant.records.get(sandbox_id)
        if found is None or found.removing:
            # Another tenant's sandbox answers exactly like one that does not exist.
            raise not_found(sandbox_id)
        return found

    def counts(self) -> dict[str, tuple[int, int, int]]:
        """(live, creating, in flight) by tenant, for the metrics."""
        return {
            name: (len(t.records) + t.ephemeral, t.creating, t.in_flight)
            for name, t in sorted(self.tenants.items())
        }

    # -- quotas and leases ----------------------------------------------------------------

    def check_live_quota(self, tenant: TenantState) -> None:
        """Refuse (429) a create beyond the tenant's ``max_live`` sandboxes."""
        held = len(tenant.records) + tenant.creating + tenant.ephemeral
        if tenant.max_live is not None and held >= tenant.max_live:
            self.metrics.quota_rejections[(tenant.name, "max_live")] += 1
            log.info("remote.quota.exceeded", tenant=tenant.name, quota="max_live")
            raise HttpError(
                429,
                "quota_exceeded",
                f"tenant {tenant.name!r} has {held} sandboxes "
                f"(its max_live quota is {tenant.max_live}); remove some first",
                retryable=True,
                headers={"Retry-After": "1"},
            )

    def check_exec_quota(self, tenant: TenantState) -> None:
        """Refuse (429) an operation beyond the tenant's ``max_execs`` in flight."""
        if tenant.max_execs is not None and tenant.in_flight >= tenant.max_execs:
            self.metrics.quota_rejections[(tenant.name, "max_execs")] += 1
            log.info("remote.quota.exceeded", tenant=tenant.name, quota="max_execs")
            raise HttpError(
                429,
                "quota_exceeded",
                f"tenant {tenant.name!r} already runs {tenant.in_flight} commands and file "
                f"transfers (its max_execs quota is {tenant.max_execs}); retry when some finish",
                retryable=True,
                headers={"Retry-After": "1"},
            )

    @asynccontextmanager
    async def ephemeral(self, tenant: TenantState) -> AsyncIterator[None]:
        """Account a sandbox that lives for one request and runs its commands in it
        (SandboxFusion's ``/run_code``): it holds one of the tenant's ``max_live``
        sandboxes and one of its ``max_execs`` slots until the request ends. It has no
        record (no id, no lease): the request removes it on every exit path."""
        self.check_live_quota(tenant)
        self.check_exec_quota(tenant)
        tenant.ephemeral += 1
        tenant.in_flight += 1
        try:
            yield
        finally:
            tenant.ephemeral -= 1
            tenant.in_flight -= 1

    @asynccontextmanager
    async def use(
        self, tenant: TenantState, record: Record, *, exec_id: str | None = None
    ) -> AsyncIterator[Activity]:
        """Account one operation on a sandbox: the tenant's exec quota, the lease, and the
        cancel-by-id registry."""
        if exec_id is not None and exec_id in record.cancelled_execs:
            raise HttpError(409, "exec_cancelled", f"exec {exec_id!r} was cancelled")
        if exec_id is not None and exec_id in record.execs:
            raise bad_request(f"exec id {exec_id!r} is already running")
        self.check_exec_quota(tenant)
        activity = Activity()
        tenant.in_flight += 1
        record.busy += 1
        record.renew()
        if exec_id is not None:
            record.execs[exec_id] = activity
        try:
            yield activity
        finally:
            tenant.in_flight -= 1
            record.busy -= 1
            record.renew()
            if exec_id is not None:
                record.execs.pop(exec_id, None)
            activity.done.set()

    async def reap_forever(self) -> None:
        interval = max(0.05, min(self.config.lease_seconds / 4, 5.0))
        while True:
            await anyio.sleep(interval)
            await self.reap()

    async def reap(self) -> list[str]:
        """Remove sandboxes whose lease expired and that nothing uses; forget old keys."""
        now = time.monotonic()
        expired = [
            r
            for r in self.records.values()
            if (r.busy == 0 or r.lifetime_deadline is not None)
            and not r.removing
            and r.lease_deadline <= now
        ]
        for tenant in self.tenants.values():
            while tenant.keys:
                key, creation = next(iter(tenant.keys.items()))
                if (
                    creation.state == CreationState.PENDING
                    or now - creation.at < self.config.idempotency_ttl
                ):
                    break
                del tenant.keys[key]
        if not expired:
            return []

        async def remove(record: Record) -> None:
            log.info("remote.lease.expired", sandbox_id=record.id, tenant=record.tenant.name)
            await self.drop(record)
            self.metrics.leases_expired += 1  # once it is gone: what the metric says

        async with anyio.create_task_group() as tg:
            for record in expired:
                tg.start_soon(remove, record)
        return [r.id for r in expired]

    # -- records --------------------------------------------------------------------------

    def add(self, record: Record) -> None:
        record.renew()
        self.records[record.id] = record
        record.tenant.records[record.id] = record

    async def drop(self, record: Record) -> None:
        """Remove a sandbox and forget it (whatever the removal's outcome)."""
        if record.removing:
            return
        record.removing = True
        try:
            await record.sandbox.stop()
        except SandboxError as exc:
            # stop() always releases; an error only says the removal was not graceful.
            log.warning("remote.sandbox.remove_failed", sandbox_id=record.id, error=str(exc))
        finally:
            self.records.pop(record.id, None)
            record.tenant.records.pop(record.id, None)
        log.debug("remote.sandbox.removed", sandbox_id=record.id, tenant=record.tenant.name)

    def clear(self) -> None:
        """Forget every record (the server's Session removed or kept their sandboxes)."""
        self.records.clear()
        for tenant in self.tenants.values():
            tenant.records.clear()

    # -- idempotency keys -----------------------------------------------------------------

    async def replay(
        self, tenant: TenantState, key: str, fingerprint: bytes
    ) -> w.SandboxDescription | None:
        """The answer of the create this key already stands for, once it is done; None
        when the key is new (or its create failed, which releases the key). Refuses a key
        that was abandoned (409) or used for a different request (422)."""
        creation = tenant.keys.get(key)
        while creation is not None:
            if creation.state == CreationState.ABANDONED:
                raise HttpError(409, "create_abandoned", "the create with this key was abandoned")
            if creation.fingerprint != fingerprint:
                raise HttpError(
                    422,
                    "idempotency_conflict",
                    "this Idempotency-Key was used with a different request",
                )
            if creation.state == CreationState.DONE and creation.answer is not None:
                self.metrics.idempotent_replays += 1
                return creation.answer
            await creation.done.wait()
            creation = tenant.keys.get(key)  # a failed create released the key
        return None

    async def abandon(self, tenant: TenantState, key: str) -> None:
        """The client gave up on the create of ``key``: undo it, and refuse the key from
        now on (also when its request has not arrived yet)."""
        creation = tenant.keys.get(key)
        if creation is None:
            # Not seen yet (the request may still be on its way): refuse it when it comes.
            tenant.keys[key] = Creation(b"", state=CreationState.ABANDONED)
        elif creation.state == CreationState.PENDING:
            creation.state = CreationState.ABANDONED
            if creation.scope is not None:
                creation.scope.cancel()
            with anyio.move_on_after(self.config.timeouts.cleanup):
                await creation.done.wait()
        elif creation.state == CreationState.DONE:
            creation.state = CreationState.ABANDONED
            record = tenant.records.get(creation.sandbox_id or "")
            if record is not None:
                await self.drop(record)


def _token(scheme: str, credentials: str) -> str:
    """The key in an Authorization header's credentials ("" if none)."""
    if scheme == "bearer":
        return credentials
    if scheme == "basic":
        try:
            decoded = base64.b64decode(credentials, validate=True).decode("utf-8")
        except (binascii.Error, ValueError):
            return ""
        return decoded.partition(":")[2]
    return ""
