"""The messages of E2B's control plane as msgspec Structs (E2B's OpenAPI document, as
its SDK's models in ``e2b/api/client/models`` show it): what the handlers decode and
encode, and what the OpenAPI document of E2B's routes (:mod:`._openapi`) is made of."""

from __future__ import annotations

from typing import Any

import msgspec

__all__ = (
    "CreatedSandbox",
    "E2bError",
    "ForkBody",
    "ForkResult",
    "ListedSandbox",
    "NewSandbox",
    "PauseBody",
    "RefreshBody",
    "SandboxDetail",
    "SnapshotBody",
    "SnapshotInfo",
    "TimeoutBody",
    "encode",
)

DEFAULT_TIMEOUT = 300


class NewSandbox(msgspec.Struct, rename="camel", omit_defaults=True):
    """``POST /sandboxes`` and ``/v2/sandboxes`` (E2B's ``NewSandbox``/``NewSandboxV2``)."""

    template_id: str = msgspec.field(name="templateID")
    timeout: int = DEFAULT_TIMEOUT
    auto_pause: bool = False
    auto_pause_memory: bool | None = None
    auto_resume: Any = None
    allow_internet_access: bool | None = None
    network: Any = None
    metadata: dict[str, str] | None = None
    env_vars: dict[str, str] | None = None
    mcp: Any = None
    iam: Any = None
    volume_mounts: Any = None
    secure: bool | None = None


class TimeoutBody(msgspec.Struct, omit_defaults=True):
    """``POST /sandboxes/{id}/timeout`` and the connects."""

    timeout: int | None = None
    memory: bool | None = None
    auto_pause: bool | None = msgspec.field(default=None, name="autoPause")


class RefreshBody(msgspec.Struct, omit_defaults=True):
    """``POST /sandboxes/{id}/refreshes``."""

    duration: int | None = None


class PauseBody(msgspec.Struct, omit_defaults=True):
    memory: bool | None = None
    require_healthy_guest: bool | None = msgspec.field(default=None, name="requireHealthyGuest")


class ForkBody(msgspec.Struct, omit_defaults=True):
    timeout: int | None = None
    count: int | None = None


class SnapshotBody(msgspec.Struct, omit_defaults=True):
    name: str | None = None
    memory: bool | None = None


class CreatedSandbox(msgspec.Struct, kw_only=True):
    """A sandbox made or reached (E2B's ``Sandbox``): what its envd needs."""

    template_id: str = msgspec.field(name="templateID")
    sandbox_id: str = msgspec.field(name="sandboxID")
    client_id: str = msgspec.field(name="clientID")
    envd_version: str = msgspec.field(name="envdVersion")
    envd_access_token: str = msgspec.field(name="envdAccessToken")
    traffic_access_token: str | None = msgspec.field(default=None, name="trafficAccessToken")
    """What the code interpreter's SDK sends with each of its requests (see the router)."""
    domain: str | None = None


class ListedSandbox(msgspec.Struct, kw_only=True):
    """A sandbox in a listing (E2B's ``ListedSandbox``)."""

    template_id: str = msgspec.field(name="templateID")
    sandbox_id: str = msgspec.field(name="sandboxID")
    client_id: str = msgspec.field(name="clientID")
    started_at: str = msgspec.field(name="startedAt")
    end_at: str = msgspec.field(name="endAt")
    envd_version: str = msgspec.field(name="envdVersion")
    cpu_count: int = msgspec.field(name="cpuCount")
    memory_mb: int = msgspec.field(name="memoryMB")
    disk_size_mb: int = msgspec.field(name="diskSizeMB")
    metadata: dict[str, str]
    state: str
    """``running`` or ``paused``."""


class SandboxDetail(ListedSandbox, kw_only=True):
    """``GET /sandboxes/{id}`` (E2B's ``SandboxDetail``)."""

    envd_access_token: str = msgspec.field(name="envdAccessToken")
    domain: str | None = None


class ForkResult(msgspec.Struct):
    sandbox: CreatedSandbox


class SnapshotInfo(msgspec.Struct):
    snapshot_id: str = msgspec.field(name="snapshotID")
    names: list[str] = msgspec.field(default_factory=list)


class E2bError(msgspec.Struct):
    """E2B's error answer."""

    code: int
    message: str


encode = msgspec.json.Encoder().encode
"""Every answer's encoder."""
