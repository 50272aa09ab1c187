"""What the E2B-compatible API knows about each of its sandboxes, beyond the tenancy's
record: the E2B id (kept across a filesystem-only pause, whose resumed sandbox is a new
one of the backend), the envd access token, the template, metadata and environment, the
lifetime, and the commands and watchers running in it.

An E2B sandbox is *running* (it has a live :class:`~.._tenancy.Record`), *paused* (it has
a snapshot and no record: ``pause(keep_memory=False)``), or gone (forgotten).
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import secrets
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from .._tenancy import Record, TenantState

if TYPE_CHECKING:
    from ._fs import Filesystem
    from ._processes import Processes
    from ._watch import Watchers

__all__ = ("E2bSandbox", "Registry", "new_id")

ENVD_VERSION = "0.6.4"
"""The envd version advertised. It gates the SDK's features (``e2b/envd/versions.py``):
stdin control (0.3.0), a default user (0.4.0), closing stdin (0.5.2), octet-stream uploads
(0.5.7), file metadata as ``user.e2b.*`` extended attributes (0.6.2), entries in watch
events (0.6.3), watching directories on network mounts (0.6.4: the watchers poll, which
works on any filesystem)."""


def new_id() -> str:
    """A fresh E2B sandbox id (unguessable: 20 random lowercase characters)."""
    alphabet = "abcdefghijklmnopqrstuvwxyz0123456789"
    return "".join(secrets.choice(alphabet) for _ in range(20))


@dataclass(eq=False)
class E2bSandbox:
    """One sandbox of the E2B-compatible API (see the module docstring)."""

    id: str
    tenant: TenantState
    template: str
    image: str | None
    metadata: dict[str, str]
    env: dict[str, str]
    token: str
    started_at: float
    """``time.time()`` of the create (or of the resume after a pause)."""
    end_at: float
    """``time.time()`` at which the server removes it (its ``timeout``)."""
    record: Record | None = None
    processes: Processes | None = None
    fs: Filesystem | None = None
    watchers: Watchers | None = None
    snapshot: str | None = None
    """While paused: the snapshot it resumes from."""
    workdir: str = "/home/user"
    """The working directory of its commands: E2B's home, or the one its creator asked
    for (``X-Asyncsandbox-Workdir``, the e2b backend's)."""
    cpu_count: int = 1
    memory_mb: int = 512
    busy: int = field(default=0)
    """Lifecycle operations in progress (pause, resume, fork): one at a time."""

    @property
    def running(self) -> bool:
        record = self.record
        return (
            record is not None
            and not record.removing
            and self.snapshot is None
            and time.time() < self.end_at
        )

    @property
    def paused(self) -> bool:
        return self.snapshot is not None

    def token_matches(self, presented: str) -> bool:
        return hmac.compare_digest(presented.encode(), self.token.encode())

    @property
    def traffic_token(self) -> str:
        """The sandbox's traffic token (E2B's ``trafficAccessToken``, which its code
        interpreter's SDK sends with every request): derived from its access token, so it
        lives as long (a pause keeps it)."""
        digest = hmac.new(self.token.encode(), b"e2b traffic", hashlib.sha256).digest()
        return base64.urlsafe_b64encode(digest).rstrip(b"=").decode()

    def traffic_matches(self, presented: str) -> bool:
        return hmac.compare_digest(presented.encode(), self.traffic_token.encode())

    def signs(self, signature: str, path: str, operation: str, user: str, expiration: str) -> bool:
        """Whether ``signature`` is this sandbox's for a file URL (E2B's v1 signature:
        the SDK's ``download_url``/``upload_url``, which carry no headers)."""
        raw = f"{path}:{operation}:{user}:{self.token}" + (f":{expiration}" if expiration else "")
        digest = base64.b64encode(hashlib.sha256(raw.encode()).digest()).rstrip(b"=").decode()
        return hmac.compare_digest(signature.encode(), f"v1_{digest}".encode())

    def set_timeout(self, seconds: float) -> None:
        """Make the sandbox end ``seconds`` from now (E2B's ``set_timeout``)."""
        self.end_at = time.time() + seconds
        if self.record is not None:
            self.record.set_lifetime(seconds)

    @property
    def state(self) -> str:
        return "paused" if self.paused else "running"


class Registry:
    """Every E2B sandbox of the server, by E2B id. Sandboxes whose record the tenancy
    removed (their lifetime ended, or the server's ``DELETE``) are forgotten lazily, when
    they are next looked up or listed."""

    def __init__(self) -> None:
        self._sandboxes: dict[str, E2bSandbox] = {}

    def add(self, sandbox: E2bSandbox) -> None:
        self._sandboxes[sandbox.id] = sandbox

    def forget(self, sandbox_id: str) -> E2bSandbox | None:
        return self._sandboxes.pop(sandbox_id, None)

    def get(self, sandbox_id: str) -> E2bSandbox | None:
        """The sandbox ``sandbox_id`` while it runs or is paused (None otherwise)."""
        found = self._sandboxes.get(sandbox_id)
        if found is None:
            return None
        if found.paused or found.running or found.busy:
            return found
        self._sandboxes.pop(sandbox_id, None)
        return None

    def running(self) -> list[E2bSandbox]:
        """Every sandbox that runs."""
        return [s for s in list(self._sandboxes.values()) if s.running]

    def of(self, tenant: TenantState) -> list[E2bSandbox]:
        """The tenant's sandboxes that run or are paused."""
        return [
            s
            for s in list(self._sandboxes.values())
            if s.tenant is tenant and self.get(s.id) is not None
        ]
