"""The wire format between :class:`~asyncsandbox_remote.RemoteBackend` and the server.

Every message is a msgspec Struct encoded as JSON. The types are designed to evolve:
every field added later has a default, and decoders tolerate unknown fields (so an old
client talks to a new server and the other way round). Never add
``forbid_unknown_fields`` here; configuration structs reject unknown fields, messages do
not. Streaming exec output is NDJSON: one :data:`ExecFrame` per line, and a client skips
frame types it does not know.

Each type has one reusable :class:`Codec` (a msgspec encoder and a typed decoder), and
:func:`openapi` builds the OpenAPI 3.1 document from the same types.
"""

from __future__ import annotations

from typing import Annotated, Any, Generic, TypeVar

import msgspec
from msgspec import Meta

from asyncsandbox import CodeContext, Execution, ExecutionError, OutputMessage, Result
from asyncsandbox.abc import CodeRequest
from asyncsandbox.judge import JudgeRequest, JudgeResult

__all__ = (
    "API_VERSION",
    "Codec",
    "CodeContextList",
    "CodeFrame",
    "CodeEndFrame",
    "NewCodeContext",
    "CreateSandbox",
    "DeletedSandboxes",
    "ErrorBody",
    "ErrorResponse",
    "ErrorFrame",
    "ExecFrame",
    "ExecRequest",
    "ExecResponse",
    "ExitFrame",
    "Health",
    "LeaseRenewal",
    "Leases",
    "OutputFrame",
    "PingFrame",
    "ResourceLimits",
    "SandboxDescription",
    "SandboxList",
    "ServerInfo",
    "SnapshotCreated",
)

API_VERSION = "v1"

T = TypeVar("T")

# -- constrained scalars (the server rejects what no sane client sends) -----------------

ShortText = Annotated[str, Meta(min_length=1, max_length=1024)]
Path = Annotated[str, Meta(min_length=1, max_length=4096)]
EnvKey = Annotated[str, Meta(min_length=1, max_length=1024)]
EnvValue = Annotated[str, Meta(max_length=128 * 1024)]
LabelKey = Annotated[str, Meta(min_length=1, max_length=512)]
LabelValue = Annotated[str, Meta(max_length=1024)]
Env = Annotated[dict[EnvKey, EnvValue], Meta(max_length=1024)]
Labels = Annotated[dict[LabelKey, LabelValue], Meta(max_length=256)]
Seconds = Annotated[float, Meta(ge=0, le=10 * 365 * 86400)]
PositiveSeconds = Annotated[float, Meta(gt=0, le=10 * 365 * 86400)]
SandboxId = Annotated[str, Meta(min_length=1, max_length=128)]


class _Message(msgspec.Struct, kw_only=True):
    """Base of every wire message: keyword-only; unknown fields are ignored on decoding."""


# -- sandboxes ----------------------------------------------------------------------------


class ResourceLimits(_Message, kw_only=True):
    """Resource limits of one sandbox; ``null`` means no limit (as ``asyncsandbox.Resources``)."""

    cpus: Annotated[float, Meta(gt=0, le=4096)] | None = None
    memory_mb: Annotated[int, Meta(ge=1, le=16 * 1024 * 1024)] | None = 1024
    pids: Annotated[int, Meta(ge=1, le=4 * 1024 * 1024)] | None = 512


class CreateSandbox(_Message, kw_only=True):
    """Body of ``POST /v1/sandboxes``. Send an ``Idempotency-Key`` header to make retries
    safe: a create repeated with the same key returns the first one's sandbox."""

    image: ShortText | None = None
    env: Env = msgspec.field(default_factory=dict)
    workdir: Path = "/workspace"
    resources: ResourceLimits = msgspec.field(default_factory=ResourceLimits)
    network: Annotated[str, Meta(min_length=1, max_length=64)] = "none"
    labels: Labels = msgspec.field(default_factory=dict)
    """Stored verbatim, returned in :class:`SandboxDescription` and matched by list filters."""
    max_lifetime: PositiveSeconds | None = 3600.0
    """Seconds after which the sandbox is removed whatever happens."""
    lease_seconds: PositiveSeconds | None = None
    """How long the sandbox survives without being used or renewed (``null``: the
    server's default; capped by the server's maximum)."""
    snapshot: ShortText | None = None
    """Start from this snapshot of the tenant's (``POST /v1/sandboxes/{id}/snapshot``);
    ``image`` is then the snapshot's."""


