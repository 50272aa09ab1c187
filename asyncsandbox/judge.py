"""Judging programs: compile once, run many test cases in one sandbox, typed verdicts.

The most common code reward: a model wrote a program; run it on test cases (stdin in,
stdout compared with what is expected) and score it::

    import asyncsandbox
    from asyncsandbox.judge import Program, TestCase

    async with asyncsandbox.Session() as session:
        result = await session.judge(
            Program(source=cpp_source, language="cpp"),
            [TestCase(stdin="1 2\\n", expected="3\\n"), TestCase(stdin="5 5\\n", expected="10\\n")],
            time_limit=2,
        )
        reward = result.score  # accepted / total, or None if the infrastructure failed

The program is compiled once (``c``, ``cpp``, ``java``) and every case runs in the same
sandbox, ``parallel`` at a time, each as a command of its own with its own time (and
optionally memory) limit. Verdicts come from the command's exit status, as the sandbox's
init reaped it, and from its output compared on the host: the program cannot forge a
verdict, whatever it prints. A checker program, when given, runs in a sandbox of its own,
out of the judged program's reach.

Python is compiled once too: one command starts the sandbox's ``python3`` on a runner
(:mod:`asyncsandbox._judge_runner`) that compiles the program and runs each case in a
fork of itself, as ``python3 main.py`` would run it, without paying an interpreter's start
per case. Statuses still come from ``waitpid`` and outputs from the case's own pipes, and
the cases the runner does not answer for (the program killed it, say) are run the plain
way, one command each.

A failure of the sandbox or the backend (``InfrastructureError``), or a language whose
compiler or interpreter the sandbox lacks, is not the program's fault: the result's
verdict is :attr:`Verdict.INFRASTRUCTURE_ERROR` and its ``score`` is ``None`` (TRL leaves
``None`` rewards unscored), never a wrong answer.
"""

from __future__ import annotations

import enum
import json
import math
import re
import uuid
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, Protocol, runtime_checkable

import anyio
import msgspec

from . import _validate as check
from ._errors import ExecTimeout, InfrastructureError, InvalidArgument
from ._log import get_logger
from ._models import ExecResult
from .abc import SandboxSpec

if TYPE_CHECKING:
    from ._sandbox import Sandbox
    from ._session import Session

__all__ = (
    "JudgeRequest",
    "JudgingBackend",
    "Language",
    "LANGUAGES",
    "Program",
    "TestCase",
    "FloatTolerance",
    "Checker",
    "Comparison",
    "Verdict",
    "CaseResult",
    "CompileResult",
    "JudgeResult",
    "judge",
)


class Language(msgspec.Struct, frozen=True, kw_only=True):
    """How to build and run a program of one language in a sandbox. Add your own by
    passing one as ``Program(language=Language(...))``, or by adding it to
    :data:`LANGUAGES`. Arguments may use ``{source}`` (the source file's name)."""

    name: str
    source: str
    """File name the source is written to, in the judging directory."""
    compile: tuple[str, ...] | None = None
    """The build command, run once; ``None``: interpreted."""
    run: tuple[str, ...]
    """The command each test case runs (in the judging directory)."""
    fork: bool = False
    """Run the cases in forks of one interpreter that has compiled the source, instead of
    one command each (Python only: ``run`` is the interpreter and ``{source}``)."""

    def __post_init__(self) -> None:
        if self.fork and (len(self.run) != 2 or self.run[1] != "{source}"):
            raise InvalidArgument(
                f"a Language with fork=True runs (interpreter, '{{source}}'), got {self.run!r}"
            )


LANGUAGES: dict[str, Language] = {
    language.name: language
    for language in (
        Language(name="python", source="main.py", run=("python3", "{source}"), fork=True),
        Language(
            name="c",
            source="main.c",
            compile=("gcc", "-O2", "-std=gnu11", "-o", "main", "{source}", "-lm"),
            run=("./main",),
        ),
        Language(
            name="cpp",
            source="main.cpp",
            compile=("g++", "-O2", "-std=gnu++17", "-o", "main", "{source}"),
            run=("./main",),
        ),
        Language(name="bash", source="main.sh", run=("bash", "{source}")),
        Language(name="javascript", source="main.js", run=("node", "{source}")),
        Language(
            name="java",
            source="Main.java",
            compile=("javac", "-encoding", "UTF-8", "{source}"),
            run=("java", "-Xss64m", "Main"),
        ),
    )
}
"""The built-in languages: ``python``, ``c``, ``cpp``, ``bash``, ``javascript`` (node),
``java`` (``class Main``); each needs its compiler or interpreter in the sandbox."""


