"""The arguments of a Sandbox's commands and code, checked (bad input gets a clear
:class:`~asyncsandbox.InvalidArgument` before anything runs), and a command's result made of
what it left."""

from __future__ import annotations

from . import _validate as check
from ._config import SandboxDefaults
from ._errors import InvalidArgument
from ._interpreter._models import DEFAULT_CONTEXT, LANGUAGE, CodeContext, CodeRequest
from ._models import ExecResult
from ._output import BoundedBuffer
from .abc import ExitStatus

__all__ = (
    "ExecArgs",
    "code_context_id",
    "code_language",
    "code_request",
    "exec_result",
    "short",
)


class ExecArgs:
    """The arguments of a command (``exec``, ``exec_stream``), checked, with the sandbox's
    settings filled in."""

    __slots__ = ("argv", "check", "cwd", "env", "limit", "stdin", "timeout")

    def __init__(
        self,
        config: SandboxDefaults,
        argv: object,
        cwd: object,
        env: object,
        stdin: object,
        timeout: object,
        check_: object,
        max_output_bytes: object,
    ) -> None:
        self.argv = check.argv(argv)
        self.cwd = (
            config.workdir
            if cwd is None
            else check.sandbox_path("cwd", cwd, workdir=config.workdir)
        )
        self.env = {**config.env, **check.env("env", env)}
        self.stdin = check.stdin(stdin)
        self.timeout = check.seconds("timeout", timeout)
        if not isinstance(check_, bool):
            raise InvalidArgument(f"check must be a bool, got {check_!r}")
        self.check: bool = check_
        limit = config.max_output_bytes if max_output_bytes is None else max_output_bytes
        self.limit = check.positive_int("max_output_bytes", limit)


def exec_result(
    args: ExecArgs,
    status: ExitStatus,
    buffers: dict[str, BoundedBuffer],
    *,
    duration: float,
    timed_out: bool,
) -> ExecResult:
    """The result of the command ``args`` that ended with ``status``, its output bounded
    in ``buffers``."""
    out, err = buffers["stdout"], buffers["stderr"]
    return ExecResult(
        argv=args.argv,
        returncode=status.returncode,
        stdout=out.getvalue(),
        stderr=err.getvalue(),
        duration=duration,
        timed_out=timed_out,
        stdout_truncated=out.truncated,
        stderr_truncated=err.truncated,
        stdout_size=out.size,
        stderr_size=err.size,
        signal=status.signal,
        oom_killed=status.oom_killed,
        cpu_time=status.cpu_time,
    )


def code_request(
    config: SandboxDefaults,
    code: object,
    context: object,
    language: object,
    timeout: object,
    env: object,
    max_output_bytes: object,
) -> CodeRequest:
    """The arguments of a ``run_code`` call, checked, as the request the interpreter runs."""
    if not isinstance(code, str):
        raise InvalidArgument(f"code must be a str, got {type(code).__name__}")
    if context is not None and language is not None:
        raise InvalidArgument("give a context or a language, not both")
    code_language(language)
    limit = config.max_output_bytes if max_output_bytes is None else max_output_bytes
    return CodeRequest(
        code=code,
        context=DEFAULT_CONTEXT if context is None else code_context_id(context),
        timeout=check.seconds("timeout", timeout),
        env=check.env("env", env),
        max_output_bytes=check.positive_int("max_output_bytes", limit),
    )


def code_language(language: object) -> str:
    """The language code runs in (python) if ``language`` names it (``None`` does)."""
    if language is None:
        return LANGUAGE
    if not isinstance(language, str) or language.strip().lower() != LANGUAGE:
        raise InvalidArgument(f"code runs as python; language {language!r} is not supported")
    return LANGUAGE


def code_context_id(context: object) -> str:
    """The id of a code context given as a :class:`~asyncsandbox.CodeContext` or an id."""
    if isinstance(context, CodeContext):
        return context.id
    return check.identifier("context", context)


def short(argv: tuple[str, ...], limit: int = 120) -> str:
    """A command line, cut to ``limit`` characters, for messages."""
    text = " ".join(argv)
    return text if len(text) <= limit else text[: limit - 3] + "..."
