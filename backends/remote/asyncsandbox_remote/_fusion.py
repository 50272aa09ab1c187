"""SandboxFusion's ``POST /run_code`` and ``POST /run_jupyter`` on ``asyncsandbox serve``,
for the unmodified ``sandbox-fusion`` client (``sandbox_fusion.run_code``,
``run_code_async``, ``run_jupyter``, ``run_jupyter_async``) and verl's raw
``requests.post(f"{url}/run_code", json=payload)``.

Each request runs in a FRESH sandbox of the served backend, made through the server's
Session like every other sandbox (its limits, deadlines, retries and error mapping apply),
and removed on every exit path, the client's disconnect included (the program is killed
first). In the sandbox's workdir the request's ``files`` (base64) are written; then the
code is judged there as one test case with no expected output, by the judge
(:func:`asyncsandbox.judge.judge`): written as its language's source file, compiled
(``compile_timeout``), run with ``stdin`` (``run_timeout``, counted from the program's own
start; the whole process tree is killed). Its output is the program's own answer, as for
every verdict: what it wrote before its main process ended (nothing it left behind can
add to it). Then ``fetch_files`` are read back (base64; a file that cannot be read is left
out). ``memory_limit_MB`` (> 0) is the sandbox's memory limit (``Resources.memory_mb``),
which the compile step shares; otherwise the Session's default applies. A program whose
output passes the sandbox's ``max_output_bytes`` is killed there.

Languages: the judge's table (:data:`asyncsandbox.judge.LANGUAGES`), under SandboxFusion's
names too: ``python``, ``bash``, ``cpp`` (C arrives as cpp, as in SandboxFusion; ``g++
-std=gnu++17``), ``nodejs``, ``perl``, and the judge's others (``c``, ``java``). The
process backend shares the host's ``/usr``; a Docker image must carry them. Any other
language gets a 400 naming these. A program the sandbox lacks answers ``SandboxError``
(the sandbox cannot run it: not the program's fault).

Statuses, as SandboxFusion's ``parse_run_status``: ``Success`` when every step finished
with exit 0; ``Failed`` when one exited non-zero (a compile failure answers
``compile_result`` only) or hit its time limit (its ``status`` is ``TimeLimitExceeded``,
with no ``return_code`` and no ``execution_time``, as SandboxFusion reports it);
``SandboxError`` when the infrastructure failed (an :class:`asyncsandbox.InfrastructureError`
such as a sandbox that could not start, or a step that could not be launched, whose
``status`` is then ``Error``). The fusion client raises and retries on ``SandboxError``, as
it does against SandboxFusion. Answers are ``application/json``, status 200; requests that
cannot run (no key: 401, bad body or language: 400, quota: 429) get this server's JSON
error. SandboxFusion's dataset routes, which do not fit a sandbox runtime, answer 501 with
a JSON error saying so.

``/run_jupyter`` runs its ``cells`` in order in one interpreter (``Sandbox.run_code``'s
default context: state carries from one cell to the next, as in SandboxFusion's Jupyter
kernel) in a fresh sandbox, after writing ``files``; every cell runs, whatever the ones
before it raised. Each answers ``{stdout, stderr, display, error}``: ``display`` holds the
MIME bundles of what it displayed (its last expression's included, as Jupyter's
``execute_result``), ``error`` Jupyter's ``{ename, evalue, traceback}`` of what it raised.
``cell_timeout`` (> 0) interrupts a cell as a notebook's interrupt does (its error is the
``KeyboardInterrupt``) and goes on with the next; past ``total_timeout`` the run ends as
SandboxFusion's does: status ``Failed``, the ``driver`` ``TimeLimitExceeded``, no cells.
Otherwise the status is ``Success`` and the ``driver`` (SandboxFusion's kernel process, here
the interpreter) ``Finished``. ``kernel`` must be ``python3``.

Auth and quotas are this server's: the key as a bearer token or as the password of HTTP
Basic (``http://user:KEY@host:port``: the only way an unmodified client can send one). A
request holds one of the tenant's ``max_live`` sandboxes and one of its ``max_execs``
slots while it runs.
"""

from __future__ import annotations

import base64
import binascii
import math
import time
from enum import StrEnum
from typing import Annotated, Any

import msgspec
from msgspec import Meta
from starlette.requests import Request
from starlette.responses import Response