class SandboxDescription(_Message, kw_only=True):
    """A sandbox as the server describes it to its tenant."""

    id: str
    status: str
    """``creating``, ``running``, ``stopped``, ``removing`` or ``dead`` (clients treat
    unknown values as ``dead``)."""
    labels: dict[str, str] = msgspec.field(default_factory=dict)
    image: str | None = None
    workdir: str = "/workspace"
    created_at: float | None = None
    """Unix time."""
    lease_expires_at: float | None = None
    """Unix time at which the server reaps the sandbox unless it is used or renewed."""
    backend: str = ""
    """The backend the server runs it on."""


class SandboxList(_Message, kw_only=True):
    """Answer of ``GET /v1/sandboxes``."""

    items: list[SandboxDescription] = msgspec.field(default_factory=list)


class DeletedSandboxes(_Message, kw_only=True):
    """Answer of ``DELETE /v1/sandboxes``: the ids now gone."""

    ids: list[str] = msgspec.field(default_factory=list)


class LeaseRenewal(_Message, kw_only=True):
    """Body of ``POST /v1/leases``: renew the leases of these sandboxes at once."""

    ids: Annotated[list[SandboxId], Meta(max_length=10_000)] = msgspec.field(default_factory=list)


class Leases(_Message, kw_only=True):
    """Answer of a lease renewal."""

    renewed: list[str] = msgspec.field(default_factory=list)
    missing: list[str] = msgspec.field(default_factory=list)
    """Ids the tenant has no sandbox with (removed, reaped, or never its own)."""
    lease_seconds: float = 0.0


# -- commands -----------------------------------------------------------------------------


class ExecRequest(_Message, kw_only=True):
    """Body of ``POST /v1/sandboxes/{id}/exec`` and ``.../exec/stream``."""

    argv: Annotated[list[Annotated[str, Meta(max_length=128 * 1024)]], Meta(min_length=1)]
    cwd: Path | None = None
    """Working directory; relative to the sandbox's workdir; ``null``: the workdir."""
    env: Env = msgspec.field(default_factory=dict)
    stdin: bytes | None = None
    """Base64 in JSON. ``null``: an empty stdin."""
    timeout: Seconds | None = None
    """The command's own limit; on expiry its process tree is killed and the result says
    ``timed_out``. ``null``: no limit."""
    max_output_bytes: Annotated[int, Meta(ge=1, le=1024 * 1024 * 1024)] | None = None
    """Unary exec only: output kept per stream (head and tail); ``null``: 1 MiB."""
    exec_id: Annotated[str, Meta(min_length=1, max_length=128)] | None = None
    """Client-chosen id; ``DELETE /v1/sandboxes/{id}/execs/{exec_id}`` kills the command."""


class ExecResponse(_Message, kw_only=True):
    """Answer of the unary exec: what the command produced. A timeout is data here."""

    returncode: int
    stdout: bytes = b""
    stderr: bytes = b""
    duration: float = 0.0
    timed_out: bool = False
    stdout_truncated: bool = False
    stderr_truncated: bool = False
    stdout_size: int = 0
    stderr_size: int = 0
    signal: int | None = None
    oom_killed: bool = False
    cpu_time: float | None = None


class OutputFrame(_Message, kw_only=True, tag_field="type", tag="output"):
    """A piece of output, in the order the command wrote it."""

    stream: str
    """``stdout`` or ``stderr``."""
    data: bytes = b""


class ExitFrame(_Message, kw_only=True, tag_field="type", tag="exit"):
    """The command ended (the last frame of a successful stream)."""

    returncode: int
    signal: int | None = None
    oom_killed: bool = False
    timed_out: bool = False
    duration: float = 0.0
    stdout_size: int = 0
    stderr_size: int = 0
    cpu_time: float | None = None


