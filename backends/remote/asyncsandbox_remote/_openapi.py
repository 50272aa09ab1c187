"""The HTTP API as data: every operation once, from which the server builds its routes and
the OpenAPI 3.1 document (schemas generated from the wire Structs with
``msgspec.json.schema_components``)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import msgspec

from asyncsandbox import CodeContext, ExecutionError, OutputMessage, Result
from asyncsandbox.abc import CodeRequest
from asyncsandbox.judge import JudgeRequest, JudgeResult

from . import _wire as w
from ._fusion import RunCodeRequest, RunCodeResponse, RunJupyterRequest, RunJupyterResponse

__all__ = ("OPERATIONS", "Operation", "Param", "openapi")

JSON = "application/json"
NDJSON = "application/x-ndjson"
BYTES = "application/octet-stream"
TAR = "application/x-tar"
TEXT = "text/plain"


@dataclass(frozen=True)
class Param:
    """A query, path or header parameter."""

    name: str
    where: str  # "query", "path" or "header"
    schema: dict[str, Any]
    description: str = ""
    required: bool = False
    repeated: bool = False


@dataclass(frozen=True)
class Operation:
    """One route of the API."""

    name: str
    method: str
    path: str
    summary: str
    params: tuple[Param, ...] = ()
    body: Any = None
    """A wire type (JSON body), or a media type string for raw bodies."""
    ok: int = 200
    answer: Any = None
    """A wire type (JSON), a media type string (raw bytes), or None (no content)."""
    errors: tuple[int, ...] = ()
    auth: bool = True
    tags: tuple[str, ...] = ()
    extra: dict[str, Any] = field(default_factory=dict)
    frames: str = "ExecFrame"
    """For an NDJSON answer: the schema of its lines."""


_SANDBOX_ID = Param(
    "sandbox_id",
    "path",
    {"type": "string", "minLength": 1, "maxLength": 128},
    "The sandbox's id.",
    required=True,
)
_CONTEXT_ID = Param(
    "context_id",
    "path",
    {"type": "string", "minLength": 1, "maxLength": 128},
    "The code context's id.",
    required=True,
)
_LABEL = Param(
    "label",
    "query",
    {"type": "string", "pattern": "^[^=]+=", "maxLength": 2048},
    "KEY=VALUE: only sandboxes carrying this label (repeatable: all must match).",
    repeated=True,
)
_STATUS = Param(
    "status",
    "query",
    {"type": "string", "enum": ["creating", "running", "stopped", "removing", "dead"]},
    "Only sandboxes in this status (repeatable: any of them).",
    repeated=True,
)
_PATH = Param(
    "path",
    "query",
    {"type": "string", "minLength": 1, "maxLength": 4096},
    "A path in the sandbox; relative paths are under its workdir.",
    required=True,
)

_COMMON = (400, 401, 404, 413, 429)

OPERATIONS: tuple[Operation, ...] = (
    Operation(
        "health",
        "GET",
        "/v1/health",
        "Liveness: answers while the server runs (no authentication).",
        answer=w.Health,
        auth=False,
        tags=("server",),
    ),
    Operation(
        "info",
        "GET",
        "/v1/info",
        "The served backend's capabilities and this tenant's terms (lease, quotas, sizes).",
        answer=w.ServerInfo,
        errors=(401,),
        tags=("server",),
    ),
    Operation(
        "create_sandbox",
        "POST",
        "/v1/sandboxes",
        "Create a sandbox. With an Idempotency-Key, a repeated request returns the first "
        "one's sandbox (status 200) instead of creating another.",
        params=(
            Param(
                "Idempotency-Key",
                "header",
                {"type": "string", "minLength": 1, "maxLength": 255, "pattern": "^[!-~]+$"},
                "Makes retries safe: the same key never creates twice.",
            ),
        ),
        body=w.CreateSandbox,
        ok=201,
        answer=w.SandboxDescription,
        errors=(400, 401, 409, 413, 422, 429, 503),
        tags=("sandboxes",),
        extra={"200": w.SandboxDescription},
    ),
    Operation(
        "list_sandboxes",
        "GET",
        "/v1/sandboxes",
        "This tenant's sandboxes, filtered by labels and status.",
        params=(_LABEL, _STATUS),
        answer=w.SandboxList,
        errors=(400, 401),
        tags=("sandboxes",),
    ),
    Operation(
        "delete_sandboxes",
        "DELETE",
        "/v1/sandboxes",
        "Remove this tenant's sandboxes carrying all the labels (at least one label).",
        params=(_LABEL, _STATUS),
        answer=w.DeletedSandboxes,
        errors=(400, 401),
        tags=("sandboxes",),
    ),
    Operation(
        "abandon_create",
        "DELETE",
        "/v1/creates/{idempotency_key}",
        "Abandon the create made with this idempotency key: cancel it if it runs, remove "
        "its sandbox if it finished, and refuse the key from now on.",
        params=(
            Param(
                "idempotency_key",
                "path",
                {"type": "string", "minLength": 1, "maxLength": 255},
                required=True,
            ),
        ),
        ok=204,
        errors=(400, 401),
        tags=("sandboxes",),
    ),
    Operation(
        "snapshot_sandbox",
        "POST",
        "/v1/sandboxes/{sandbox_id}/snapshot",
        "Snapshot a sandbox's filesystem state (not its processes); start sandboxes from it "
        "with CreateSandbox.snapshot until it is deleted.",
        params=(_SANDBOX_ID,),
        ok=201,
        answer=w.SnapshotCreated,
        errors=(400, 401, 404, 503),
        tags=("snapshots",),
    ),
    Operation(
        "reset_sandbox",
        "POST",
        "/v1/sandboxes/{sandbox_id}/reset",
        "Return a sandbox to the state it was created in, for another episode: every "
        "process killed (code contexts too), every writable place as at creation; its id "
        "stays. Only where ServerInfo.capabilities.reset (else 400). After a failed reset "
        "the sandbox is in no known state: delete it. Idempotent.",
        params=(_SANDBOX_ID,),
        ok=204,
        errors=(400, 401, 404, 410, 429, 502, 503, 504),
        tags=("sandboxes",),
    ),
    Operation(
        "delete_snapshot",
        "DELETE",
        "/v1/snapshots/{snapshot_id}",
        "Delete one of this tenant's snapshots (sandboxes started from it go on). Idempotent.",
        params=(
            Param(
                "snapshot_id",
                "path",
                {"type": "string", "minLength": 1, "maxLength": 1024},
                required=True,
            ),
        ),
        ok=204,
        errors=(400, 401),
        tags=("snapshots",),
    ),
    Operation(
        "get_sandbox",
        "GET",
        "/v1/sandboxes/{sandbox_id}",
        "Describe a sandbox (renews its lease).",
        params=(_SANDBOX_ID,),
        answer=w.SandboxDescription,
        errors=(401, 404),
        tags=("sandboxes",),
    ),
    Operation(
        "delete_sandbox",
        "DELETE",
        "/v1/sandboxes/{sandbox_id}",
        "Remove a sandbox: kill its commands, delete its files.",
        params=(_SANDBOX_ID,),
        ok=204,
        errors=(401, 404),
        tags=("sandboxes",),
    ),
    Operation(
        "renew_lease",
        "POST",
        "/v1/sandboxes/{sandbox_id}/lease",
        "Renew a sandbox's lease (a heartbeat). Any use of the sandbox renews it too.",
        params=(_SANDBOX_ID,),
        answer=w.Leases,
        errors=(401, 404),
        tags=("leases",),
    ),
    Operation(
        "renew_leases",
        "POST",
        "/v1/leases",
        "Renew the leases of many sandboxes at once.",
        body=w.LeaseRenewal,
        answer=w.Leases,
        errors=(400, 401, 413),
        tags=("leases",),
    ),
    Operation(
        "exec",
        "POST",
        "/v1/sandboxes/{sandbox_id}/exec",
        "Run a command and answer its result. A client that disconnects kills the command.",
        params=(_SANDBOX_ID,),
        body=w.ExecRequest,
        answer=w.ExecResponse,
        errors=(*_COMMON, 409, 410, 502, 503),
        tags=("commands",),
    ),
    Operation(
        "exec_stream",
        "POST",
        "/v1/sandboxes/{sandbox_id}/exec/stream",
        "Run a command and stream its output as NDJSON frames (output, ping, then exit or "
        "error). Closing the connection kills the command.",
        params=(_SANDBOX_ID,),
        body=w.ExecRequest,
        answer=NDJSON,
        errors=(*_COMMON, 409, 410, 502, 503),
        tags=("commands",),
    ),
    Operation(
        "cancel_exec",
        "DELETE",
        "/v1/sandboxes/{sandbox_id}/execs/{exec_id}",
        "Kill a running command (by the exec_id its request carried) and answer once its "
        "process tree is gone; a command not started yet is refused when it arrives.",
        params=(
            _SANDBOX_ID,
            Param(
                "exec_id", "path", {"type": "string", "minLength": 1, "maxLength": 128}, "", True
            ),
        ),
        ok=204,
        errors=(401, 404),
        tags=("commands",),
    ),
    Operation(
        "read_file",
        "GET",
        "/v1/sandboxes/{sandbox_id}/files",
        "The content of a regular file.",
        params=(
            _SANDBOX_ID,
            _PATH,
            Param(
                "max_bytes",
                "query",
                {"type": "integer", "minimum": 1},
                "Refuse (413, file_error too_large) a file larger than this.",
            ),
        ),
        answer=BYTES,
        errors=(400, 401, 403, 404, 409, 410, 413, 429),
        tags=("files",),
    ),
    Operation(
        "write_file",
        "PUT",
        "/v1/sandboxes/{sandbox_id}/files",
        "Create or replace a file (parents are created).",
        params=(
            _SANDBOX_ID,
            _PATH,
            Param(
                "mode",
                "query",
                {"type": "string", "pattern": "^0?[0-7]{1,4}$"},
                "Permission bits in octal (default 644).",
            ),
        ),
        body=BYTES,
        ok=204,
        errors=(400, 401, 403, 404, 409, 410, 413, 429),
        tags=("files",),
    ),
    Operation(
        "upload_archive",
        "PUT",
        "/v1/sandboxes/{sandbox_id}/archive",
        "Extract an uncompressed tar stream into a directory (created if missing). "
        "Streamed: the body is never held in memory.",
        params=(_SANDBOX_ID, _PATH),
        body=TAR,
        ok=204,
        errors=(400, 401, 403, 404, 409, 410, 413, 429),
        tags=("files",),
    ),
    Operation(
        "download_archive",
        "GET",
        "/v1/sandboxes/{sandbox_id}/archive",
        "A file or directory as an uncompressed tar stream (top member: its basename).",
        params=(_SANDBOX_ID, _PATH),
        answer=TAR,
        errors=(400, 401, 403, 404, 409, 410, 429),
        tags=("files",),
    ),
    Operation(
        "run_code",
        "POST",
        "/v1/sandboxes/{sandbox_id}/code/run",
        "Run Python code in a stateful context of the sandbox (the default one unless the "
        "request names another) and stream what it does as NDJSON frames: OutputMessage, "
        "Result and ExecutionError events as they come, pings while it is quiet, then the "
        "whole Execution (end) or an error. A timeout is data (execution.timed_out). "
        "Closing the connection interrupts the code.",
        params=(_SANDBOX_ID,),
        body=CodeRequest,
        answer=NDJSON,
        frames="CodeFrame",
        errors=(*_COMMON, 409, 410, 502, 503),
        tags=("code",),
    ),
    Operation(
        "create_code_context",
        "POST",
        "/v1/sandboxes/{sandbox_id}/code/contexts",
        "A new code context: an interpreter of its own, starting in cwd.",
        params=(_SANDBOX_ID,),
        body=w.NewCodeContext,
        ok=201,
        answer=CodeContext,
        errors=(*_COMMON, 409, 410, 502, 503),
        tags=("code",),
    ),
    Operation(
        "list_code_contexts",
        "GET",
        "/v1/sandboxes/{sandbox_id}/code/contexts",
        "The sandbox's code contexts.",
        params=(_SANDBOX_ID,),
        answer=w.CodeContextList,
        errors=(401, 404, 410),
        tags=("code",),
    ),
    Operation(
        "restart_code_context",
        "POST",
        "/v1/sandboxes/{sandbox_id}/code/contexts/{context_id}/restart",
        "A fresh interpreter for a context (same id and directory); a call running in it "
        "ends, restarted.",
        params=(_SANDBOX_ID, _CONTEXT_ID),
        ok=204,
        errors=(400, 401, 404, 410, 502),
        tags=("code",),
    ),
    Operation(
        "remove_code_context",
        "DELETE",
        "/v1/sandboxes/{sandbox_id}/code/contexts/{context_id}",
        "Kill a context's interpreter and everything it started, and forget it.",
        params=(_SANDBOX_ID, _CONTEXT_ID),
        ok=204,
        errors=(400, 401, 404, 410, 502),
        tags=("code",),
    ),
    Operation(
        "judge",
        "POST",
        "/v1/judge",
        "Judge a program on test cases in a fresh sandbox, removed afterwards: compile "
        "once, run every case, answer typed verdicts and a score (a failure of the sandbox "
        "is the verdict infrastructure_error, score null). A client that disconnects kills "
        "the cases.",
        body=JudgeRequest,
        answer=JudgeResult,
        errors=(400, 401, 413, 429, 503),
        tags=("judging",),
    ),
    Operation(
        "fusion_run_code",
        "POST",
        "/run_code",
        "SandboxFusion's run_code, for its unmodified client: the code judged in a fresh "
        "sandbox (its files written first, fetch_files read back), answered as SandboxFusion "
        "does (status Success, Failed or SandboxError; always 200 once it ran). The key as "
        "a bearer token or as HTTP Basic's password.",
        body=RunCodeRequest,
        answer=RunCodeResponse,
        errors=(400, 401, 413, 429, 503),
        tags=("sandboxfusion",),
    ),
    Operation(
        "fusion_run_jupyter",
        "POST",
        "/run_jupyter",
        "SandboxFusion's run_jupyter: the cells in order in one Python interpreter of a "
        "fresh sandbox, each answered {stdout, stderr, display, error}; past total_timeout "
        "the run is Failed with no cells. The key as for /run_code.",
        body=RunJupyterRequest,
        answer=RunJupyterResponse,
        errors=(400, 401, 413, 429, 503),
        tags=("sandboxfusion",),
    ),
    Operation(
        "metrics",
        "GET",
        "/metrics",
        "Metrics in the Prometheus text format (no authentication).",
        answer=TEXT,
        auth=False,
        tags=("server",),
    ),
)

_ERROR_TEXT = {
    400: "Invalid request (error code invalid_argument).",
    401: "No or unknown API key (unauthorized).",
    403: "The sandbox user may not do this (file_error permission).",
    404: "No such sandbox for this tenant (sandbox_not_found), or no such file (file_error).",
    409: "Conflict: a file error (is/not a directory), an abandoned create, a closed sandbox.",
    410: "The sandbox died (sandbox_died).",
    413: "Request too large (request_too_large), or file too large (file_error too_large).",
    422: "The idempotency key was used with a different request (idempotency_conflict).",
    429: "A tenant quota is exhausted (quota_exceeded); retry later.",
    502: "The backend failed: a command it could not start (launch_error: it never ran; "
    "retry it when retryable), or another infrastructure failure (infrastructure_error).",
    503: "The backend is unavailable or the server is shutting down.",
    504: "The backend did not answer in time (backend_timeout).",
}


def _content(kind: Any, ref: str, frames: str = "ExecFrame") -> dict[str, Any]:
    if isinstance(kind, str):
        schema: dict[str, Any] = {"type": "string"}
        if kind != TEXT:
            schema["format"] = "binary"
        if kind == NDJSON:
            schema = {"$ref": ref.format(name=frames)}
        return {kind: {"schema": schema}}
    return {JSON: {"schema": {"$ref": ref.format(name=kind.__name__)}}}


def openapi(version: str = "") -> dict[str, Any]:
    """The OpenAPI 3.1 document of the server's API."""
    ref = "#/components/schemas/{name}"
    # Every type an operation names (so that no $ref dangles), and the frames' types.
    named = (kind for op in OPERATIONS for kind in (op.body, op.answer, *op.extra.values()))
    wire_types = [
        *(kind for kind in named if kind is not None and not isinstance(kind, str)),
        w.ErrorResponse,
        w.OutputFrame,
        w.ExitFrame,
        w.PingFrame,
        w.ErrorFrame,
        w.CodeEndFrame,
        OutputMessage,
        Result,
        ExecutionError,
    ]
    _, components = msgspec.json.schema_components(
        list(dict.fromkeys(wire_types)), ref_template=ref
    )
    code_frames = {
        "OutputMessage": "OutputMessage",
        "Result": "Result",
        "ExecutionError": "ExecutionError",
        "end": "CodeEndFrame",
        "ping": "PingFrame",
        "error": "ErrorFrame",
    }
    components["CodeFrame"] = {
        "description": "One NDJSON line of a run_code answer (types added later are skipped).",
        "anyOf": [{"$ref": ref.format(name=n)} for n in code_frames.values()],
        "discriminator": {
            "propertyName": "type",
            "mapping": {tag: ref.format(name=n) for tag, n in code_frames.items()},
        },
    }
    components["ExecFrame"] = {
        "description": "One NDJSON line of a streaming exec (types added later are skipped).",
        "anyOf": [
            {"$ref": ref.format(name=n)}
            for n in ("OutputFrame", "ExitFrame", "PingFrame", "ErrorFrame")
        ],
        "discriminator": {
            "propertyName": "type",
            "mapping": {
                "output": ref.format(name="OutputFrame"),
                "exit": ref.format(name="ExitFrame"),
                "ping": ref.format(name="PingFrame"),
                "error": ref.format(name="ErrorFrame"),
            },
        },
    }
    paths: dict[str, dict[str, Any]] = {}
    for op in OPERATIONS:
        spec: dict[str, Any] = {
            "operationId": op.name,
            "summary": op.summary,
            "tags": list(op.tags),
        }
        if not op.auth:
            spec["security"] = []
        params = []
        for p in op.params:
            schema = {"type": "array", "items": p.schema} if p.repeated else p.schema
            item: dict[str, Any] = {
                "name": p.name,
                "in": p.where,
                "required": p.required,
                "schema": schema,
            }
            if p.description:
                item["description"] = p.description
            if p.repeated:
                item["style"] = "form"
                item["explode"] = True
            params.append(item)
        if params:
            spec["parameters"] = params
        if op.body is not None:
            spec["requestBody"] = {"required": True, "content": _content(op.body, ref)}
        responses: dict[str, Any] = {}
        ok: dict[str, Any] = {"description": "Success."}
        if op.answer is not None:
            ok["content"] = _content(op.answer, ref, op.frames)
        responses[str(op.ok)] = ok
        for replay, kind in op.extra.items():
            responses[replay] = {
                "description": "Replayed: the sandbox of an earlier request with this key.",
                "content": _content(kind, ref),
            }
        for status in op.errors:
            responses[str(status)] = {
                "description": _ERROR_TEXT[status],
                "content": _content(w.ErrorResponse, ref),
            }
        spec["responses"] = responses
        paths.setdefault(op.path, {})[op.method.lower()] = spec
    return {
        "openapi": "3.1.0",
        "info": {
            "title": "asyncsandbox remote API",
            "version": version or "0",
            "description": (
                "Sandboxes over HTTP: every API key is a tenant that sees only its own "
                "sandboxes. Errors are JSON {error: {code, message, ...}}."
            ),
        },
        "paths": paths,
        "components": {
            "schemas": components,
            "securitySchemes": {"bearer": {"type": "http", "scheme": "bearer"}},
        },
        "security": [{"bearer": []}],
    }
