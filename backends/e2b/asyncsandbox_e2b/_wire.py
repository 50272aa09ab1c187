"""E2B's wire messages as msgspec Structs: the control plane's JSON (E2B's OpenAPI
document, ``e2b/api/client/models``) and envd's Connect messages in protobuf's JSON
mapping (camelCase names, default values left out, bytes in base64).

Decoding tolerates unknown fields (newer servers add some) and missing ones (proto3 JSON
omits defaults: an ``exitCode`` of 0 is absent).
"""

from __future__ import annotations

from typing import Any

import msgspec

__all__ = (
    "ConnectEnd",
    "ConnectErrorBody",
    "EndEvent",
    "ErrorBody",
    "ListedSandbox",
    "NewSandbox",
    "ProcessConfig",
    "ProcessEvent",
    "SandboxAnswer",
    "SandboxDetail",
    "SendSignal",
    "SnapshotInfo",
    "StartRequest",
    "StartResponse",
)


# -- the control plane ------------------------------------------------------------------


class NewSandbox(msgspec.Struct, kw_only=True, omit_defaults=True):
    """``POST /v2/sandboxes``."""

    template_id: str = msgspec.field(name="templateID")
    timeout: int
    """Seconds the sandbox lives unless its timeout is moved."""
    metadata: dict[str, str] = msgspec.field(default_factory=dict)
    env_vars: dict[str, str] = msgspec.field(default_factory=dict, name="envVars")
    allow_internet_access: bool | None = msgspec.field(default=None, name="allowInternetAccess")


class SandboxAnswer(msgspec.Struct, kw_only=True):
    """The answer to a create or a connect."""

    sandbox_id: str = msgspec.field(name="sandboxID")
    template_id: str = msgspec.field(default="", name="templateID")
    envd_version: str = msgspec.field(default="", name="envdVersion")
    envd_access_token: str | None = msgspec.field(default=None, name="envdAccessToken")
    domain: str | None = None


class ListedSandbox(msgspec.Struct, kw_only=True):
    """A sandbox in a listing (``GET /v2/sandboxes``)."""

    sandbox_id: str = msgspec.field(name="sandboxID")
    template_id: str = msgspec.field(default="", name="templateID")
    started_at: str = msgspec.field(default="", name="startedAt")
    end_at: str = msgspec.field(default="", name="endAt")
    state: str = "running"
    metadata: dict[str, str] | None = None


class SandboxDetail(ListedSandbox, kw_only=True):
    """``GET /sandboxes/{id}``."""

    envd_access_token: str | None = msgspec.field(default=None, name="envdAccessToken")
    domain: str | None = None


class SnapshotInfo(msgspec.Struct, kw_only=True):
    """``POST /sandboxes/{id}/snapshots``: a template to create sandboxes from."""

    snapshot_id: str = msgspec.field(name="snapshotID")
    names: list[str] = msgspec.field(default_factory=list)


class ErrorBody(msgspec.Struct):
    """E2B's error answer, ``{code, message}``."""

    code: int | str | None = None
    message: str = ""


# -- envd (Connect, JSON codec) ---------------------------------------------------------


class ProcessConfig(msgspec.Struct, kw_only=True, omit_defaults=True):
    cmd: str
    args: list[str] = msgspec.field(default_factory=list)
    envs: dict[str, str] = msgspec.field(default_factory=dict)
    cwd: str | None = None


class StartRequest(msgspec.Struct, kw_only=True, omit_defaults=True):
    """``process.Process/Start``."""

    process: ProcessConfig
    stdin: bool | None = None
    tag: str | None = None


class StartEvent(msgspec.Struct):
    pid: int = 0


class DataEvent(msgspec.Struct):
    stdout: bytes | None = None
    stderr: bytes | None = None
    pty: bytes | None = None


class EndEvent(msgspec.Struct, rename="camel"):
    exit_code: int = 0
    exited: bool = False
    status: str = ""
    error: str | None = None


class ProcessEvent(msgspec.Struct):
    start: StartEvent | None = None
    data: DataEvent | None = None
    end: EndEvent | None = None
    keepalive: dict[str, Any] | None = None


class StartResponse(msgspec.Struct):
    event: ProcessEvent | None = None


class ProcessSelector(msgspec.Struct, omit_defaults=True):
    pid: int | None = None


class SendSignal(msgspec.Struct):
    """``process.Process/SendSignal``."""

    process: ProcessSelector
    signal: str
    """``SIGNAL_SIGTERM`` or ``SIGNAL_SIGKILL``."""


class ConnectErrorBody(msgspec.Struct):
    """A Connect error: a unary call's error answer, or the error of a stream's end."""

    code: str = "unknown"
    message: str = ""


class ConnectEnd(msgspec.Struct):
    """The end-of-stream message of a Connect stream (its last envelope, flag 0x02)."""

    error: ConnectErrorBody | None = None
    metadata: dict[str, Any] | None = None


def pid_selector(pid: int) -> ProcessSelector:
    return ProcessSelector(pid=pid)
