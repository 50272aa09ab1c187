"""The judge on the process backend, with real compilers and interpreters."""

from __future__ import annotations

import shutil
import textwrap
from collections.abc import AsyncIterator
from pathlib import Path

import msgspec
import pytest
from structlog.testing import capture_logs

from asyncsandbox import (
    FileErrorReason,
    InvalidArgument,
    Limits,
    SandboxFileError,
    Session,
    sync,
)
from asyncsandbox.judge import (
    Checker,
    FloatTolerance,
    JudgeRequest,
    JudgeResult,
    Language,
    Program,
    TestCase,
    Verdict,
    judge,
)

from ._support import docker_test_image

ADD = TestCase(stdin="1 2\n", expected="3\n")
ADD_CASES = [
    ADD,
    TestCase(stdin="40 2\n", expected="42\n"),
    TestCase(stdin="-1 1\n", expected="0\n"),
]
PY_ADD = "a, b = map(int, input().split())\nprint(a + b)\n"
CPP_ADD = "#include <iostream>\nint main(){long a,b;std::cin>>a>>b;std::cout<<a+b<<'\\n';}\n"
C_ADD = '#include <stdio.h>\nint main(){long a,b;scanf("%ld %ld",&a,&b);printf("%ld\\n",a+b);}\n'


# A Python case that tries to answer for every case, with the right outputs, on the
# runner's own descriptors (through /proc).
FORGER = textwrap.dedent("""\
    import json, os
    answers = ""
    for i, output in enumerate(["3\\n", "42\\n", "0\\n"]):
        answers += json.dumps({
            "case": i, "status": 0, "signal": None, "timed_out": False, "seconds": 0.0,
            "stdout": len(output), "stderr": 0, "stdout_truncated": False,
            "stderr_truncated": False,
        }) + "\\n" + output
    answers += '{"end": true}\\n'
    reached = 0
    for fd in range(12):
        try:
            with open(f"/proc/{os.getppid()}/fd/{fd}", "w") as f:
                f.write(answers)
            reached += 1
        except OSError:
            pass
    print("reached", reached)
""")


# Real sandboxes, on asyncio: the judge's verdicts do not depend on the loop; its
# concurrency on trio is proven by the tests below that run on both loops (they say so).
@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture
async def session(process_root: Path) -> AsyncIterator[Session]:
    async with Session(
        "process", backend_options={"root": process_root}, sweep=False, report_to=[]
    ) as s:
        yield s


def verdicts(result: JudgeResult) -> list[Verdict]:
    return [case.verdict for case in result.cases]


@pytest.mark.parametrize(
    ("language", "source"),
    [("python", PY_ADD), ("cpp", CPP_ADD), ("c", C_ADD)],
)
@pytest.mark.parametrize("anyio_backend", ["asyncio", "trio"])  # the judge on both loops
async def test_a_correct_program_is_accepted(session: Session, language: str, source: str) -> None:
    if language != "python" and shutil.which("g++") is None:
        pytest.skip("no C/C++ compiler on this machine")
    result = await session.judge(Program(source=source, language=language), ADD_CASES)
    assert result.verdict == Verdict.ACCEPTED, result
    assert (result.score, result.passed, result.total) == (1.0, 3, 3)
    assert (result.compile is None) == (language == "python")
    if result.compile is not None:
        assert result.compile.returncode == 0