from asyncsandbox import (
    ExecTimeout,
    Execution,
    InfrastructureError,
    InvalidArgument,
    Result,
    Sandbox,
    SandboxError,
    SandboxFileError,
)
from asyncsandbox.judge import (
    LANGUAGES,
    CompileResult,
    JudgeRequest,
    Program,
    TestCase,
    Verdict,
    judge,
)
from asyncsandbox.log import get_logger

from . import _wire as w
from ._errors import CLIENT_CLOSED_REQUEST, HttpError, bad_request, error_for
from ._serverstate import ServerState
from ._streaming import decode, json_response, until_disconnect

__all__ = ("UNSUPPORTED_ROUTES", "FusionHandlers")

log = get_logger("asyncsandbox.remote")


UNSUPPORTED_ROUTES = (
    "/get_prompts",
    "/get_prompt_by_id",
    "/submit",
    "/get_metrics",
    "/get_metrics_function",
    "/list_datasets",
    "/list_ids",
)
"""SandboxFusion routes that do not fit a sandbox runtime: answered 501."""


# -- SandboxFusion's wire types (its field names, its defaults) ---------------------------

Timeout = Annotated[float, Meta(gt=0, le=24 * 3600)]


class RunCodeRequest(msgspec.Struct, kw_only=True):
    """SandboxFusion's ``RunCodeRequest`` (unknown fields are ignored, nulls accepted)."""

    code: str
    language: Annotated[str, Meta(extra_json_schema={"enum": sorted(LANGUAGES)})]
    """One of the judge's languages, under their SandboxFusion names too (else 400)."""
    compile_timeout: Timeout = 10.0
    run_timeout: Timeout = 10.0
    memory_limit_MB: int = -1  # (SandboxFusion's name)
    """The sandbox's memory limit in MiB; -1 (or any value <= 0): the server's default."""
    stdin: str | None = None
    files: dict[str, str | None] = msgspec.field(default_factory=dict)
    """Base64 content by path (relative paths are in the workdir); ``null`` skips one."""
    fetch_files: list[str] = msgspec.field(default_factory=list)


class RunStatus(StrEnum):
    SUCCESS = "Success"
    FAILED = "Failed"
    SANDBOX_ERROR = "SandboxError"


class CommandRunStatus(StrEnum):
    FINISHED = "Finished"
    ERROR = "Error"
    TIME_LIMIT_EXCEEDED = "TimeLimitExceeded"


class CommandRunResult(msgspec.Struct, kw_only=True):
    status: CommandRunStatus
    execution_time: float | None = None
    cpu_time: float | None = None
    return_code: int | None = None
    stdout: str | None = None
    stderr: str | None = None


class RunCodeResponse(msgspec.Struct, kw_only=True):
    status: RunStatus
    message: str = ""
    compile_result: CommandRunResult | None = None
    run_result: CommandRunResult | None = None
    executor_pod_name: str | None = None
    files: dict[str, str] = msgspec.field(default_factory=dict)


class RunJupyterRequest(msgspec.Struct, kw_only=True):
    """SandboxFusion's ``RunJupyterRequest``."""

    cells: list[str]
    cell_timeout: Annotated[float, Meta(ge=0, le=24 * 3600)] = 0.0
    """Seconds per cell; 0: none (only the total)."""
    total_timeout: Timeout = 45.0
    kernel: Annotated[str, Meta(extra_json_schema={"enum": ["python3"]})] = "python3"
    files: dict[str, str | None] = msgspec.field(default_factory=dict)
    fetch_files: list[str] = msgspec.field(default_factory=list)


class CellRunResult(msgspec.Struct, kw_only=True):
    stdout: str = ""
    stderr: str = ""
    display: list[dict[str, Any]] = msgspec.field(default_factory=list)
    error: list[dict[str, Any]] = msgspec.field(default_factory=list)


class RunJupyterResponse(msgspec.Struct, kw_only=True):
    status: RunStatus
    message: str = ""
    driver: CommandRunResult | None = None
    cells: list[CellRunResult] = msgspec.field(default_factory=list)
    executor_pod_name: str | None = None
    files: dict[str, str] = msgspec.field(default_factory=dict)


