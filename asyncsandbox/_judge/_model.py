"""What a judgement is made of: the request (one carrier for every option, from the
public call to the engine and over the wire), the languages, and the results."""

from __future__ import annotations

import enum
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any, Literal, Protocol, TypeAlias, runtime_checkable

import msgspec

from .. import _validate as check
from .._errors import InvalidArgument
from ..abc import SandboxSpec

__all__ = (
    "LANGUAGES",
    "CaseResult",
    "Checker",
    "Comparison",
    "CompileResult",
    "FloatTolerance",
    "JudgeRequest",
    "JudgeResult",
    "JudgingBackend",
    "Language",
    "Program",
    "TestCase",
    "Verdict",
)

if TYPE_CHECKING:
    Data: TypeAlias = str | bytes
else:
    # What is stored: a str given to a TestCase is encoded (UTF-8) when it is made, so the
    # stored value is always bytes, which the wire carries as base64.
    Data = bytes


class Language(msgspec.Struct, frozen=True, kw_only=True):
    """How to build and run a program of one language in a sandbox. Add your own by
    passing one as ``Program(language=Language(...))``. Arguments may use ``{source}``
    (the source file's name)."""

    name: str
    source: str
    """File name the source is written to, in the judging directory."""
    compile: tuple[str, ...] | None = None
    """The build command, run once; ``None``: interpreted."""
    run: tuple[str, ...]
    """The command each test case runs (in the judging directory)."""
    fork: bool = False
    """Run the cases in forks of one interpreter that has compiled the source, instead of
    starting the program for each (Python only: ``run`` is the interpreter and
    ``{source}``)."""
    aliases: tuple[str, ...] = ()
    """Other names it is known by (SandboxFusion's, say)."""

    def __post_init__(self) -> None:
        if self.fork and (len(self.run) != 2 or self.run[1] != "{source}"):
            raise InvalidArgument(
                f"a Language with fork=True runs (interpreter, '{{source}}'), got {self.run!r}"
            )
        if not self.run:
            raise InvalidArgument("a Language needs a run command")


def _table(*languages: Language) -> dict[str, Language]:
    table = {}
    for language in languages:
        for name in (language.name, *language.aliases):
            table[name] = language
    return table


LANGUAGES: dict[str, Language] = _table(
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
        aliases=("c++",),
    ),
    Language(name="bash", source="main.sh", run=("bash", "{source}")),
    Language(name="javascript", source="main.js", run=("node", "{source}"), aliases=("nodejs",)),
    Language(name="perl", source="main.pl", run=("perl", "{source}")),
    Language(
        name="java",
        source="Main.java",
        compile=("javac", "-encoding", "UTF-8", "{source}"),
        run=("java", "-Xss64m", "Main"),
    ),
)
"""The built-in languages, by name and alias: ``python``, ``c``, ``cpp`` (``c++``),
``bash``, ``javascript`` (``nodejs``, run by node), ``perl``, ``java`` (``class Main``);
each needs its compiler or interpreter in the sandbox. The judge and SandboxFusion's
``/run_code`` both use this table."""


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

    @property
    def resolved(self) -> Language | None:
        """The :class:`Language` of a source program (None for a ready command)."""
        if self.source is None:
            return None
        language = self.language
        return language if isinstance(language, Language) else LANGUAGES[language]


class TestCase(msgspec.Struct, frozen=True, kw_only=True):
    """One test: the input, the expected output, and limits of its own (else the
    judgement's). ``stdin`` and ``expected`` may be given as str (encoded as UTF-8) or
    bytes; they are kept as bytes."""

    __test__ = False  # not a pytest test class

    stdin: Data = b""
    expected: Data | None = None
    """``None``: only the checker (if any) and the exit status decide."""
    time_limit: float | None = None
    memory_mb: int | None = None
    name: str | None = None

    def __post_init__(self) -> None:
        for field in ("stdin", "expected"):
            value = getattr(self, field)
            if isinstance(value, str):
                msgspec.structs.force_setattr(self, field, value.encode())
            elif not (isinstance(value, bytes) or (field == "expected" and value is None)):
                raise InvalidArgument(
                    f"{field} must be str or bytes{' or None' if field == 'expected' else ''},"
                    f" got {type(value).__name__}"
                )
        if self.time_limit is not None and not check.seconds("time_limit", self.time_limit):
            raise InvalidArgument("time_limit must be > 0")
        check.optional_positive_int("memory_mb", self.memory_mb)


class FloatTolerance(msgspec.Struct, frozen=True, kw_only=True, tag="float"):
    """Outputs match token by token; numbers within ``abs`` or ``rel`` of each other."""

    abs: float = 1e-6
    rel: float = 1e-6


class Checker(msgspec.Struct, frozen=True, kw_only=True, tag="checker"):
    """A checker program (testlib's convention): run as ``checker INPUT EXPECTED OUTPUT``
    (three file paths) in a sandbox of its own; exit status 0 accepts, 1 is a wrong
    answer, anything else is an error of the checker (infrastructure). Its output is
    the case's message. Needs a Session (it creates the checker's sandbox)."""

    program: Program


Comparison: TypeAlias = Literal["exact", "lines", "whitespace"] | FloatTolerance | Checker
"""``exact`` (bytes equal), ``lines`` (trailing whitespace of each line and trailing empty
lines ignored), ``whitespace`` (whitespace-separated tokens equal), a
:class:`FloatTolerance` or a :class:`Checker`."""