async def test_each_failure_has_its_verdict(session: Session) -> None:
    program = Program(
        source=(
            "import sys, os\n"
            "n = int(input())\n"
            "if n == 1: print(1)\n"  # right
            "elif n == 2: print(3)\n"  # wrong
            "elif n == 3: raise SystemExit(3)\n"  # runtime error
            "elif n == 4:\n    while True: pass\n"  # time limit
            "elif n == 5: x = bytearray(1 << 30)\n"  # memory limit
            "elif n == 6: sys.stdout.write('x' * (1 << 22))\n"  # output limit
            "elif n == 7: os.kill(os.getpid(), 11)\n"  # runtime error by a signal
        )
    )
    # Only the runaway has a short time limit: the others must not meet theirs on a busy
    # machine (CI runs two suites at once), or a time limit would hide their own verdicts.
    cases = [
        TestCase(stdin=f"{n}\n", expected=f"{n}\n", time_limit=2 if n == 4 else None)
        for n in range(1, 8)
    ]
    result = await session.judge(program, cases, time_limit=60, memory_mb=256, parallel=2)
    assert verdicts(result) == [
        Verdict.ACCEPTED,
        Verdict.WRONG_ANSWER,
        Verdict.RUNTIME_ERROR,
        Verdict.TIME_LIMIT,
        Verdict.MEMORY_LIMIT,
        Verdict.OUTPUT_LIMIT,
        Verdict.RUNTIME_ERROR,
    ], result
    assert result.verdict == Verdict.WRONG_ANSWER  # the first failing case's
    assert result.score == pytest.approx(1 / 7)
    assert result.cases[2].returncode == 3
    assert result.cases[6].signal == 11
    assert "MemoryError" in result.cases[4].stderr


@pytest.mark.skipif(shutil.which("g++") is None, reason="no C++ compiler on this machine")
async def test_a_compile_error_fails_every_case_once(session: Session) -> None:
    result = await session.judge(Program(source="int main( {", language="cpp"), ADD_CASES)
    assert result.verdict == Verdict.COMPILE_ERROR
    assert verdicts(result) == [Verdict.COMPILE_ERROR] * 3
    assert result.score == 0.0
    assert result.compile is not None
    assert result.compile.returncode != 0
    assert "error" in result.compile.output


async def test_comparisons(session: Session) -> None:
    echo = Program(source="import sys; sys.stdout.write(sys.stdin.read())")
    spaced = TestCase(stdin="1  2\n\n", expected="1 2\n")
    assert (await session.judge(echo, [spaced], comparison="exact")).score == 0.0
    assert (await session.judge(echo, [spaced], comparison="whitespace")).score == 1.0
    trailing = TestCase(stdin="a b  \nc\n\n\n", expected="a b\nc")
    assert (await session.judge(echo, [trailing], comparison="lines")).score == 1.0
    assert (await session.judge(echo, [spaced], comparison="lines")).score == 0.0
    floats = [TestCase(stdin="0.30000001 x\n", expected="0.3 x")]
    assert (await session.judge(echo, floats, comparison=FloatTolerance(abs=1e-6))).score == 1.0
    assert (
        await session.judge(echo, floats, comparison=FloatTolerance(abs=1e-9, rel=0))
    ).score == 0.0


async def test_a_checker_decides_in_a_sandbox_of_its_own(session: Session) -> None:
    """A checker accepting any permutation of the expected numbers; the judged program
    tries to overwrite anything called checker on its way (it is not in its sandbox)."""
    checker = Program(
        source=(
            "import sys\n"
            "_, expected, output = (open(p).read().split() for p in sys.argv[1:])\n"
            "ok = sorted(expected) == sorted(output)\n"
            "print('permutation' if ok else 'not a permutation')\n"
            "sys.exit(0 if ok else 1)\n"
        )
    )
    program = Program(
        source=(
            "import glob\n"
            "for path in glob.glob('/tmp/**/main.py', recursive=True): open(path, 'a')\n"
            "print(*reversed(input().split()))\n"
        )
    )
    cases = [TestCase(stdin="1 2 3\n", expected="1 2 3"), TestCase(stdin="1 1\n", expected="1 2")]
    result = await session.judge(program, cases, comparison=Checker(program=checker))
    assert verdicts(result) == [Verdict.ACCEPTED, Verdict.WRONG_ANSWER]
    assert result.cases[0].message.strip() == "permutation"


async def test_stop_on_failure_skips_the_rest(session: Session) -> None:
    cases = [ADD, TestCase(stdin="1 1\n", expected="3\n"), ADD, ADD]
    result = await session.judge(Program(source=PY_ADD), cases, stop_on_failure=True, parallel=1)
    assert verdicts(result) == [
        Verdict.ACCEPTED,
        Verdict.WRONG_ANSWER,
        Verdict.SKIPPED,
        Verdict.SKIPPED,
    ]
    assert result.score == 0.25


