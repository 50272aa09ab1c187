"""The judge's engine: a :class:`JudgeRequest` in, a :class:`JudgeResult` out.

It builds the program once, runs the cases (:mod:`._cases`), and forms each case's
verdict from the case's own answer: its exit status, the signal that killed it, its time
and its output, compared here (:mod:`._compare`) or by a checker in a sandbox of its own.
It knows nothing of sessions: it is given a started sandbox, or a way to make fresh ones.
"""

from __future__ import annotations

import re
import uuid
from collections.abc import Awaitable, Callable
from contextlib import AbstractAsyncContextManager
from typing import Any, Protocol

import anyio

from .._errors import ExecTimeout, InfrastructureError, InvalidArgument
from .._models import ExecResult
from ._cases import DIGEST, RUNNER_KILLED, CannotRun, CaseRun, Source, Target, run_cases
from ._compare import same
from ._model import (
    CaseResult,
    Checker,
    CompileResult,
    JudgeRequest,
    JudgeResult,
    Program,
    Verdict,
)

__all__ = ("Sandboxes", "Workspace", "judge", "judge_fresh", "judge_in", "judge_remotely")

_MEMORY_ERRORS = re.compile(
    rb"MemoryError|std::bad_alloc|Cannot allocate memory|out of memory|OutOfMemoryError"
)


class Workspace(Target, Protocol):
    """What judging needs of a sandbox (:class:`asyncsandbox.Sandbox` has it)."""

    async def write_file(self, path: str, data: bytes | str) -> Any: ...


Sandboxes = Callable[[], AbstractAsyncContextManager[Workspace]]
"""Makes a fresh sandbox to judge in (started on entering, removed on leaving)."""


async def judge(target: Workspace | Sandboxes, request: JudgeRequest) -> JudgeResult:
    """Judge ``request`` in ``target``: a started sandbox, or a function that makes fresh
    ones, such as ``lambda: session.sandbox(image=...)`` (each is removed afterwards; a
    :class:`Checker` gets one of its own). :meth:`Session.judge` is the usual way: it
    builds the request from its arguments, makes the sandbox from the session's defaults,
    and hands the whole request to a backend that judges where its sandboxes are.

    Cancellation: running cases are killed; sandboxes made for the call are removed.
    """
    if callable(target):
        return await judge_fresh(request, target)
    return await judge_in(target, request)


async def judge_fresh(request: JudgeRequest, sandboxes: Sandboxes) -> JudgeResult:
    """Judge ``request`` in a fresh sandbox (and the checker, if any, in another).

    Cancellation: running cases are killed; the sandboxes are removed.
    """
    judgement = _Judgement(request)
    started = anyio.current_time()
    try:
        async with sandboxes() as sandbox:
            if isinstance(request.comparison, Checker):
                async with sandboxes() as checker:
                    return await judgement.run(sandbox, checker)
            return await judgement.run(sandbox, None)
    except InfrastructureError as exc:  # starting or removing a sandbox failed
        return judgement.infrastructure(str(exc), started, (), None)


async def judge_remotely(request: JudgeRequest, judged: Awaitable[JudgeResult]) -> JudgeResult:
    """The result of ``judged``, a judgement of ``request`` made elsewhere (by a
    :class:`JudgingBackend`); an infrastructure failure is a result too.

    Cancellation: as ``judged``'s.
    """
    started = anyio.current_time()
    try:
        return await judged
    except InfrastructureError as exc:
        return _Judgement(request).infrastructure(str(exc), started, (), None)


async def judge_in(sandbox: Workspace, request: JudgeRequest) -> JudgeResult:
    """Judge ``request`` in ``sandbox``, a started sandbox (a checker needs a sandbox of
    its own: judge through a Session for that).

    Cancellation: running cases are killed.
    """
    if isinstance(request.comparison, Checker):
        raise InvalidArgument(
            "a Checker runs in a sandbox of its own: judge on a Session, not a Sandbox"
        )
    return await _Judgement(request).run(sandbox, None)


class _Infrastructure(Exception):
    """Not the program's fault: the judgement ends as infrastructure_error."""