RUN_CODE: w.Codec[RunCodeRequest] = w.Codec(RunCodeRequest)
RUN_CODE_RESPONSE: w.Codec[RunCodeResponse] = w.Codec(RunCodeResponse)
RUN_JUPYTER: w.Codec[RunJupyterRequest] = w.Codec(RunJupyterRequest)
RUN_JUPYTER_RESPONSE: w.Codec[RunJupyterResponse] = w.Codec(RunJupyterResponse)


# -- the handlers -------------------------------------------------------------------------


class FusionHandlers:
    """The SandboxFusion routes of one server (see the module docstring): the operations
    ``fusion_run_code`` and ``fusion_run_jupyter`` of :data:`~._openapi.OPERATIONS`, and
    the dataset routes it does not serve (:meth:`unsupported`)."""

    def __init__(self, server: ServerState) -> None:
        self.server = server
        self.config = server.config
        self.tenancy = server.tenancy
        self.metrics = server.metrics

    async def fusion_run_code(self, request: Request) -> Response:
        tenant = self.tenancy.authenticate(request)
        body = await decode(request, RUN_CODE, self.config.max_request_bytes)
        if body.language not in LANGUAGES:
            raise bad_request(
                f"language {body.language[:50]!r} is not supported here; "
                f"supported: {', '.join(sorted(LANGUAGES))}"
            )
        files = _decoded(body.files)
        if self.server.closing:
            raise HttpError(503, "shutting_down", "the server is shutting down", retryable=True)
        resources = self.server.session.defaults.resources
        if body.memory_limit_MB > 0:
            resources = msgspec.structs.replace(resources, memory_mb=body.memory_limit_MB)
        try:
            sandbox = self.server.session.sandbox(
                resources=resources, tags=(tenant.tag,), recyclable=True
            )
        except SandboxError as exc:
            raise error_for(exc) from None
        answer: RunCodeResponse | None = None

        async def work() -> None:
            nonlocal answer
            answer = await _run(sandbox, body, files, self.config.max_file_bytes)

        async with self.tenancy.ephemeral(tenant):
            if await until_disconnect(request.receive, work):
                self.metrics.disconnect_kills += 1
                log.info("remote.fusion.disconnected", tenant=tenant.name)
        if answer is None:  # the client left: nobody reads this
            return Response(status_code=CLIENT_CLOSED_REQUEST)
        log.debug(
            "remote.fusion.ran", tenant=tenant.name, language=body.language, status=answer.status
        )
        return json_response(RUN_CODE_RESPONSE, answer)

    async def fusion_run_jupyter(self, request: Request) -> Response:
        tenant = self.tenancy.authenticate(request)
        body = await decode(request, RUN_JUPYTER, self.config.max_request_bytes)
        if body.kernel != "python3":
            raise bad_request(f"kernel {body.kernel[:50]!r} is not supported; only python3")
        files = _decoded(body.files)
        if self.server.closing:
            raise HttpError(503, "shutting_down", "the server is shutting down", retryable=True)
        try:
            sandbox = self.server.session.sandbox(tags=(tenant.tag,))
        except SandboxError as exc:
            raise error_for(exc) from None
        answer: RunJupyterResponse | None = None

        async def work() -> None:
            nonlocal answer
            answer = await _run_cells(sandbox, body, files, self.config.max_file_bytes)

        async with self.tenancy.ephemeral(tenant):
            if await until_disconnect(request.receive, work):
                self.metrics.disconnect_kills += 1
                log.info("remote.fusion.disconnected", tenant=tenant.name)
        if answer is None:
            return Response(status_code=CLIENT_CLOSED_REQUEST)
        log.debug("remote.fusion.jupyter", tenant=tenant.name, status=answer.status)
        return json_response(RUN_JUPYTER_RESPONSE, answer)

    async def unsupported(self, request: Request) -> Response:
        raise HttpError(
            501,
            "not_supported",
            f"{request.url.path} is a SandboxFusion route this server does not serve: "
            "asyncsandbox serve implements /run_code and /run_jupyter (datasets are not "
            "part of a sandbox runtime)",
        )


def _decoded(files: dict[str, str | None]) -> dict[str, bytes]:
    decoded: dict[str, bytes] = {}
    for path, content in files.items():
        if content is None:
            continue  # as SandboxFusion: a null content writes nothing
        try:
            decoded[path] = base64.b64decode(content, validate=True)
        except (binascii.Error, ValueError):
            raise bad_request(f"files[{path[:100]!r}] is not valid base64") from None
    return decoded