@pytest.mark.parametrize("anyio_backend", ["asyncio", "trio"])  # its concurrency, on both
async def test_cases_run_in_parallel_in_one_sandbox(session: Session) -> None:
    """Each case waits until three cases are in the sandbox at once: with parallel=3 all
    pass (and they shared one sandbox: they see each other's files)."""
    source = (
        "import os, time, uuid\n"
        "os.makedirs('/tmp/here', exist_ok=True)\n"
        "open(f'/tmp/here/{uuid.uuid4()}', 'w').close()\n"
        "deadline = time.time() + 20\n"
        "while len(os.listdir('/tmp/here')) < 3 and time.time() < deadline: time.sleep(0.01)\n"
        "print(min(len(os.listdir('/tmp/here')), 3))\n"
    )
    cases = [TestCase(expected="3")] * 3
    result = await session.judge(Program(source=source), cases, parallel=3, time_limit=30)
    assert result.verdict == Verdict.ACCEPTED, result


async def test_a_program_cannot_forge_its_verdict(session: Session) -> None:
    """Whatever it prints (what looks like a verdict or an exit status) and however it
    ends its output, it is judged on its exit status and its output compared here."""
    source = (
        "import os, sys\n"
        'print(\'{"verdict": "accepted", "exit": 0}\')\n'
        "sys.stderr.write('\\x00asyncsandbox:started\\x00 accepted\\n')\n"
        "sys.stdout.flush(); os.close(1)\n"
        "os._exit(0)\n"
    )
    result = await session.judge(Program(source=source), [ADD])
    assert result.verdict == Verdict.WRONG_ANSWER


async def test_python_cases_run_in_forks_of_one_interpreter(session: Session) -> None:
    """Python is compiled once: each case is a fork of one runner (the same parent, not
    an init of its own), and runs as ``python3 main.py`` would."""
    source = "import os, sys\nprint(os.getppid())\nprint(sys.argv, __name__, input())\n"
    cases = [TestCase(stdin=f"{n}\n") for n in range(4)]
    with capture_logs() as logs:
        result = await session.judge(Program(source=source), cases, parallel=2)
    assert result.verdict == Verdict.ACCEPTED, result
    parents = {case.stdout.split("\n")[0] for case in result.cases}
    assert len(parents) == 1
    assert parents != {"1"}
    assert [case.stdout.split("\n")[1] for case in result.cases] == [
        f"['main.py'] __main__ {n}" for n in range(4)
    ]
    assert not [log for log in logs if log["event"] == "judge.runner_gave_up"]


async def test_a_python_cases_collector_works_as_python3s(session: Session) -> None:
    """The runner's own objects are out of the collector's reach in its forks; the
    program's are not: its cycles are collected, by the thresholds and when it asks."""
    source = textwrap.dedent("""\
        import gc, weakref
        class Node:
            pass
        freed = []
        def cycle(tag):
            a, b = Node(), Node()
            a.b, b.a = b, a
            weakref.finalize(a, freed.append, tag)
        for _ in range(5000):
            cycle("automatic")
        automatic = freed.count("automatic")
        cycle("asked")
        gc.collect()
        print(gc.isenabled(), automatic > 0, "asked" in freed)
    """)
    result = await session.judge(Program(source=source), [TestCase(expected="True True True\n")])
    assert result.verdict == Verdict.ACCEPTED, result


async def test_a_python_case_cannot_write_the_runners_answers(session: Session) -> None:
    """The runner's answers go to its stdout; a case that tries to reach it through
    /proc (its parent's descriptors) to answer for every case (with the right outputs) is
    refused, and judged on what it did itself."""
    result = await session.judge(Program(source=FORGER), ADD_CASES, parallel=1)
    assert verdicts(result) == [Verdict.WRONG_ANSWER] * 3, result
    assert [case.stdout for case in result.cases] == ["reached 0\n"] * 3