class _Judgement:
    def __init__(self, request: JudgeRequest) -> None:
        self.request = request
        self.directory = request.directory or f"/tmp/judge-{uuid.uuid4().hex[:8]}"

    async def run(self, sandbox: Workspace, checker: Workspace | None) -> JudgeResult:
        request = self.request
        started = anyio.current_time()
        results: dict[int, CaseResult] = {}
        compiled: CompileResult | None = None
        try:
            argv, source, compiled = await self._build(sandbox, request.program, self.directory)
            if compiled is not None and compiled.returncode != 0:
                cases = tuple(
                    CaseResult(index=i, name=c.name, verdict=Verdict.COMPILE_ERROR, seconds=0.0)
                    for i, c in enumerate(request.cases)
                )
                return self._result(Verdict.COMPILE_ERROR, cases, compiled, started)
            checker_argv = None
            if checker is not None:
                assert isinstance(request.comparison, Checker)
                checker_argv = await self._build_checker(checker, request.comparison.program)
            try:
                await self._run_cases(sandbox, argv, source, checker, checker_argv, results)
            except CannotRun as exc:
                raise _Infrastructure(f"the sandbox cannot run the cases: {exc}") from None
        except (InfrastructureError, _Infrastructure) as exc:
            done = tuple(results[i] for i in sorted(results))
            return self.infrastructure(str(exc), started, done, compiled)
        cases = tuple(
            results.get(i) or CaseResult(index=i, name=c.name, verdict=Verdict.SKIPPED, seconds=0.0)
            for i, c in enumerate(request.cases)
        )
        failing = next((c.verdict for c in cases if c.verdict != Verdict.ACCEPTED), None)
        return self._result(failing or Verdict.ACCEPTED, cases, compiled, started)

    # -- steps ---------------------------------------------------------------------------

    async def _build(
        self, sandbox: Workspace, program: Program, directory: str
    ) -> tuple[tuple[str, ...], Source | None, CompileResult | None]:
        """Compile ``program`` in ``directory``; return how to run it, and its source if
        the cases' runner is to write it (a program that needs no compiling)."""
        if program.command is not None:
            if self.request.directory is None:
                self.directory = ""  # a ready command runs where the sandbox's commands do
            return program.command, None, None
        language = program.resolved
        assert language is not None
        assert program.source is not None
        source = language.source
        run = tuple(arg.format(source=source) for arg in language.run)
        if language.compile is None:
            return run, Source(source, _bytes(program.source)), None
        await sandbox.write_file(f"{directory}/{source}", program.source)
        argv = tuple(arg.format(source=source) for arg in language.compile)
        timeout = self.request.compile_timeout
        try:
            built = await sandbox.exec(argv, cwd=directory, timeout=timeout)
        except ExecTimeout as exc:
            output = _text(exc.result.stdout + exc.result.stderr, 16384, tail=True)
            return (
                run,
                None,
                CompileResult(
                    returncode=None,
                    seconds=exc.result.duration,
                    output=f"compilation timed out after {timeout:g}s\n{output}",
                ),
            )
        if built.returncode in (126, 127):
            raise _Infrastructure(
                f"the sandbox cannot run the {language.name} compiler {argv[0]!r} "
                f"(exit status {built.returncode}): {_text(built.stderr, 400, tail=True)}"
            )
        return (
            run,
            None,
            CompileResult(
                returncode=built.returncode,
                seconds=built.duration,
                output=_text(built.stdout + built.stderr, 16384, tail=True),
            ),
        )

    async def _build_checker(self, checker: Workspace, program: Program) -> tuple[str, ...]:
        """Build the checker in its sandbox, in a directory of the same name as ours."""
        directory = self.directory or "/tmp/judge"
        run, source, compiled = await self._build(checker, program, directory)
        if compiled is not None and compiled.returncode != 0:
            raise _Infrastructure(f"the checker does not compile:\n{compiled.output}")
        if source is not None:  # the checker runs as a plain command: its file is needed
            await checker.write_file(f"{directory}/{source.name}", source.data)
        return run

    async def _run_cases(
        self,
        sandbox: Workspace,
        argv: tuple[str, ...],
        source: Source | None,
        checker: Workspace | None,
        checker_argv: tuple[str, ...] | None,
        results: dict[int, CaseResult],
    ) -> None:
        request = self.request
        language = request.program.resolved
        fork = language is not None and language.fork

        async def answer(index: int, result: ExecResult) -> bool:
            verdict = await self._verdict(index, argv, result, checker, checker_argv)
            results[index] = verdict
            return not (request.stop_on_failure and verdict.verdict != Verdict.ACCEPTED)

        cases = []
        for index, case in enumerate(request.cases):
            time_limit, memory_mb = request.limits(case)
            cases.append(CaseRun(index, _bytes(case.stdin), time_limit, memory_mb))
        # With stop_on_failure and one case at a time, the cases run in order and stop at
        # the first failure (the rest are skipped).
        await run_cases(
            sandbox,
            argv,
            fork=fork,
            cwd=self.directory or None,
            source=source,
            cases=cases,
            parallel=request.parallel,
            output_limit=request.output_limit,
            answer=answer,
        )

    async def _verdict(
        self,
        index: int,
        run: tuple[str, ...],
        result: ExecResult,
        checker: Workspace | None,
        checker_argv: tuple[str, ...] | None,
    ) -> CaseResult:
        """The verdict on one case's run."""
        request = self.request
        case = request.cases[index]
        time_limit, memory_mb = request.limits(case)
        full = request.full_output

        def done(verdict: Verdict, message: str = "") -> CaseResult:
            returncode = result.returncode
            return CaseResult(
                index=index,
                name=case.name,
                verdict=verdict,
                seconds=result.duration,
                cpu_seconds=result.cpu_time,
                returncode=returncode,
                signal=returncode - 128 if returncode > 128 else None,
                stdout=_text(result.stdout, None if full else DIGEST),
                stderr=_text(result.stderr, None if full else DIGEST, tail=True),
                message=message,
            )

        if result.timed_out:
            return done(Verdict.TIME_LIMIT, f"killed after {time_limit:g}s")
        if result.stdout_truncated or result.stderr_truncated:
            return done(Verdict.OUTPUT_LIMIT, f"more than {request.output_limit} bytes")
        if result.oom_killed or (
            result.returncode != 0
            and memory_mb is not None
            and _MEMORY_ERRORS.search(result.stderr[-DIGEST:])
        ):
            return done(Verdict.MEMORY_LIMIT)
        if result.returncode != 0:
            message = f"exit status {result.returncode}"
            if result.returncode == RUNNER_KILLED and result.stderr.startswith(b"the judge's"):
                message = result.stderr.decode()
            return done(Verdict.RUNTIME_ERROR, message)
        if checker is not None and checker_argv is not None:
            verdict, message = await self._check(checker, checker_argv, index, result)
            return done(verdict, message)
        comparison = request.comparison
        assert not isinstance(comparison, Checker)
        if case.expected is None or same(_bytes(case.expected), result.stdout, comparison):
            return done(Verdict.ACCEPTED)
        return done(Verdict.WRONG_ANSWER, "output differs from the expected")

    async def _check(
        self, checker: Workspace, run: tuple[str, ...], index: int, result: ExecResult
    ) -> tuple[Verdict, str]:
        case = self.request.cases[index]
        directory = f"{self.directory or '/tmp/judge'}/case-{index}"
        files = {"input": case.stdin, "expected": case.expected or b"", "output": result.stdout}
        for name, content in files.items():
            await checker.write_file(f"{directory}/{name}", content)
        checked = await checker.exec(
            (*run, f"{directory}/input", f"{directory}/expected", f"{directory}/output"),
            cwd=self.directory or None,
            timeout=self.request.time_limit * 4,
        )
        message = _text(checked.stdout + checked.stderr, 400, tail=True)
        if checked.returncode == 0:
            return Verdict.ACCEPTED, message
        if checked.returncode == 1:
            return Verdict.WRONG_ANSWER, message
        raise _Infrastructure(f"the checker failed (exit status {checked.returncode}): {message}")

    # -- results ---------------------------------------------------------------------------

    def _result(
        self,
        verdict: Verdict,
        cases: tuple[CaseResult, ...],
        compiled: CompileResult | None,
        started: float,
    ) -> JudgeResult:
        passed = sum(c.verdict == Verdict.ACCEPTED for c in cases)
        return JudgeResult(
            verdict=verdict,
            score=passed / len(self.request.cases),
            passed=passed,
            total=len(self.request.cases),
            cases=cases,
            compile=compiled,
            seconds=anyio.current_time() - started,
        )

    def infrastructure(
        self,
        error: str,
        started: float,
        cases: tuple[CaseResult, ...],
        compiled: CompileResult | None,
    ) -> JudgeResult:
        return JudgeResult(
            verdict=Verdict.INFRASTRUCTURE_ERROR,
            score=None,
            passed=sum(c.verdict == Verdict.ACCEPTED for c in cases),
            total=len(self.request.cases),
            cases=cases,
            compile=compiled,
            error=error,
            seconds=anyio.current_time() - started,
        )


def _text(data: bytes, limit: int | None, *, tail: bool = False) -> str:
    cut = data if limit is None else data[-limit:] if tail else data[:limit]
    return cut.decode(errors="replace")


def _bytes(value: str | bytes) -> bytes:
    """A case's input or expected output (stored as bytes; typed as given)."""
    return value.encode() if isinstance(value, str) else value