class Program(msgspec.Struct, frozen=True, kw_only=True):
    """What is judged: ``source`` in ``language`` (a name of :data:`LANGUAGES` or a
    :class:`Language`), or a ready ``command`` (argv, run as is for every case)."""

    source: str | None = None
    language: str | Language = "python"
    command: tuple[str, ...] | None = None

    def __post_init__(self) -> None:
        if (self.source is None) == (self.command is None):
            raise InvalidArgument("a Program needs a source or a command (one of them)")
        if self.source is not None:
            if not isinstance(self.source, str):
                raise InvalidArgument(f"source must be a str, got {type(self.source).__name__}")
            if isinstance(self.language, str) and self.language not in LANGUAGES:
                known = ", ".join(sorted(LANGUAGES))
                raise InvalidArgument(
                    f"unknown language {self.language!r}; known: {known} (or pass a Language)"
                )
        if self.command is not None:
            msgspec.structs.force_setattr(self, "command", check.argv(self.command))


class TestCase(msgspec.Struct, frozen=True, kw_only=True):
    """One test: the input, the expected output, and limits of its own (else the judge
    call's)."""

    __test__ = False  # not a pytest test class

    stdin: str | bytes = b""
    expected: str | bytes | None = None
    """``None``: only the checker (if any) and the exit status decide."""
    time_limit: float | None = None
    memory_mb: int | None = None
    name: str | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.stdin, str | bytes):
            raise InvalidArgument(f"stdin must be str or bytes, got {type(self.stdin).__name__}")
        if self.expected is not None and not isinstance(self.expected, str | bytes):
            raise InvalidArgument(
                f"expected must be str, bytes or None, got {type(self.expected).__name__}"
            )
        if self.time_limit is not None and not check.seconds("time_limit", self.time_limit):
            raise InvalidArgument("time_limit must be > 0")
        check.optional_positive_int("memory_mb", self.memory_mb)


class FloatTolerance(msgspec.Struct, frozen=True, kw_only=True):
    """Outputs match token by token; numbers within ``abs`` or ``rel`` of each other."""

    abs: float = 1e-6
    rel: float = 1e-6


class Checker(msgspec.Struct, frozen=True, kw_only=True):
    """A checker program (testlib's convention): run as ``checker INPUT EXPECTED OUTPUT``
    (three file paths) in a sandbox of its own; exit status 0 accepts, 1 is a wrong
    answer, anything else is an error of the checker (infrastructure). Its output is
    the case's message. Needs a Session (it creates the checker's sandbox)."""

    program: Program


Comparison = Literal["exact", "lines", "whitespace"] | FloatTolerance | Checker
"""``exact`` (bytes equal), ``lines`` (trailing whitespace of each line and trailing empty
lines ignored), ``whitespace`` (whitespace-separated tokens equal), a
:class:`FloatTolerance` or a :class:`Checker`."""


class Verdict(enum.StrEnum):
    """How a test case (or a whole judgement) ended."""

    ACCEPTED = "accepted"
    WRONG_ANSWER = "wrong_answer"
    TIME_LIMIT = "time_limit"
    MEMORY_LIMIT = "memory_limit"
    RUNTIME_ERROR = "runtime_error"
    OUTPUT_LIMIT = "output_limit"
    COMPILE_ERROR = "compile_error"
    SKIPPED = "skipped"
    """Not run: an earlier case failed and ``stop_on_failure`` was set."""
    INFRASTRUCTURE_ERROR = "infrastructure_error"
    """The sandbox or the backend failed: not the program's fault (mask it)."""