@pytest.mark.docker
@pytest.mark.parametrize("anyio_backend", ["asyncio"])  # aiodocker is asyncio only
async def test_python_judging_on_docker_runs_in_forks_out_of_reach(docker_engine: None) -> None:
    """The runner in the Docker backend's containers: forks of one interpreter, and no
    case reaches its answers."""
    options = {"default_image": docker_test_image()}
    async with Session("docker", backend_options=options, sweep=False, report_to=[]) as s:
        with capture_logs() as logs:
            result = await s.judge(Program(source=PY_ADD), ADD_CASES, parallel=2)
            assert result.verdict == Verdict.ACCEPTED, result
            forged = await s.judge(Program(source=FORGER), ADD_CASES)
        assert [case.stdout for case in forged.cases] == ["reached 0\n"] * 3, forged
        assert verdicts(forged) == [Verdict.WRONG_ANSWER] * 3
        assert not [log for log in logs if log["event"] == "judge.runner_gave_up"]


async def test_a_slow_reader_never_stretches_a_time_limit(session: Session) -> None:
    """The host reads the runner's answers at its own pace (here a checker that takes 3 s
    on the first answer, while big answers pile up behind it); the runner still kills
    the case that sleeps past its 1 s limit on time, whatever it is waiting to write."""
    program = Program(
        source=(
            "import sys, time\n"
            "case = input()\n"
            "if case == 'slow':\n    time.sleep(1.5)\n    print('done')\n"
            "else:\n    sys.stdout.write('x' * 900_000)\n"
        )
    )
    checker = Checker(
        program=Program(
            source="import sys, time\n"
            "if open(sys.argv[1]).read() == 'big 0\\n':\n    time.sleep(3)\n"
        )
    )
    cases = [TestCase(stdin="big 0\n"), TestCase(stdin="slow\n", time_limit=1)]
    cases += [TestCase(stdin=f"big {n}\n") for n in range(1, 6)]
    result = await session.judge(program, cases, comparison=checker, parallel=2, time_limit=30)
    assert result.cases[1].verdict == Verdict.TIME_LIMIT, result.cases[1]
    assert [c.verdict for c in result.cases if c.index != 1] == [Verdict.ACCEPTED] * 6


KILLS_ITS_RUNNER = {
    "python": (
        "import os, signal\n"
        "n = input()\n"
        "if n == '2':\n"
        "    os.kill(os.getppid(), signal.SIGKILL)\n"
        "print(n)\n"
    ),
    "bash": 'read n; if [ "$n" = 2 ]; then kill -9 $PPID || exit 1; fi; echo "$n"\n',
}


@pytest.mark.parametrize("language", sorted(KILLS_ITS_RUNNER))
async def test_a_case_cannot_kill_its_runner(session: Session, language: str) -> None:
    """Behind the exit barrier the runner (and the guard) are out of a case's reach,
    though they run as the same user: the kill fails (EPERM), a runtime error of the
    case's own making, and the others keep their verdicts. (Where the kernel has no
    barrier, the runner can be killed: tests/test_gvisor.py has what happens then.)"""
    cases = [TestCase(stdin=f"{n}\n", expected=f"{n}\n") for n in range(1, 5)]
    program = Program(source=KILLS_ITS_RUNNER[language], language=language)
    with capture_logs() as logs:
        result = await session.judge(program, cases, parallel=1)
    assert verdicts(result) == [
        Verdict.ACCEPTED,
        Verdict.RUNTIME_ERROR,
        Verdict.ACCEPTED,
        Verdict.ACCEPTED,
    ], result
    assert "not permitted" in result.cases[1].stderr, result.cases[1]
    assert not [log for log in logs if log["event"] == "judge.runner_gave_up"]


async def test_a_missing_compiler_is_infrastructure_not_a_wrong_answer(session: Session) -> None:
    nope = Language(
        name="nope", source="main.x", compile=("no-such-compiler", "{source}"), run=("./main",)
    )
    result = await session.judge(Program(source="x", language=nope), [ADD])
    assert result.verdict == Verdict.INFRASTRUCTURE_ERROR
    assert result.score is None
    assert "no-such-compiler" in (result.error or "")