class JudgeRequest(msgspec.Struct, frozen=True, kw_only=True):
    """A whole judgement: the program, its cases and every option, in one place. Made
    once by :meth:`Session.judge` (from its arguments, which are these fields), handed to
    the engine, and sent as is to a backend that judges where its sandboxes are
    (:class:`JudgingBackend`: the remote server decodes this very type).

    Invalid values raise :class:`~asyncsandbox.InvalidArgument` when it is made (or
    decoded)."""

    program: Program
    cases: tuple[TestCase, ...]
    comparison: Comparison = "whitespace"
    """How outputs are compared (see :data:`Comparison`)."""
    time_limit: float = 10.0
    """Seconds per case, counted from the program's own start, unless the case says
    otherwise."""
    memory_mb: int | None = None
    """Address space per case (``RLIMIT_AS``), unless the case says otherwise; ``None``:
    only the sandbox's own memory limit."""
    stop_on_failure: bool = False
    """Stop at the first case that is not accepted (the rest are ``skipped``)."""
    parallel: int = 4
    """Cases running at once in the sandbox."""
    compile_timeout: float = 60.0
    """Seconds for the build step."""
    output_limit: int = 1 << 20
    """Bytes of output per case (each stream) beyond which it is ``output_limit``."""
    full_output: bool = False
    """Keep each case's whole output (up to ``output_limit``) in its result, not only
    the start of its stdout and the end of its stderr (4 KiB each)."""
    directory: str | None = None
    """Where the program is written and runs (relative: under the sandbox's workdir);
    ``None``: a fresh directory under ``/tmp``."""
    sandbox: SandboxSpec | None = None
    """The sandbox to judge in, resolved from the session's defaults and the call's
    overrides: set by the Session when it hands the request to a
    :class:`JudgingBackend` (locally the Session makes the sandbox itself)."""

    def __post_init__(self) -> None:
        if not isinstance(self.program, Program):
            raise InvalidArgument(f"program must be a Program, got {self.program!r}")
        if not self.cases:
            raise InvalidArgument("a judgement needs at least one test case")
        for case in self.cases:
            if not isinstance(case, TestCase):
                raise InvalidArgument(f"a test case is a TestCase, got {case!r}")
        if self.comparison not in ("exact", "lines", "whitespace") and not isinstance(
            self.comparison, FloatTolerance | Checker
        ):
            raise InvalidArgument(
                "comparison must be 'exact', 'lines', 'whitespace', a FloatTolerance or a "
                f"Checker; got {self.comparison!r}"
            )
        if not check.seconds("time_limit", self.time_limit, allow_none=False):
            raise InvalidArgument("time_limit must be > 0")
        check.optional_positive_int("memory_mb", self.memory_mb)
        check.positive_int("parallel", self.parallel)
        if not check.seconds("compile_timeout", self.compile_timeout, allow_none=False):
            raise InvalidArgument("compile_timeout must be > 0")
        check.positive_int("output_limit", self.output_limit)
        for flag in ("stop_on_failure", "full_output"):
            if not isinstance(getattr(self, flag), bool):
                raise InvalidArgument(f"{flag} must be a bool, got {getattr(self, flag)!r}")
        if self.directory is not None:
            check.optional_text("directory", self.directory)

    @classmethod
    def of(
        cls, program: Program, cases: Sequence[TestCase | Mapping[str, Any]], **options: Any
    ) -> JudgeRequest:
        """A request from the arguments of :meth:`Session.judge`: ``cases`` may also be
        dicts of :class:`TestCase` fields; ``options`` are this struct's other fields."""
        unknown = set(options) - set(cls.__struct_fields__)
        if unknown:
            raise InvalidArgument(f"unknown judging options: {', '.join(sorted(unknown))}")
        return cls(program=program, cases=_cases(cases), **options)

    def limits(self, case: TestCase) -> tuple[float, int | None]:
        """A case's time and memory limits: its own, else the judgement's."""
        return case.time_limit or self.time_limit, case.memory_mb or self.memory_mb


def _cases(cases: object) -> tuple[TestCase, ...]:
    if isinstance(cases, str | bytes) or not isinstance(cases, Sequence):
        raise InvalidArgument("cases must be a sequence of TestCase (or of their dicts)")
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
    """The program's own run time (wall clock, from its start to its end)."""
    cpu_seconds: float | None = None
    """The CPU time of its main process and the children it waited for, when known."""
    returncode: int | None = None
    signal: int | None = None
    """The signal that killed the program (runtime errors), when known."""
    stdout: str = ""
    """The start of its output (up to 4 KiB; all of it with ``full_output``)."""
    stderr: str = ""
    """The end of its error output (up to 4 KiB; all of it with ``full_output``)."""
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


@runtime_checkable
class JudgingBackend(Protocol):
    """A backend that judges where its sandboxes are (the remote backend: on its server),
    in one round trip instead of one per case. :meth:`Session.judge` hands it the whole
    request (with ``sandbox`` resolved) when the session's backend provides this; the
    result is the same."""

    async def judge(self, request: JudgeRequest) -> JudgeResult:
        """Judge ``request`` in a fresh sandbox of ``request.sandbox`` and remove it.

        Cancellation: the running cases are killed and the sandbox removed.
        """