class CaseResult(msgspec.Struct, frozen=True, kw_only=True):
    """What one test case gave."""

    index: int
    name: str | None
    verdict: Verdict
    seconds: float
    returncode: int | None = None
    signal: int | None = None
    """The signal that killed the program (runtime errors), when known."""
    stdout: str = ""
    """The start of its output (up to 4 KiB)."""
    stderr: str = ""
    """The end of its error output (up to 4 KiB)."""
    message: str = ""


class CompileResult(msgspec.Struct, frozen=True, kw_only=True):
    """The build step, when the language has one."""

    returncode: int | None
    seconds: float
    output: str
    """The compiler's messages (stdout and stderr, up to 16 KiB)."""


class JudgeResult(msgspec.Struct, frozen=True, kw_only=True):
    """A judgement: the verdict, the score, and every case."""

    verdict: Verdict
    """``accepted`` if every case was; else the first failing case's verdict
    (``compile_error``, ``infrastructure_error`` for the whole)."""
    score: float | None
    """Accepted cases over all cases; ``None`` when the infrastructure failed."""
    passed: int
    total: int
    cases: tuple[CaseResult, ...]
    compile: CompileResult | None = None
    error: str | None = None
    """What failed, for ``infrastructure_error``."""
    seconds: float = 0.0


class JudgeRequest(msgspec.Struct, frozen=True, kw_only=True):
    """A whole judgement, for a backend that judges where its sandboxes run
    (:class:`JudgingBackend`): the arguments of :func:`judge`, and the sandbox to judge in."""

    program: Program
    cases: tuple[TestCase, ...]
    comparison: str = "whitespace"
    """``exact``, ``lines``, ``whitespace``, ``float`` (see ``float_tolerance``) or
    ``checker`` (see ``checker``)."""
    float_tolerance: FloatTolerance | None = None
    checker: Program | None = None
    time_limit: float = 10.0
    memory_mb: int | None = None
    stop_on_failure: bool = False
    parallel: int = 4
    compile_timeout: float = 60.0
    output_limit: int = 1 << 20
    sandbox: SandboxSpec | None = None
    """The sandbox to judge in (the session's defaults and the call's overrides)."""

    def comparison_value(self) -> Comparison:
        """The :data:`Comparison` this request asks for."""
        if self.comparison == "float":
            return self.float_tolerance or FloatTolerance()
        if self.comparison == "checker":
            if self.checker is None:
                raise InvalidArgument("comparison 'checker' needs a checker program")
            return Checker(program=self.checker)
        if self.comparison not in ("exact", "lines", "whitespace"):
            raise InvalidArgument(f"unknown comparison {self.comparison!r}")
        return self.comparison  # type: ignore[return-value]


@runtime_checkable
class JudgingBackend(Protocol):
    """A backend that judges where its sandboxes are (the remote backend: on its server),
    in one round trip instead of one per case. :meth:`Session.judge` hands it the whole
    request when the session's backend provides this; the result is the same."""

    async def judge(self, request: JudgeRequest) -> JudgeResult:
        """Judge ``request`` in a fresh sandbox of ``request.sandbox`` and remove it.

        Cancellation: the running cases are killed and the sandbox removed.
        """


DIGEST = 4096
_MEMORY_ERRORS = re.compile(
    rb"MemoryError|std::bad_alloc|Cannot allocate memory|out of memory|OutOfMemoryError"
)
_LIMIT_MEMORY = 'ulimit -v "$1" || exit 125; shift; exec "$@"'
_RUNNER = (Path(__file__).parent / "_judge_runner.py").read_text()
_log = get_logger("asyncsandbox.judge")