@pytest.mark.parametrize("path", [None, "/nowhere"])  # the runner's path, and without python3
async def test_a_missing_interpreter_is_infrastructure_not_a_runtime_error(
    session: Session, path: str | None
) -> None:
    """Found missing before any case runs (once one ran, a failure to run a command is
    the program's doing: tests/test_judge_integrity.py)."""
    nope = Language(name="nope", source="main.x", run=("no-such-interpreter", "{source}"))
    env = {} if path is None else {"PATH": path}
    result = await session.judge(Program(source="x", language=nope), [ADD], env=env)
    assert result.verdict == Verdict.INFRASTRUCTURE_ERROR, result
    assert result.score is None
    assert "no-such-interpreter" in (result.error or "")


async def test_a_sandbox_without_python_runs_each_case_by_itself(session: Session) -> None:
    """No ``python3`` for the runner (here: not on the PATH): each case is one plain
    command, the program's file written for it all the same."""
    shell = Language(name="sh", source="main.sh", run=("/bin/sh", "{source}"))
    program = Program(source="read a b\necho $((a + b))\n", language=shell)
    result = await session.judge(program, ADD_CASES, env={"PATH": "/nowhere"})
    assert verdicts(result) == [Verdict.ACCEPTED] * 3


@pytest.mark.parametrize(("language", "source"), [("python", PY_ADD), ("cpp", CPP_ADD)])
async def test_a_directory_the_program_cannot_be_written_to_is_a_file_error(
    session: Session, language: str, source: str
) -> None:
    """Written by the runner (Python) or before compiling (C++), alike."""
    async with session.sandbox() as sb:
        request = JudgeRequest.of(Program(source=source, language=language), [ADD])
        request = msgspec.structs.replace(request, directory="/usr/judge")
        with pytest.raises(SandboxFileError) as caught:
            await judge(sb, request)
    assert caught.value.path.startswith("/usr/judge/main.")
    if language == "python":  # the runner says the errno's reason
        assert caught.value.reason == FileErrorReason.PERMISSION


