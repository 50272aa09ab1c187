"""E2B's routes as data: the control plane's operations (from which
:class:`~._control.ControlPlane` builds its routes), envd's unary routes and the code
interpreter's, and the OpenAPI 3.1 document of them, served at ``/e2b/openapi.json`` (schemas generated from the
wire Structs of :mod:`._wire`; envd's messages are protobuf's JSON, described by hand).

envd's streaming methods (``Start``, ``Connect``, ``StreamInput``, ``WatchDir``) carry
Connect envelopes, which OpenAPI cannot describe: they are listed, without a body schema.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import msgspec

from . import _wire as w

__all__ = ("CONTROL", "ENVD", "INTERPRETER", "E2bOperation", "e2b_openapi")

JSON = "application/json"
BYTES = "application/octet-stream"
CONNECT_STREAM = "application/connect+json"
TEXT = "text/plain"


@dataclass(frozen=True)
class E2bOperation:
    """One route: ``handler`` names the :class:`~._control.ControlPlane` method answering it
    (envd's routes have none: the router and the Connect applications answer them)."""

    handler: str
    method: str
    path: str
    summary: str
    params: tuple[dict[str, Any], ...] = ()
    body: Any = None
    """A wire Struct (JSON), a JSON schema (a dict), or a media type string."""
    ok: tuple[int, ...] = (200,)
    answer: Any = None
    """A wire Struct, ``list[Struct]``, a JSON schema, a media type string, or None."""
    errors: tuple[int, ...] = ()
    text_errors: bool = False
    """Its own errors are plain text (the code interpreter's, as E2B's server answers);
    the router's (a token, a quota, a sandbox not found) stay JSON."""


def _query(name: str, schema: dict[str, Any], description: str = "") -> dict[str, Any]:
    return {"name": name, "in": "query", "schema": schema, "description": description}


def _path(name: str) -> dict[str, Any]:
    return {
        "name": name,
        "in": "path",
        "required": True,
        "schema": {"type": "string", "minLength": 1, "maxLength": 256},
    }


def _header(
    name: str, schema: dict[str, Any], description: str, *, required: bool = False
) -> dict[str, Any]:
    return {
        "name": name,
        "in": "header",
        "required": required,
        "schema": schema,
        "description": description,
    }


_SANDBOX = _path("sandbox_id")
_LISTING = (
    _query(
        "metadata", {"type": "string", "maxLength": 4096}, "k=v&... (url-encoded): all must match"
    ),
    _query("state", {"type": "string", "maxLength": 64}, "running, paused (comma-separated)"),
    _query("template", {"type": "string", "maxLength": 256}),
    _query("startedAfter", {"type": "string", "maxLength": 64}, "an RFC 3339 time"),
    _query("order", {"type": "string", "enum": ["asc", "desc"]}),
)
_LIFECYCLE_ERRORS = (400, 401, 404, 409, 413, 429, 502, 503)

CONTROL: tuple[E2bOperation, ...] = (
    E2bOperation(
        "create",
        "POST",
        "/sandboxes",
        "Create a sandbox of a template (or of one of the tenant's snapshots).",
        params=(
            _header(
                "X-Asyncsandbox-Workdir",
                {"type": "string", "maxLength": 4096},
                "asyncsandbox's extension: the sandbox's working directory instead of "
                "/home/user (the e2b backend sends it).",
            ),
        ),
        body=w.NewSandbox,
        ok=(201,),
        answer=w.CreatedSandbox,
        errors=_LIFECYCLE_ERRORS,
    ),
    E2bOperation(
        "create",
        "POST",
        "/v2/sandboxes",
        "Create a sandbox (the SDK's route from 2.51).",
        params=(
            _header(
                "X-Asyncsandbox-Workdir",
                {"type": "string", "maxLength": 4096},
                "As for POST /sandboxes.",
            ),
        ),
        body=w.NewSandbox,
        ok=(201,),
        answer=w.CreatedSandbox,
        errors=_LIFECYCLE_ERRORS,
    ),
    E2bOperation(
        "list_v1",
        "GET",
        "/sandboxes",
        "The tenant's sandboxes (running and paused).",
        params=_LISTING,
        answer=list[w.ListedSandbox],
        errors=(400, 401),
    ),
    E2bOperation(
        "list_v2",
        "GET",
        "/v2/sandboxes",
        "The tenant's sandboxes, a page at a time (the next page's token in x-next-token).",
        params=(
            *_LISTING,
            _query("limit", {"type": "integer", "minimum": 1, "maximum": 1000}),
            _query("nextToken", {"type": "string", "maxLength": 256}),
        ),
        answer=list[w.ListedSandbox],
        errors=(400, 401),
    ),
    E2bOperation(
        "not_offered", "GET", "/sandboxes/metrics", "Not offered (metrics).", errors=(401, 501)
    ),
    E2bOperation(
        "info",
        "GET",
        "/sandboxes/{sandbox_id}",
        "Describe a sandbox.",
        params=(_SANDBOX,),
        answer=w.SandboxDetail,
        errors=(401, 404),
    ),
    E2bOperation(
        "kill",
        "DELETE",
        "/sandboxes/{sandbox_id}",
        "Remove a sandbox (a paused one: its snapshot).",
        params=(_SANDBOX,),
        ok=(204,),
        errors=(401, 404),
    ),
    E2bOperation(
        "set_timeout",
        "POST",
        "/sandboxes/{sandbox_id}/timeout",
        "End the sandbox this many seconds from now.",
        params=(_SANDBOX,),
        body=w.TimeoutBody,
        ok=(204,),
        errors=(400, 401, 404, 413),
    ),
    E2bOperation(
        "refresh",
        "POST",
        "/sandboxes/{sandbox_id}/refreshes",
        "Keep the sandbox at least this many seconds more.",
        params=(_SANDBOX,),
        body=w.RefreshBody,
        ok=(204,),
        errors=(400, 401, 404, 413),
    ),
    *(
        E2bOperation(
            "connect",
            "POST",
            path,
            "Reach a sandbox (201: a paused one was resumed from its snapshot, without its "
            "processes); moves its end later, never earlier.",
            params=(_SANDBOX,),
            body=w.TimeoutBody,
            ok=(200, 201),
            answer=w.CreatedSandbox,
            errors=_LIFECYCLE_ERRORS,
        )
        for path in (
            "/sandboxes/{sandbox_id}/connect",
            "/v2/sandboxes/{sandbox_id}/connect",
            "/sandboxes/{sandbox_id}/resume",
        )
    ),
    E2bOperation(
        "pause",
        "POST",
        "/sandboxes/{sandbox_id}/pause",
        "A filesystem-only pause (memory=false): files, id and token kept, processes ended.",
        params=(_SANDBOX,),
        body=w.PauseBody,
        ok=(204,),
        errors=_LIFECYCLE_ERRORS,
    ),
    E2bOperation(
        "fork",
        "POST",
        "/sandboxes/{sandbox_id}/fork",
        "Sandboxes started from a snapshot of this one's files.",
        params=(_SANDBOX,),
        body=w.ForkBody,
        ok=(201,),
        answer=list[w.ForkResult],
        errors=_LIFECYCLE_ERRORS,
    ),
    E2bOperation(
        "snapshot",
        "POST",
        "/sandboxes/{sandbox_id}/snapshots",
        "A filesystem-only snapshot (memory=false): a template of the tenant's.",
        params=(_SANDBOX,),
        body=w.SnapshotBody,
        ok=(201,),
        answer=w.SnapshotInfo,
        errors=_LIFECYCLE_ERRORS,
    ),
    E2bOperation(
        "list_snapshots",
        "GET",
        "/snapshots",
        "The tenant's snapshots.",
        params=(
            _query("sandboxID", {"type": "string", "maxLength": 256}),
            _query("name", {"type": "string", "maxLength": 256}),
            _query("limit", {"type": "integer", "minimum": 1}),
            _query("nextToken", {"type": "string", "maxLength": 256}),
        ),
        answer=list[w.SnapshotInfo],
        errors=(401,),
    ),
    E2bOperation(
        "delete_template",
        "DELETE",
        "/templates/{template_id}",
        "Delete one of the tenant's snapshots (sandboxes made from it go on).",
        params=(_path("template_id"),),
        ok=(204,),
        errors=(400, 401, 404, 501),
    ),
    *(
        E2bOperation(
            "not_offered",
            method,
            path,
            "Not offered (metrics, logs, network controls).",
            params=(_SANDBOX,),
            errors=(401, 501),
        )
        for method, path in (
            ("GET", "/sandboxes/{sandbox_id}/metrics"),
            ("GET", "/sandboxes/{sandbox_id}/logs"),
            ("GET", "/v2/sandboxes/{sandbox_id}/logs"),
            ("PUT", "/sandboxes/{sandbox_id}/network"),
        )
    ),
)
"""The control plane (``X-API-KEY``)."""

# -- envd (headers E2b-Sandbox-Id, E2b-Sandbox-Port, X-Access-Token) -------------------

_ENVD_HEADERS = (
    _header(
        "E2b-Sandbox-Id",
        {"type": "string", "minLength": 1, "maxLength": 256},
        "The sandbox (its requests go to its envd).",
        required=True,
    ),
    _header(
        "E2b-Sandbox-Port",
        {"type": "string", "maxLength": 16},
        "49983: envd (49999: the code interpreter).",
        required=True,
    ),
    _header(
        "X-Access-Token",
        {"type": "string", "maxLength": 256},
        "The sandbox's envdAccessToken.",
        required=True,
    ),
    _header(
        "Authorization",
        {"type": "string", "maxLength": 256},
        "Basic base64('user:'): the user (only E2B's 'user').",
    ),
)
_PATH_FIELD = {"type": "string", "maxLength": 4096}
_SELECTOR = {
    "type": "object",
    "properties": {
        "pid": {"type": "integer", "minimum": 0, "maximum": 4294967295},
        "tag": {"type": "string", "maxLength": 256},
    },
}
_OBJECT: dict[str, Any] = {"type": "object"}
_UNARY = {
    "process.Process/List": _OBJECT,
    "process.Process/SendSignal": {
        "type": "object",
        "properties": {
            "process": _SELECTOR,
            "signal": {
                "type": "string",
                "enum": ["SIGNAL_SIGTERM", "SIGNAL_SIGKILL", "SIGNAL_UNSPECIFIED"],
            },
        },
    },
    "process.Process/SendInput": {
        "type": "object",
        "properties": {
            "process": _SELECTOR,
            "input": {
                "type": "object",
                "properties": {"stdin": {"type": "string", "contentEncoding": "base64"}},
            },
        },
    },
    "process.Process/CloseStdin": {"type": "object", "properties": {"process": _SELECTOR}},
    "process.Process/Update": {"type": "object", "properties": {"process": _SELECTOR}},
    "filesystem.Filesystem/Stat": {"type": "object", "properties": {"path": _PATH_FIELD}},
    "filesystem.Filesystem/MakeDir": {"type": "object", "properties": {"path": _PATH_FIELD}},
    "filesystem.Filesystem/Move": {
        "type": "object",
        "properties": {"source": _PATH_FIELD, "destination": _PATH_FIELD},
    },
    "filesystem.Filesystem/ListDir": {
        "type": "object",
        "properties": {
            "path": _PATH_FIELD,
            "depth": {"type": "integer", "minimum": 0, "maximum": 4294967295},
        },
    },
    "filesystem.Filesystem/Remove": {"type": "object", "properties": {"path": _PATH_FIELD}},
    "filesystem.Filesystem/CreateWatcher": {
        "type": "object",
        "properties": {"path": _PATH_FIELD, "recursive": {"type": "boolean"}},
    },
    "filesystem.Filesystem/GetWatcherEvents": {
        "type": "object",
        "properties": {"watcherId": {"type": "string", "maxLength": 256}},
    },
    "filesystem.Filesystem/RemoveWatcher": {
        "type": "object",
        "properties": {"watcherId": {"type": "string", "maxLength": 256}},
    },
}
_STREAMS = (
    "process.Process/Start",
    "process.Process/Connect",
    "process.Process/StreamInput",
    "filesystem.Filesystem/WatchDir",
)
_ENVD_ERRORS = (400, 401, 403, 404, 409, 413, 415, 429, 501, 502, 503, 504)
_FILE_QUERY = (
    _query("path", {"type": "string", "maxLength": 4096}, "relative paths: under /home/user"),
    _query("username", {"type": "string", "maxLength": 64}, "only 'user'"),
    _query("signature", {"type": "string", "maxLength": 256}, "a signed URL's (no headers)"),
    _query("signature_expiration", {"type": "string", "maxLength": 32}),
)

ENVD: tuple[E2bOperation, ...] = (
    *(
        E2bOperation(
            "",
            "POST",
            f"/{method}",
            f"envd's {method} (Connect, JSON codec, unary).",
            params=_ENVD_HEADERS,
            body=schema,
            answer=_OBJECT,
            errors=_ENVD_ERRORS,
        )
        for method, schema in _UNARY.items()
    ),
    *(
        E2bOperation(
            "",
            "POST",
            f"/{method}",
            f"envd's {method} (Connect, a stream of enveloped JSON messages).",
            params=_ENVD_HEADERS,
            body=CONNECT_STREAM,
            answer=CONNECT_STREAM,
            errors=_ENVD_ERRORS,
        )
        for method in _STREAMS
    ),
    E2bOperation(
        "",
        "GET",
        "/files",
        "Download a file (raw bytes; gzip if asked).",
        params=(*_ENVD_HEADERS, *_FILE_QUERY),
        answer=BYTES,
        errors=(400, 401, 403, 404, 413, 502, 503),
    ),
    E2bOperation(
        "",
        "POST",
        "/files",
        "Upload a file (octet-stream with ?path=, or multipart: each part named by its "
        "path); answers what was written.",
        params=(*_ENVD_HEADERS, *_FILE_QUERY),
        body=BYTES,
        answer={"type": "array", "items": {"type": "object"}},
        errors=(400, 401, 403, 404, 413, 502, 503),
    ),
    E2bOperation(
        "",
        "GET",
        "/health",
        "envd's liveness.",
        params=_ENVD_HEADERS,
        ok=(204,),
        errors=(400, 401, 501, 502),
    ),
)
"""Each sandbox's envd, reached on the same port by its headers."""

# -- the code interpreter (E2b-Sandbox-Port 49999) ---------------------------------------

_INTERPRETER_HEADERS = (
    _ENVD_HEADERS[0],
    _header(
        "E2b-Sandbox-Port",
        {"type": "string", "maxLength": 16},
        "49999: the code interpreter.",
        required=True,
    ),
    _header(
        "X-Access-Token",
        {"type": "string", "maxLength": 256},
        "The sandbox's envdAccessToken (the SDK sends it with /execute).",
    ),
    _header(
        "E2B-Traffic-Access-Token",
        {"type": "string", "maxLength": 256},
        "The sandbox's trafficAccessToken (the SDK sends it with every request).",
    ),
)
_STRINGS = {"type": "object", "additionalProperties": {"type": "string"}}
_CONTEXT: dict[str, Any] = {
    "type": "object",
    "required": ["id", "language", "cwd"],
    "properties": {
        "id": {"type": "string"},
        "language": {"type": "string"},
        "cwd": {"type": "string"},
    },
}
_NULL = {"type": "null"}
_INTERPRETER_ERRORS = (400, 401, 404, 413, 429, 502, 503)
_CONTEXT_ID = {
    **_path("context_id"),
    "schema": {"type": "string", "minLength": 1, "maxLength": 128, "pattern": "^[A-Za-z0-9_-]+$"},
}

INTERPRETER: tuple[E2bOperation, ...] = (
    E2bOperation(
        "",
        "POST",
        "/execute",
        "Run code in a context (the default one, or context_id; language: python only): "
        "NDJSON lines (stdout, stderr, result, error, number_of_executions, keepalive, "
        "end_of_execution).",
        params=_INTERPRETER_HEADERS,
        body={
            "type": "object",
            "required": ["code"],
            "properties": {
                "code": {"type": "string", "maxLength": 65536},
                "context_id": {"type": ["string", "null"], "maxLength": 128},
                "language": {"type": ["string", "null"], "maxLength": 32},
                "env_vars": {"anyOf": [_STRINGS, _NULL]},
            },
        },
        answer="application/x-ndjson",
        errors=_INTERPRETER_ERRORS,
        text_errors=True,
    ),
    E2bOperation(
        "",
        "POST",
        "/contexts",
        "Make a context: an interpreter of its own (cwd: default /home/user).",
        params=_INTERPRETER_HEADERS,
        body={
            "type": "object",
            "properties": {
                "cwd": {"type": ["string", "null"], "maxLength": 4096},
                "language": {"type": ["string", "null"], "maxLength": 32},
            },
        },
        answer=_CONTEXT,
        errors=_INTERPRETER_ERRORS,
        text_errors=True,
    ),
    E2bOperation(
        "",
        "GET",
        "/contexts",
        "The sandbox's contexts (the default one once it was used), oldest first.",
        params=_INTERPRETER_HEADERS,
        answer={"type": "array", "items": _CONTEXT},
        errors=(400, 401, 429, 502, 503),
        text_errors=True,
    ),
    E2bOperation(
        "",
        "POST",
        "/contexts/{context_id}/restart",
        "Give a context a fresh interpreter (its id and cwd stay).",
        params=(*_INTERPRETER_HEADERS, _CONTEXT_ID),
        answer=_NULL,
        errors=_INTERPRETER_ERRORS,
        text_errors=True,
    ),
    E2bOperation(
        "",
        "DELETE",
        "/contexts/{context_id}",
        "Remove a context (its interpreter and what it started are killed).",
        params=(*_INTERPRETER_HEADERS, _CONTEXT_ID),
        answer=_NULL,
        errors=_INTERPRETER_ERRORS,
        text_errors=True,
    ),
)
"""Each sandbox's code interpreter, reached on the same port by its headers (its
``/health`` is envd's path: the document describes envd's)."""

_ERRORS = {
    400: "Invalid request (envd's routes: E2b-Sandbox-Id is required).",
    401: "No or unknown API key, or no or wrong access token.",
    403: "Not allowed (a user other than 'user', a file the user may not touch).",
    404: "No such sandbox, template, snapshot, process, file or watcher (for this tenant).",
    409: "Conflict (paused, being paused or resumed; a name taken; a file exists).",
    413: "Request or file too large.",
    415: "Not a Connect content type (application/json for a unary call).",
    429: "A tenant quota (or a sandbox's process or watcher limit) is exhausted.",
    501: "Not offered by asyncsandbox serve (each says what is, instead).",
    502: "The sandbox was not found (not running), or its backend failed.",
    503: "The server is shutting down, or the sandbox's backend is unavailable.",
    504: "The request's Connect-Timeout-Ms passed.",
}
_CONNECT_ERROR: dict[str, Any] = {
    "type": "object",
    "required": ["code"],
    "properties": {"code": {"type": ["string", "integer"]}, "message": {"type": "string"}},
}


def _content(kind: Any, ref: str) -> dict[str, Any]:
    if isinstance(kind, str):
        return {kind: {"schema": {"type": "string", "format": "binary"}}}
    if isinstance(kind, dict):
        return {JSON: {"schema": kind}}
    inner = getattr(kind, "__args__", None)
    if inner:  # list[Struct]
        return {
            JSON: {
                "schema": {"type": "array", "items": {"$ref": ref.format(name=inner[0].__name__)}}
            }
        }
    return {JSON: {"schema": {"$ref": ref.format(name=kind.__name__)}}}


def _spec(op: E2bOperation, ref: str, security: list[dict[str, list[str]]]) -> dict[str, Any]:
    spec: dict[str, Any] = {
        "operationId": f"e2b_{op.method.lower()}_{op.path.strip('/').replace('/', '_')}",
        "summary": op.summary,
        "security": security,
    }
    if op.params:
        spec["parameters"] = [dict(p) for p in op.params]
    if op.body is not None:
        spec["requestBody"] = {"required": True, "content": _content(op.body, ref)}
    responses: dict[str, Any] = {}
    for status in op.ok:
        answer: dict[str, Any] = {"description": "Success."}
        if op.answer is not None:
            answer["content"] = _content(op.answer, ref)
        responses[str(status)] = answer
    for status in op.errors:
        responses[str(status)] = {"description": _ERRORS[status]}
        if status != 415:  # (Connect's answer to a content type it does not take is empty)
            responses[str(status)]["content"] = {JSON: {"schema": _CONNECT_ERROR}}
        if op.text_errors:
            responses[str(status)].setdefault("content", {})[TEXT] = {"schema": {"type": "string"}}
    spec["responses"] = responses
    return spec


def e2b_openapi(version: str = "") -> dict[str, Any]:
    """The OpenAPI 3.1 document of E2B's routes on ``asyncsandbox serve``."""
    ref = "#/components/schemas/{name}"
    _, components = msgspec.json.schema_components(
        [
            w.NewSandbox,
            w.TimeoutBody,
            w.RefreshBody,
            w.PauseBody,
            w.ForkBody,
            w.SnapshotBody,
            w.CreatedSandbox,
            w.ListedSandbox,
            w.SandboxDetail,
            w.ForkResult,
            w.SnapshotInfo,
            w.E2bError,
        ],
        ref_template=ref,
    )
    paths: dict[str, dict[str, Any]] = {}
    for op in CONTROL:
        paths.setdefault(op.path, {})[op.method.lower()] = _spec(op, ref, [{"apiKey": []}])
    for op in (*ENVD, *INTERPRETER):
        paths.setdefault(op.path, {})[op.method.lower()] = _spec(op, ref, [])
    return {
        "openapi": "3.1.0",
        "info": {
            "title": "E2B's API on asyncsandbox serve",
            "version": version or "0",
            "description": (
                "E2B's control plane (X-API-KEY) and each sandbox's envd and code "
                "interpreter (routed by the E2b-Sandbox-Id and E2b-Sandbox-Port headers, "
                "with X-Access-Token), on the server's one port. Errors: the control "
                "plane's {code, message} (code an integer), envd's Connect errors (code a "
                "string), the code interpreter's plain text."
            ),
        },
        "paths": paths,
        "components": {
            "schemas": components,
            "securitySchemes": {"apiKey": {"type": "apiKey", "in": "header", "name": "X-API-KEY"}},
        },
    }