async def _run(
    sandbox: Sandbox, body: RunCodeRequest, files: dict[str, bytes], max_file_bytes: int
) -> RunCodeResponse:
    """Run one request in ``sandbox`` (started here, removed on every exit path)."""
    workdir = sandbox.config.workdir
    request = JudgeRequest(
        program=Program(source=body.code, language=body.language),
        cases=(TestCase(stdin=body.stdin or b""),),
        time_limit=body.run_timeout,
        compile_timeout=body.compile_timeout,
        output_limit=sandbox.config.max_output_bytes,
        full_output=True,
        directory=workdir,
    )
    try:
        async with sandbox:
            try:
                for path, data in files.items():
                    await sandbox.write_file(path, data)
            except (InvalidArgument, SandboxFileError) as exc:
                raise bad_request(f"cannot write the request's files: {exc}") from None
            result = await judge(sandbox, request)
            fetched = {}
            if result.verdict not in (Verdict.COMPILE_ERROR, Verdict.INFRASTRUCTURE_ERROR):
                fetched = await _fetch(sandbox, body.fetch_files, max_file_bytes)
    except HttpError:
        raise
    except SandboxError as exc:
        # Ours, not the program's (infrastructure, or the server closing its Session):
        # SandboxFusion's SandboxError, which its client retries.
        return _sandbox_error(exc)
    compiled = None if result.compile is None else _compiled(result.compile)
    if result.verdict == Verdict.INFRASTRUCTURE_ERROR:
        log.warning("remote.fusion.sandbox_error", error=result.error, infrastructure=True)
        return RunCodeResponse(
            status=RunStatus.SANDBOX_ERROR,
            message=f"infrastructure error: {result.error}",
            compile_result=compiled,
        )
    if result.verdict == Verdict.COMPILE_ERROR:
        return _response(compiled, None, {})
    [case] = result.cases
    if case.verdict == Verdict.TIME_LIMIT:
        ran = CommandRunResult(
            status=CommandRunStatus.TIME_LIMIT_EXCEEDED, stdout=case.stdout, stderr=case.stderr
        )
    else:
        ran = CommandRunResult(
            status=CommandRunStatus.FINISHED,
            execution_time=case.seconds,
            cpu_time=case.cpu_seconds,
            return_code=case.returncode,
            stdout=case.stdout,
            stderr=case.stderr,
        )
    return _response(compiled, ran, fetched)


async def _run_cells(
    sandbox: Sandbox, body: RunJupyterRequest, files: dict[str, bytes], max_file_bytes: int
) -> RunJupyterResponse:
    """Run one ``/run_jupyter`` request in ``sandbox`` (started here, removed on every exit
    path): the cells in order, in one context, within the total timeout."""
    started = time.monotonic()
    deadline = started + body.total_timeout
    cells: list[CellRunResult] = []
    try:
        async with sandbox:
            try:
                for path, data in files.items():
                    await sandbox.write_file(path, data)
            except (InvalidArgument, SandboxFileError) as exc:
                raise bad_request(f"cannot write the request's files: {exc}") from None
            for code in body.cells:
                left = deadline - time.monotonic()
                own = body.cell_timeout or math.inf
                try:
                    execution = await sandbox.run_code(code, timeout=max(min(own, left), 0.001))
                except ExecTimeout as exc:
                    if own < left and exc.execution is not None:
                        execution = exc.execution  # its own limit: interrupted, next cell
                    else:  # the total: the run ends, as SandboxFusion's driver is killed
                        return RunJupyterResponse(
                            status=RunStatus.FAILED,
                            driver=CommandRunResult(
                                status=CommandRunStatus.TIME_LIMIT_EXCEEDED,
                                stdout="",
                                stderr=f"the cells ran past total_timeout={body.total_timeout:g}s",
                            ),
                        )
                cells.append(_cell(execution))
            fetched = await _fetch(sandbox, body.fetch_files, max_file_bytes)
    except HttpError:
        raise
    except SandboxError as exc:
        infrastructure = isinstance(exc, InfrastructureError)
        log.warning("remote.fusion.sandbox_error", error=repr(exc), infrastructure=infrastructure)
        return RunJupyterResponse(
            status=RunStatus.SANDBOX_ERROR,
            message=f"{'infrastructure error' if infrastructure else 'sandbox error'}: {exc}",
        )
    return RunJupyterResponse(
        status=RunStatus.SUCCESS,
        driver=CommandRunResult(
            status=CommandRunStatus.FINISHED,
            execution_time=time.monotonic() - started,
            return_code=0,
            stdout="",
            stderr="",
        ),
        cells=cells,
        files=fetched,
    )