class PingFrame(_Message, kw_only=True, tag_field="type", tag="ping"):
    """Sent while a command is silent, so clients can tell a quiet command from a dead link."""


class ErrorBody(_Message, kw_only=True):
    """What went wrong. ``code`` is stable and machine-readable; ``message`` is for people."""

    code: str
    """``launch_error`` (502): the backend could not start the command, which never ran;
    ``sandbox_died`` (410), ``backend_unavailable`` (503), ``file_error``, ..."""
    message: str
    sandbox_id: str | None = None
    reason: str | None = None
    """For ``file_error``: not_found, is_a_directory, ...; for ``sandbox_died``: why."""
    path: str | None = None
    detail: str | None = None
    retryable: bool = False


class ErrorFrame(_Message, kw_only=True, tag_field="type", tag="error"):
    """The exec failed for a reason other than the command's outcome (the last frame)."""

    error: ErrorBody


ExecFrame = OutputFrame | ExitFrame | PingFrame | ErrorFrame
"""One line of a streaming exec answer (NDJSON)."""


class _FrameType(msgspec.Struct):
    type: str = ""


class ErrorResponse(_Message, kw_only=True):
    """The body of every 4xx/5xx answer."""

    error: ErrorBody


# -- server -------------------------------------------------------------------------------


class Health(_Message, kw_only=True):
    """Answer of ``GET /v1/health`` (no authentication)."""

    status: str = "ok"
    """``ok``, or ``shutting_down`` once the server stopped taking new work."""
    version: str = ""


class Capabilities(_Message, kw_only=True):
    """What the served backend supports (see ``asyncsandbox.abc.BackendCapabilities``)."""

    isolation: str = ""
    enforced_limits: list[str] = msgspec.field(default_factory=list)
    best_effort_limits: bool = False
    """Limits outside ``enforced_limits`` are applied where they can be, not refused."""
    limits_note: str = ""
    network_modes: list[str] = msgspec.field(default_factory=lambda: ["none"])
    reports_signal: bool = False
    snapshots: bool = False
    reset: bool = False
    """``POST /v1/sandboxes/{id}/reset`` works (sandboxes can be recycled)."""


class SnapshotCreated(_Message, kw_only=True):
    """Answer of ``POST /v1/sandboxes/{id}/snapshot``: the new snapshot, which the tenant
    starts sandboxes from (``CreateSandbox.snapshot``) until it deletes it."""

    id: str


class ServerInfo(_Message, kw_only=True):
    """Answer of ``GET /v1/info``: the served backend and this tenant's terms."""

    tenant: str
    backend: str
    version: str = ""
    capabilities: Capabilities = msgspec.field(default_factory=Capabilities)
    lease_seconds: float = 60.0
    max_lease_seconds: float = 3600.0
    max_live: int | None = None
    max_execs: int | None = None
    max_request_bytes: int = 0
    max_file_bytes: int = 0
    max_upload_bytes: int | None = None
    ping_interval: float = 10.0
    """Seconds of silence after which the server sends a ping frame in a streamed answer
    (an exec's, a run_code's): a client may wait that long, and its own short-call
    deadline more, before taking the link for lost."""


# -- the code interpreter -----------------------------------------------------------------
#
# A run is the public CodeRequest as is (one carrier from the caller to the sandbox). Its
# answer is NDJSON: the events as the public types encode them (tagged by their class name:
# OutputMessage, Result, ExecutionError), pings while the code is quiet, and last the whole
# Execution (an "end" frame) or an error frame.


class CodeEndFrame(_Message, kw_only=True, tag_field="type", tag="end"):
    """The code ran: its whole execution (the last frame of a successful run). A timeout
    is data here (``execution.timed_out``): the client raises it, as the local API does."""

    execution: Execution


CodeFrame = OutputMessage | Result | ExecutionError | CodeEndFrame | PingFrame | ErrorFrame
"""One line of a ``run_code`` answer (NDJSON)."""


