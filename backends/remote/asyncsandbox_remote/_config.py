"""Server configuration and tenants (API keys).

No ``from __future__ import annotations``: the structs' annotations are evaluated here, so
that msgspec and :func:`typing.get_type_hints` still resolve them once
:mod:`asyncsandbox_remote.server` claims the structs as its own.
"""

import hashlib
import os
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Literal

import msgspec

from asyncsandbox import InvalidArgument, Limits, Timeouts

__all__ = ("ServerConfig", "Tenant", "load_tenants")

KEYS_ENV = "ASYNCSANDBOX_API_KEYS"
MIN_KEY_LENGTH = 16
_TENANT_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,63}")


class ServerConfig(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """How ``asyncsandbox serve`` runs. Frozen; unknown fields are rejected (a typo is an
    error, not a silent default), like every configuration struct of asyncsandbox."""

    backend: str = "process"
    """The backend the server runs sandboxes on: ``process``, ``docker`` or a plugin's."""
    backend_options: dict[str, Any] = msgspec.field(default_factory=dict)
    host: str = "127.0.0.1"
    port: int = 8765
    """TCP port; 0 picks a free one (the server prints the address it listens on)."""
    tls_cert: str | None = None
    """PEM certificate (chain) file; with ``tls_key``, the server speaks HTTPS."""
    tls_key: str | None = None
    lease_seconds: float = 60.0
    """Default lease: a sandbox nobody used or renewed for this long is removed."""
    max_lease_seconds: float = 3600.0
    """Longest lease a client may ask for."""
    max_live_per_tenant: int | None = 64
    """Sandboxes one tenant may have at once (creates beyond it answer 429)."""
    max_execs_per_tenant: int | None = 128
    """Commands and file transfers one tenant may run at once (beyond it: 429)."""
    max_request_bytes: int = 16 * 1024 * 1024
    """Largest JSON request body (exec stdin travels in it, base64): beyond it, 413."""
    max_file_bytes: int = 256 * 1024 * 1024
    """Largest body of a file write (held in memory while written): beyond it, 413."""
    max_upload_bytes: int | None = 8 * 1024 * 1024 * 1024
    """Largest streamed tar upload (never held in memory); ``None``: unbounded."""
    allow_host_network: bool = False
    """Let tenants ask for ``network="host"`` (off: only ``none``)."""
    on_shutdown: Literal["remove", "keep"] = "remove"
    """What happens to live sandboxes when the server stops."""
    shutdown_grace: float = 10.0
    """Seconds in-flight requests get to finish on SIGTERM before they are cancelled."""
    ping_interval: float = 10.0
    """Seconds of silence after which a streaming exec sends a ping frame."""
    idempotency_ttl: float = 24 * 3600.0
    """How long an idempotency key is remembered."""
    e2b_templates: dict[str, str | None] = msgspec.field(default_factory=dict)
    """E2B template names and the images their sandboxes run (the E2B-compatible API);
    ``base`` and ``code-interpreter-v1`` run the backend's default image unless named."""
    e2b_max_timeout: float = 24 * 3600.0
    """Longest lifetime an E2B sandbox may ask for (``timeout``, ``set_timeout``)."""
    sweep: bool = True
    """On start, remove sandboxes of dead owners (a crashed server's) on the backend."""
    limits: Limits = msgspec.field(default_factory=Limits)
    """Limits of the server's Session: they protect the backend, over all tenants."""
    timeouts: Timeouts = msgspec.field(default_factory=Timeouts)

    def __post_init__(self) -> None:
        if not 0 <= self.port <= 65535:
            raise InvalidArgument(f"port must be 0-65535, got {self.port}")
        if (self.tls_cert is None) != (self.tls_key is None):
            raise InvalidArgument("tls_cert and tls_key go together")
        for name in (
            "lease_seconds",
            "max_lease_seconds",
            "shutdown_grace",
            "ping_interval",
            "e2b_max_timeout",
        ):
            value = getattr(self, name)
            if not value > 0 or value == float("inf"):
                raise InvalidArgument(f"{name} must be a positive number of seconds")
        if self.lease_seconds > self.max_lease_seconds:
            raise InvalidArgument("lease_seconds must not exceed max_lease_seconds")
        for name in ("max_live_per_tenant", "max_execs_per_tenant", "max_upload_bytes"):
            value = getattr(self, name)
            if value is not None and value < 1:
                raise InvalidArgument(f"{name} must be >= 1 or None")
        for name in ("max_request_bytes", "max_file_bytes"):
            if getattr(self, name) < 1024:
                raise InvalidArgument(f"{name} must be at least 1024")
        if self.on_shutdown not in ("remove", "keep"):
            raise InvalidArgument("on_shutdown must be 'remove' or 'keep'")


class Tenant(msgspec.Struct, frozen=True, kw_only=True):
    """One API key and the tenant it authenticates. Only the key's SHA-256 is kept."""

    name: str
    key_digest: bytes
    max_live: int | None = None
    """Overrides ``ServerConfig.max_live_per_tenant`` when set."""
    max_execs: int | None = None
    """Overrides ``ServerConfig.max_execs_per_tenant`` when set."""

    @classmethod
    def from_key(cls, name: str, key: str, **quotas: int | None) -> "Tenant":
        """A tenant ``name`` authenticated by ``key`` (at least 16 characters)."""
        if not _TENANT_NAME.fullmatch(name):
            raise InvalidArgument(
                f"invalid tenant name {name!r}: letters, digits, '_', '.', '-' (max 64)"
            )
        key = key.strip()
        if len(key) < MIN_KEY_LENGTH or not key.isprintable() or " " in key:
            raise InvalidArgument(
                f"the key of tenant {name!r} must be at least {MIN_KEY_LENGTH} printable "
                "characters without spaces"
            )
        return cls(name=name, key_digest=digest(key), **quotas)

    def __repr__(self) -> str:
        return f"Tenant({self.name!r})"  # never the key material


def digest(key: str) -> bytes:
    """What a key is compared as (in constant time, see the server's authentication)."""
    return hashlib.sha256(key.encode()).digest()


def _parse_entries(text: str, origin: str) -> list[Tenant]:
    tenants = []
    for number, raw in enumerate(text.replace(",", "\n").splitlines(), 1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        name, sep, key = line.partition(":")
        if not sep:
            # Never echo the line: it may be a key.
            raise InvalidArgument(f"{origin}, entry {number}: expected TENANT:KEY")
        tenants.append(Tenant.from_key(name.strip(), key))
    return tenants


def load_tenants(
    path: str | os.PathLike[str] | None, env: Mapping[str, str] | None = None
) -> tuple[Tenant, ...]:
    """Tenants from a keys file and from ``$ASYNCSANDBOX_API_KEYS``.

    Both hold ``TENANT:KEY`` entries (the file one per line, ``#`` comments allowed; the
    variable separated by commas). A tenant may have several keys (rotation); a key
    belongs to one tenant only.
    """
    tenants: list[Tenant] = []
    if path is not None:
        tenants += _parse_entries(Path(path).read_text(), f"keys file {os.fspath(path)}")
    value = (os.environ if env is None else env).get(KEYS_ENV, "")
    if value:
        tenants += _parse_entries(value, KEYS_ENV)
    owners: dict[bytes, str] = {}
    for tenant in tenants:
        if owners.setdefault(tenant.key_digest, tenant.name) != tenant.name:
            raise InvalidArgument(
                f"one key is given to two tenants ({owners[tenant.key_digest]!r} and "
                f"{tenant.name!r})"
            )
    return tuple(tenants)