async def judge(
    target: Session | Sandbox,
    program: Program,
    cases: Sequence[TestCase | Mapping[str, Any]],
    *,
    comparison: Comparison = "whitespace",
    time_limit: float = 10.0,
    memory_mb: int | None = None,
    stop_on_failure: bool = False,
    parallel: int = 4,
    compile_timeout: float = 60.0,
    output_limit: int = 1 << 20,
    sandbox: Mapping[str, Any] | None = None,
) -> JudgeResult:
    """Judge ``program`` on ``cases`` (see the module docstring) in a fresh sandbox of the
    session ``target`` (removed afterwards), or in the started sandbox ``target``.

    :param comparison: how outputs are compared (see :data:`Comparison`).
    :param time_limit: seconds per case (wall clock), unless the case says otherwise.
    :param memory_mb: address space per case (``ulimit -v``), unless the case says
        otherwise; ``None``: only the sandbox's own memory limit.
    :param stop_on_failure: stop at the first case that is not accepted (the rest are
        ``skipped``); else run them all.
    :param parallel: cases running at once in the sandbox.
    :param compile_timeout: seconds for the build step.
    :param output_limit: bytes of output per case beyond which it is ``output_limit``.
    :param sandbox: overrides of the session's defaults for the sandbox made to judge in
        (``image``, ``resources``, ``env``, ...; as :meth:`Session.sandbox`).

    Cancellation: running cases are killed; the sandbox made for the call is removed.
    """
    tests = _cases(cases)
    if not check.seconds("time_limit", time_limit):
        raise InvalidArgument("time_limit must be > 0")
    check.optional_positive_int("memory_mb", memory_mb)
    check.positive_int("parallel", parallel)
    if not check.seconds("compile_timeout", compile_timeout):
        raise InvalidArgument("compile_timeout must be > 0")
    check.positive_int("output_limit", output_limit)
    if not isinstance(stop_on_failure, bool):
        raise InvalidArgument(f"stop_on_failure must be a bool, got {stop_on_failure!r}")
    if not isinstance(program, Program):
        raise InvalidArgument(f"program must be a Program, got {program!r}")
    _check_comparison(comparison)
    from ._sandbox import Sandbox
    from ._session import Session

    judge = _Judge(
        program, tests, comparison, time_limit, memory_mb, stop_on_failure, parallel,
        compile_timeout, output_limit,
    )  # fmt: skip
    overrides = dict(sandbox or {})
    if isinstance(target, Session):
        backend = target.backend
        if isinstance(backend, JudgingBackend):
            return await judge.delegated(target, backend, overrides)
        return await judge.on_session(target, overrides)
    if overrides:
        raise InvalidArgument("sandbox overrides apply when judging on a Session")
    if isinstance(target, Sandbox):
        if isinstance(comparison, Checker):
            raise InvalidArgument(
                "a Checker runs in a sandbox of its own: judge on a Session, not a Sandbox"
            )
        return await judge.in_sandbox(target, None)
    raise InvalidArgument(f"judge() runs on a Session or a Sandbox, got {target!r}")


def _cases(cases: object) -> tuple[TestCase, ...]:
    if isinstance(cases, str | bytes) or not isinstance(cases, Sequence):
        raise InvalidArgument("cases must be a sequence of TestCase (or of their dicts)")
    if not cases:
        raise InvalidArgument("judge() needs at least one test case")
    out = []
    for case in cases:
        if isinstance(case, TestCase):
            out.append(case)
        elif isinstance(case, Mapping):
            try:
                out.append(TestCase(**case))
            except (TypeError, InvalidArgument) as exc:
                raise InvalidArgument(f"invalid test case {case!r}: {exc}") from None
        else:
            raise InvalidArgument(f"a test case is a TestCase or a dict, got {case!r}")
    return tuple(out)


def _check_comparison(comparison: object) -> None:
    if comparison in ("exact", "lines", "whitespace"):
        return
    if isinstance(comparison, FloatTolerance | Checker):
        return
    raise InvalidArgument(
        "comparison must be 'exact', 'lines', 'whitespace', a FloatTolerance or a Checker; "
        f"got {comparison!r}"
    )


class _Infrastructure(Exception):
    """Not the program's fault: the judgement ends as infrastructure_error."""