class NewCodeContext(_Message, kw_only=True):
    """Body of ``POST /v1/sandboxes/{id}/code/contexts``."""

    cwd: Path | None = None
    """Where it starts (relative: under the sandbox's workdir); ``null``: the workdir."""
    language: Annotated[str, Meta(max_length=64)] | None = None


class CodeContextList(_Message, kw_only=True):
    """Answer of ``GET /v1/sandboxes/{id}/code/contexts``."""

    items: list[CodeContext] = msgspec.field(default_factory=list)


# -- codecs -------------------------------------------------------------------------------


class Codec(Generic[T]):
    """One reusable JSON encoder and typed decoder for the wire type ``T``."""

    __slots__ = ("_decoder", "_encoder", "type")

    def __init__(self, type_: Any) -> None:
        self.type = type_
        self._encoder = msgspec.json.Encoder()
        self._decoder: msgspec.json.Decoder[T] = msgspec.json.Decoder(type_)

    def encode(self, value: T) -> bytes:
        return self._encoder.encode(value)

    def decode(self, data: bytes | bytearray | memoryview | str) -> T:
        """Decode and validate; raises ``msgspec.DecodeError`` (or its ``ValidationError``)."""
        return self._decoder.decode(data)


CREATE: Codec[CreateSandbox] = Codec(CreateSandbox)
DESCRIPTION: Codec[SandboxDescription] = Codec(SandboxDescription)
LIST: Codec[SandboxList] = Codec(SandboxList)
DELETED: Codec[DeletedSandboxes] = Codec(DeletedSandboxes)
RENEWAL: Codec[LeaseRenewal] = Codec(LeaseRenewal)
LEASES: Codec[Leases] = Codec(Leases)
EXEC: Codec[ExecRequest] = Codec(ExecRequest)
EXEC_RESPONSE: Codec[ExecResponse] = Codec(ExecResponse)
FRAME: Codec[ExecFrame] = Codec(ExecFrame)
FRAME_TYPE: Codec[_FrameType] = Codec(_FrameType)
ERROR: Codec[ErrorResponse] = Codec(ErrorResponse)
HEALTH: Codec[Health] = Codec(Health)
INFO: Codec[ServerInfo] = Codec(ServerInfo)
SNAPSHOT: Codec[SnapshotCreated] = Codec(SnapshotCreated)
JUDGE: Codec[JudgeRequest] = Codec(JudgeRequest)
"""``POST /v1/judge``'s body: the judgement itself (``asyncsandbox.judge.JudgeRequest``)."""
JUDGE_RESULT: Codec[JudgeResult] = Codec(JudgeResult)
CODE_REQUEST: Codec[CodeRequest] = Codec(CodeRequest)
CODE_FRAME: Codec[CodeFrame] = Codec(CodeFrame)
NEW_CONTEXT: Codec[NewCodeContext] = Codec(NewCodeContext)
CONTEXT: Codec[CodeContext] = Codec(CodeContext)
CONTEXTS: Codec[CodeContextList] = Codec(CodeContextList)
_CODE_FRAME_TYPES = ("OutputMessage", "Result", "ExecutionError", "end", "ping", "error")


def decode_frame(line: bytes) -> ExecFrame | None:
    """One NDJSON line of a streaming exec; ``None`` for a frame type this client does
    not know (a newer server's addition). Raises ``msgspec.DecodeError`` for garbage."""
    try:
        return FRAME.decode(line)
    except msgspec.ValidationError:
        kind = FRAME_TYPE.decode(line).type
        if kind in ("output", "exit", "ping", "error"):
            raise  # a known frame that does not validate: a broken server
        return None


def decode_code_frame(line: bytes) -> CodeFrame | None:
    """One NDJSON line of a ``run_code`` answer; ``None`` for a frame type this client does
    not know. Raises ``msgspec.DecodeError`` for garbage."""
    try:
        return CODE_FRAME.decode(line)
    except msgspec.ValidationError:
        if FRAME_TYPE.decode(line).type in _CODE_FRAME_TYPES:
            raise
        return None