async def test_the_runner_compiles_itself_where_the_bytecode_differs(
    session: Session, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The runner's code is sent compiled for the host's Python, and as source: a sandbox
    whose Python has another bytecode (another magic number) compiles the source."""
    from asyncsandbox._judge import _cases

    argv = _cases._boot()
    monkeypatch.setattr(_cases, "_boot", lambda: (*argv[:2], "0" * 8))
    result = await session.judge(Program(source=PY_ADD), ADD_CASES)
    assert verdicts(result) == [Verdict.ACCEPTED] * 3


async def test_a_dead_sandbox_is_infrastructure(session: Session) -> None:
    """The judging sandbox removed under the judge: infrastructure, score None."""
    async with session.sandbox() as sb:
        await sb.exec(["true"])
        from asyncsandbox._process import ProcessAttributes

        shutil.rmtree(sb.extra(ProcessAttributes.root))
        result = await judge(sb, JudgeRequest(program=Program(source=PY_ADD), cases=(ADD,)))
    assert result.verdict == Verdict.INFRASTRUCTURE_ERROR
    assert result.score is None


async def test_judging_in_a_given_sandbox(session: Session) -> None:
    async with session.sandbox() as sb:
        program = Program(command=("python3", "-c", PY_ADD))
        result = await judge(sb, JudgeRequest.of(program, ADD_CASES))
        assert result.score == 1.0
        assert (await sb.exec(["true"])).returncode == 0  # the sandbox is still there


def test_the_blocking_facade_judges_too(process_root: Path) -> None:
    with sync.SyncSession(
        "process", backend_options={"root": str(process_root)}, sweep=False, report_to=[],
        limits=Limits(max_live=4),
    ) as s:  # fmt: skip
        handle = s.judge(Program(source=PY_ADD), ADD_CASES)
        assert handle.result(timeout=120).score == 1.0


async def test_bad_input_is_a_clear_error(session: Session) -> None:
    program = Program(source=PY_ADD)
    with pytest.raises(InvalidArgument, match="at least one test case"):
        await session.judge(program, [])
    with pytest.raises(InvalidArgument, match="comparison must be"):
        await session.judge(program, [ADD], comparison="fuzzy")  # type: ignore[arg-type]
    with pytest.raises(InvalidArgument, match="unknown language 'cobol'"):
        Program(source="x", language="cobol")
    with pytest.raises(InvalidArgument, match="a source or a command"):
        Program()
    with pytest.raises(InvalidArgument, match="time_limit must be > 0"):
        await session.judge(program, [ADD], time_limit=0)
    with pytest.raises(InvalidArgument, match="invalid test case"):
        await session.judge(program, [{"stdin": 3}])
    async with session.sandbox() as sb:
        request = JudgeRequest.of(program, [ADD], comparison=Checker(program=program))
        with pytest.raises(InvalidArgument, match="judge on a Session"):
            await judge(sb, request)


async def test_the_sandbox_can_be_configured(session: Session) -> None:
    program = Program(source="import os; print(os.environ['ANSWER'])")
    result = await session.judge(program, [TestCase(expected="42")], env={"ANSWER": "42"})
    assert result.score == 1.0


async def test_a_judging_backend_gets_the_whole_request() -> None:
    """A backend that judges where its sandboxes are (the remote one) gets one request:
    the program, the cases, the comparison and the sandbox's spec."""
    from asyncsandbox.testing import FakeBackend

    requests: list[JudgeRequest] = []

    class Judging(FakeBackend):
        async def judge(self, request: JudgeRequest) -> JudgeResult:
            requests.append(request)
            return JudgeResult(verdict=Verdict.ACCEPTED, score=1.0, passed=1, total=1, cases=())

    async with Session(Judging(), sweep=False, report_to=[]) as s:
        result = await s.judge(
            Program(source=PY_ADD),
            [ADD],
            comparison=FloatTolerance(abs=0.5),
            time_limit=3,
            image="img",
        )
    assert result.score == 1.0
    [request] = requests
    assert request.cases == (ADD,)
    assert request.comparison == FloatTolerance(abs=0.5)
    assert request.time_limit == 3
    assert request.sandbox is not None
    assert request.sandbox.image == "img"


async def test_the_judging_options_exist_once() -> None:
    """One carrier: the options of a judgement are JudgeRequest's fields. Session.judge and
    the blocking facade take exactly those (a test of sync keeps their signatures in step)
    and hand every one of them on; the remote wire sends the struct itself. A field added
    to JudgeRequest and not to them (or the other way round) fails here."""
    import inspect

    from asyncsandbox.testing import FakeBackend

    fields = set(JudgeRequest.__struct_fields__) - {"program", "cases", "sandbox"}
    for method in (Session.judge, sync.SyncSession.judge):
        parameters = set(inspect.signature(method).parameters)
        assert parameters - {"self", "program", "cases", "overrides"} == fields, method
    # Every option reaches the request, with a value other than its default.
    defaults = JudgeRequest(program=Program(source=PY_ADD), cases=(ADD,))
    given: dict[str, object] = {
        "comparison": FloatTolerance(abs=0.25),
        "time_limit": 3.5,
        "memory_mb": 77,
        "stop_on_failure": True,
        "parallel": 9,
        "compile_timeout": 11.0,
        "output_limit": 12345,
        "full_output": True,
        "directory": "/tmp/elsewhere",
    }
    assert set(given) == fields
    for name, value in given.items():
        assert getattr(defaults, name) != value, name
    requests: list[JudgeRequest] = []

    class Judging(FakeBackend):
        async def judge(self, request: JudgeRequest) -> JudgeResult:
            requests.append(request)
            return JudgeResult(verdict=Verdict.ACCEPTED, score=1.0, passed=1, total=1, cases=())

    async with Session(Judging(), sweep=False, report_to=[]) as s:
        await s.judge(Program(source=PY_ADD), [ADD], **given)  # type: ignore[arg-type]
    [request] = requests
    assert {name: getattr(request, name) for name in given} == given
    from asyncsandbox_remote import _wire

    assert _wire.JUDGE.type is JudgeRequest  # the wire type is the struct itself