class _Judge:
    def __init__(
        self,
        program: Program,
        cases: tuple[TestCase, ...],
        comparison: Comparison,
        time_limit: float,
        memory_mb: int | None,
        stop_on_failure: bool,
        parallel: int,
        compile_timeout: float,
        output_limit: int,
    ) -> None:
        self.program = program
        self.cases = cases
        self.comparison = comparison
        self.time_limit = time_limit
        self.memory_mb = memory_mb
        self.stop_on_failure = stop_on_failure
        self.parallel = parallel
        self.compile_timeout = compile_timeout
        self.output_limit = output_limit
        self.directory = f"/tmp/judge-{uuid.uuid4().hex[:8]}"

    async def on_session(self, session: Session, overrides: dict[str, Any]) -> JudgeResult:
        started = anyio.current_time()
        try:
            async with session.sandbox(**overrides) as sandbox:
                if isinstance(self.comparison, Checker):
                    async with session.sandbox(**overrides) as checker:
                        return await self.in_sandbox(sandbox, checker)
                return await self.in_sandbox(sandbox, None)
        except InfrastructureError as exc:  # starting or removing a sandbox failed
            return self._infrastructure(str(exc), started, (), None)

    async def delegated(
        self, session: Session, backend: JudgingBackend, overrides: dict[str, Any]
    ) -> JudgeResult:
        """The whole judgement through the backend (one round trip to a server)."""
        started = anyio.current_time()
        comparison = self.comparison
        request = JudgeRequest(
            program=self.program,
            cases=self.cases,
            comparison=(
                "float"
                if isinstance(comparison, FloatTolerance)
                else "checker"
                if isinstance(comparison, Checker)
                else comparison
            ),
            float_tolerance=comparison if isinstance(comparison, FloatTolerance) else None,
            checker=comparison.program if isinstance(comparison, Checker) else None,
            time_limit=self.time_limit,
            memory_mb=self.memory_mb,
            stop_on_failure=self.stop_on_failure,
            parallel=self.parallel,
            compile_timeout=self.compile_timeout,
            output_limit=self.output_limit,
            sandbox=session._sandbox_spec(overrides),
        )
        try:
            return await session._judge_remotely(backend, request)
        except InfrastructureError as exc:
            return self._infrastructure(str(exc), started, (), None)

    async def in_sandbox(self, sandbox: Sandbox, checker: Sandbox | None) -> JudgeResult:
        started = anyio.current_time()
        results: dict[int, CaseResult] = {}
        compiled: CompileResult | None = None
        try:
            run, compiled = await self._build(sandbox)
            if compiled is not None and compiled.returncode != 0:
                cases = tuple(
                    CaseResult(index=i, name=c.name, verdict=Verdict.COMPILE_ERROR, seconds=0.0)
                    for i, c in enumerate(self.cases)
                )
                return self._result(Verdict.COMPILE_ERROR, cases, compiled, started)
            if checker is not None:
                checker_run = await self._build_checker(checker)
            else:
                checker_run = None
            pending = list(enumerate(self.cases))
            if self.program.source is not None and _language(self.program.language).fork:
                pending = await self._run_forked(sandbox, run, checker, checker_run, results)
            await self._run_all(sandbox, run, pending, checker, checker_run, results)
        except (InfrastructureError, _Infrastructure) as exc:
            done = tuple(results[i] for i in sorted(results))
            return self._infrastructure(str(exc), started, done, compiled)
        cases = tuple(
            results.get(i) or CaseResult(index=i, name=c.name, verdict=Verdict.SKIPPED, seconds=0.0)
            for i, c in enumerate(self.cases)
        )
        failing = next((c.verdict for c in cases if c.verdict != Verdict.ACCEPTED), None)
        return self._result(failing or Verdict.ACCEPTED, cases, compiled, started)

    # -- steps ---------------------------------------------------------------------------

    async def _build(self, sandbox: Sandbox) -> tuple[tuple[str, ...], CompileResult | None]:
        """Write and compile the program; return how to run it."""
        program = self.program
        if program.command is not None:
            self.directory = ""  # a ready command runs where the sandbox's commands do
            return program.command, None
        assert program.source is not None
        language = _language(program.language)
        source = language.source
        await sandbox.write_file(f"{self.directory}/{source}", program.source)
        run = tuple(arg.format(source=source) for arg in language.run)
        if language.compile is None:
            return run, None
        argv = [arg.format(source=source) for arg in language.compile]
        try:
            built = await sandbox.exec(argv, cwd=self.directory, timeout=self.compile_timeout)
        except ExecTimeout as exc:
            output = _text(exc.result.stdout + exc.result.stderr, 16384, tail=True)
            return run, CompileResult(
                returncode=None,
                seconds=exc.result.duration,
                output=f"compilation timed out after {self.compile_timeout:g}s\n{output}",
            )
        if built.returncode in (126, 127):
            raise _Infrastructure(
                f"the sandbox cannot run the {language.name} compiler {argv[0]!r} "
                f"(exit status {built.returncode}): {_text(built.stderr, 400, tail=True)}"
            )
        return run, CompileResult(
            returncode=built.returncode,
            seconds=built.duration,
            output=_text(built.stdout + built.stderr, 16384, tail=True),
        )

    async def _build_checker(self, checker: Sandbox) -> tuple[str, ...]:
        """Build the checker in its sandbox, in a directory of the same name as ours."""
        assert isinstance(self.comparison, Checker)
        builder = _Judge(
            self.comparison.program, self.cases, "exact", self.time_limit, None, False, 1,
            self.compile_timeout, self.output_limit,
        )  # fmt: skip
        builder.directory = self.directory
        run, compiled = await builder._build(checker)
        if compiled is not None and compiled.returncode != 0:
            raise _Infrastructure(f"the checker does not compile:\n{compiled.output}")
        return run

    async def _run_all(
        self,
        sandbox: Sandbox,
        run: tuple[str, ...],
        cases: list[tuple[int, TestCase]],
        checker: Sandbox | None,
        checker_run: tuple[str, ...] | None,
        results: dict[int, CaseResult],
    ) -> None:
        # Workers take the cases in order (so that with parallel=1 they run one by one,
        # in order, and stop_on_failure skips exactly those after the first failure).
        pending = iter(cases)
        failure: list[BaseException] = []

        async with anyio.create_task_group() as tg:

            async def worker() -> None:
                for index, case in pending:
                    try:
                        result = await self._run(sandbox, run, index, case, checker, checker_run)
                    except (InfrastructureError, _Infrastructure) as exc:
                        failure.append(exc)
                        tg.cancel_scope.cancel()
                        return
                    results[index] = result
                    if self.stop_on_failure and result.verdict != Verdict.ACCEPTED:
                        tg.cancel_scope.cancel()
                        return

            for _ in range(min(self.parallel, len(cases))):
                tg.start_soon(worker)
        if failure:
            raise failure[0]

    async def _run_forked(
        self,
        sandbox: Sandbox,
        run: tuple[str, ...],
        checker: Sandbox | None,
        checker_run: tuple[str, ...] | None,
        results: dict[int, CaseResult],
    ) -> list[tuple[int, TestCase]]:
        """Run the cases through the Python runner, one command for all; return those it
        did not answer for, to be run one command each (none once ``stop_on_failure``
        ended the judging)."""
        limits, memory = zip(*map(self._limits, self.cases), strict=True)
        inputs = [_bytes(case.stdin) for case in self.cases]
        header = {
            "parallel": self.parallel,
            "output_limit": self.output_limit,
            "cases": [
                {"time_limit": t, "memory_kb": None if m is None else m * 1024, "stdin": len(i)}
                for t, m, i in zip(limits, memory, inputs, strict=True)
            ],
        }
        request = json.dumps(header).encode() + b"\n" + b"".join(inputs)
        frames = _Frames(run, len(self.cases))
        answered: dict[int, CaseResult] = {}
        why = "it ended without answering for every case"
        try:
            async with sandbox.exec_stream(
                (run[0], "-c", _RUNNER, run[1]),
                cwd=self.directory,
                stdin=request,
                timeout=sum(limits) + 30,  # every case at its limit, one at a time
                max_output_bytes=DIGEST,
            ) as stream:
                async for chunk in stream:
                    if chunk.stream != "stdout":
                        continue  # the runner's own complaints: in the result's stderr
                    for index, result in frames.feed(chunk.data):
                        if index in answered:
                            raise _Malformed(f"case {index} answered twice")
                        case = self.cases[index]
                        answered[index] = verdict = await self._verdict(
                            index, case, run, result, checker, checker_run
                        )
                        if self.stop_on_failure and verdict.verdict != Verdict.ACCEPTED:
                            results.update(answered)
                            return []  # leaving the block kills the runner
                ran = await stream.wait()
                if not frames.ended:
                    why = f"exit status {ran.returncode}: {_text(ran.stderr, 400, tail=True)}"
        except ExecTimeout:
            why = "it ran past the sum of the time limits"
        except _Malformed as exc:  # nothing it said can be trusted: every case again
            why = f"its answers stopped making sense ({exc})"
            answered.clear()
        results.update(answered)
        left = [(i, case) for i, case in enumerate(self.cases) if i not in results]
        if left:
            _log.warning("judge.runner_gave_up", cases=len(left), reason=why)
        return left

    def _limits(self, case: TestCase) -> tuple[float, int | None]:
        """The case's time and memory limits: its own, else the judgement's."""
        return case.time_limit or self.time_limit, case.memory_mb or self.memory_mb

    async def _run(
        self,
        sandbox: Sandbox,
        run: tuple[str, ...],
        index: int,
        case: TestCase,
        checker: Sandbox | None,
        checker_run: tuple[str, ...] | None,
    ) -> CaseResult:
        time_limit, memory_mb = self._limits(case)
        argv: tuple[str, ...] = run
        if memory_mb is not None:
            argv = ("/bin/sh", "-c", _LIMIT_MEMORY, "sh", str(memory_mb * 1024), *run)
        try:
            result = await sandbox.exec(
                argv,
                cwd=self.directory or None,
                stdin=case.stdin,
                timeout=time_limit,
                max_output_bytes=self.output_limit,
            )
        except ExecTimeout as exc:
            result = exc.result
        return await self._verdict(index, case, run, result, checker, checker_run)

    async def _verdict(
        self,
        index: int,
        case: TestCase,
        run: tuple[str, ...],
        result: ExecResult,
        checker: Sandbox | None,
        checker_run: tuple[str, ...] | None,
    ) -> CaseResult:
        """The verdict on one case's run (by a command of its own, or the runner)."""
        time_limit, memory_mb = self._limits(case)

        def done(verdict: Verdict, result: ExecResult, message: str = "") -> CaseResult:
            returncode = result.returncode
            return CaseResult(
                index=index,
                name=case.name,
                verdict=verdict,
                seconds=result.duration,
                returncode=returncode,
                signal=returncode - 128 if returncode > 128 else None,
                stdout=_text(result.stdout, DIGEST),
                stderr=_text(result.stderr, DIGEST, tail=True),
                message=message,
            )

        if result.timed_out:
            return done(Verdict.TIME_LIMIT, result, f"killed after {time_limit:g}s")
        if result.stdout_truncated or result.stderr_truncated:
            return done(Verdict.OUTPUT_LIMIT, result, f"more than {self.output_limit} bytes")
        if result.oom_killed or (
            result.returncode != 0
            and memory_mb is not None
            and _MEMORY_ERRORS.search(result.stderr[-DIGEST:])
        ):
            return done(Verdict.MEMORY_LIMIT, result)
        if memory_mb is not None and result.returncode == 125 and not result.stdout:
            raise _Infrastructure(f"the sandbox refused a memory limit of {memory_mb} MiB")
        if result.returncode in (126, 127) and index == 0 and not result.stdout:
            # The interpreter or the program file itself is missing: not the program's doing.
            raise _Infrastructure(
                f"the sandbox cannot run {run[0]!r} (exit status {result.returncode}): "
                f"{_text(result.stderr, 400, tail=True)}"
            )
        if result.returncode != 0:
            return done(Verdict.RUNTIME_ERROR, result, f"exit status {result.returncode}")
        if checker is not None and checker_run is not None:
            verdict, message = await self._check(checker, checker_run, index, case, result)
            return done(verdict, result, message)
        if case.expected is None or _same(case.expected, result.stdout, self.comparison):
            return done(Verdict.ACCEPTED, result)
        return done(Verdict.WRONG_ANSWER, result, "output differs from the expected")

    async def _check(
        self,
        checker: Sandbox,
        run: tuple[str, ...],
        index: int,
        case: TestCase,
        result: ExecResult,
    ) -> tuple[Verdict, str]:
        directory = f"{self.directory or '/tmp/judge'}/case-{index}"
        files = {"input": case.stdin, "expected": case.expected or b"", "output": result.stdout}
        for name, content in files.items():
            await checker.write_file(f"{directory}/{name}", content)
        checked = await checker.exec(
            [*run, f"{directory}/input", f"{directory}/expected", f"{directory}/output"],
            cwd=self.directory or None,
            timeout=self.time_limit * 4,
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
            score=passed / len(self.cases),
            passed=passed,
            total=len(self.cases),
            cases=cases,
            compile=compiled,
            seconds=anyio.current_time() - started,
        )

    def _infrastructure(
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
            total=len(self.cases),
            cases=cases,
            compile=compiled,
            error=error,
            seconds=anyio.current_time() - started,
        )