def _cell(execution: Execution) -> CellRunResult:
    """A cell's answer as SandboxFusion's kernel driver collects it from Jupyter's
    messages: streams joined, display bundles (``display_data``, ``execute_result``), the
    ``error`` message's content."""
    error = execution.error
    return CellRunResult(
        stdout="".join(execution.logs.stdout),
        stderr="".join(execution.logs.stderr),
        display=[_bundle(result) for result in execution.results],
        error=[]
        if error is None
        else [
            {"ename": error.name, "evalue": error.value, "traceback": error.traceback.splitlines()}
        ],
    )


def _bundle(result: Result) -> dict[str, Any]:
    """A result as the MIME bundle Jupyter sends (binary formats in base64)."""
    bundle: dict[str, Any] = {}
    for mime, name in MIME_TYPES.items():
        value = getattr(result, name)
        if value is None:
            continue
        bundle[mime] = (
            base64.b64encode(value).decode("ascii") if isinstance(value, bytes) else value
        )
    bundle.update(result.extra)
    return bundle


MIME_TYPES = {
    "text/plain": "text",
    "text/html": "html",
    "text/markdown": "markdown",
    "image/svg+xml": "svg",
    "image/png": "png",
    "image/jpeg": "jpeg",
    "application/pdf": "pdf",
    "text/latex": "latex",
    "application/json": "json",
    "application/javascript": "javascript",
}
"""Jupyter's MIME types of :class:`asyncsandbox.Result`'s fields."""


def _compiled(compiled: CompileResult) -> CommandRunResult:
    """The build step, as SandboxFusion reports one (the compiler's messages as stderr)."""
    if compiled.returncode is None:
        return CommandRunResult(status=CommandRunStatus.TIME_LIMIT_EXCEEDED, stderr=compiled.output)
    return CommandRunResult(
        status=CommandRunStatus.FINISHED,
        execution_time=compiled.seconds,
        return_code=compiled.returncode,
        stdout="",
        stderr=compiled.output,
    )


def _sandbox_error(exc: SandboxError) -> RunCodeResponse:
    infrastructure = isinstance(exc, InfrastructureError)
    log.warning("remote.fusion.sandbox_error", error=repr(exc), infrastructure=infrastructure)
    return RunCodeResponse(
        status=RunStatus.SANDBOX_ERROR,
        message=f"{'infrastructure error' if infrastructure else 'sandbox error'}: {exc}",
    )


async def _fetch(sandbox: Sandbox, paths: list[str], max_bytes: int) -> dict[str, str]:
    fetched: dict[str, str] = {}
    for path in dict.fromkeys(paths):
        try:
            data = await sandbox.read_file(path, max_bytes=max_bytes)
        except (InvalidArgument, SandboxFileError):
            continue  # as SandboxFusion: a file that cannot be fetched is left out
        fetched[path] = base64.b64encode(data).decode("ascii")
    return fetched


def _response(
    compile_result: CommandRunResult | None,
    run_result: CommandRunResult | None,
    files: dict[str, str],
) -> RunCodeResponse:
    """SandboxFusion's ``parse_run_status``: an unlaunchable step is SandboxError; a time
    limit or a non-zero exit is Failed; else Success."""
    steps = [r for r in (compile_result, run_result) if r is not None]
    status = RunStatus.SUCCESS
    message = ""
    errors = [r for r in steps if r.status == CommandRunStatus.ERROR]
    if errors:
        status, message = RunStatus.SANDBOX_ERROR, errors[0].stderr or ""
    elif any(
        r.status == CommandRunStatus.TIME_LIMIT_EXCEEDED or r.return_code not in (None, 0)
        for r in steps
    ):
        status = RunStatus.FAILED
    return RunCodeResponse(
        status=status,
        message=message,
        compile_result=compile_result,
        run_result=run_result,
        files=files,
    )