class _Malformed(Exception):
    pass


class _Frames:
    """The runner's answers (see :mod:`asyncsandbox._judge_runner`), parsed as its output
    arrives: a JSON line, then as many bytes of output as it says."""

    def __init__(self, argv: tuple[str, ...], cases: int) -> None:
        self._argv = argv  # what each case ran, as its results say
        self._cases = cases
        self._buffer = bytearray()
        self._meta: dict[str, Any] | None = None
        self.ended = False

    def feed(self, data: bytes) -> list[tuple[int, ExecResult]]:
        if self.ended:
            raise _Malformed("output after the end")
        self._buffer += data
        answers = []
        while not self.ended:
            if self._meta is None:
                line, newline, _ = self._buffer.partition(b"\n")
                if not newline:
                    break
                del self._buffer[: len(line) + 1]
                try:
                    self._meta = json.loads(line)
                except ValueError as exc:
                    raise _Malformed(f"not JSON: {bytes(line[:80])!r}") from exc
                if self._meta == {"end": True}:
                    self.ended = True
                    if self._buffer:
                        raise _Malformed("output after the end")
                    break
            meta = self._meta
            assert meta is not None
            try:
                out, err = int(meta["stdout"]), int(meta["stderr"])
                index = int(meta["case"])
            except (KeyError, TypeError, ValueError) as exc:
                raise _Malformed(f"not an answer: {meta!r:.120}") from exc
            if not 0 <= index < self._cases:
                raise _Malformed(f"no case {index}")
            if len(self._buffer) < out + err:
                break
            stdout, stderr = bytes(self._buffer[:out]), bytes(self._buffer[out : out + err])
            del self._buffer[: out + err]
            self._meta = None
            signum = meta.get("signal")
            answers.append((
                index,
                ExecResult(
                    argv=self._argv,
                    returncode=128 + signum if signum else int(meta["status"]),
                    stdout=stdout,
                    stderr=stderr,
                    duration=float(meta["seconds"]),
                    timed_out=bool(meta["timed_out"]),
                    stdout_truncated=bool(meta["stdout_truncated"]),
                    stderr_truncated=bool(meta["stderr_truncated"]),
                    stdout_size=out,
                    stderr_size=err,
                    signal=signum or None,
                ),
            ))  # fmt: skip
        return answers


def _language(language: str | Language) -> Language:
    if isinstance(language, Language):
        return language
    return LANGUAGES[language]


def _text(data: bytes, limit: int, *, tail: bool = False) -> str:
    cut = data[-limit:] if tail else data[:limit]
    return cut.decode(errors="replace")


def _bytes(value: str | bytes) -> bytes:
    return value.encode() if isinstance(value, str) else value


def _same(expected: str | bytes, output: bytes, comparison: Comparison) -> bool:
    want = _bytes(expected)
    if comparison == "exact":
        return output == want
    if comparison == "lines":
        return _lines(output) == _lines(want)
    if comparison == "whitespace":
        return output.split() == want.split()
    if isinstance(comparison, FloatTolerance):
        got, wanted = output.split(), want.split()
        return len(got) == len(wanted) and all(
            _close(a, b, comparison) for a, b in zip(got, wanted, strict=True)
        )
    return False  # a Checker decides elsewhere


def _lines(data: bytes) -> list[bytes]:
    lines = [line.rstrip() for line in data.split(b"\n")]
    while lines and not lines[-1]:
        lines.pop()
    return lines


def _close(a: bytes, b: bytes, tolerance: FloatTolerance) -> bool:
    if a == b:
        return True
    try:
        x, y = float(a), float(b)
    except ValueError:
        return False
    if math.isnan(x) or math.isnan(y):
        return math.isnan(x) and math.isnan(y)
    return math.isclose(x, y, rel_tol=tolerance.rel, abs_tol=tolerance.abs)
