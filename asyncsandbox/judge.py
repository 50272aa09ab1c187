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
sandbox, ``parallel`` at a time, with its own time (and optionally memory) limit, under
one runner command (a standard-library program shipped into the sandbox). Python is compiled once too: the
runner runs each case in a fork of an interpreter that compiled the program, as
``python3 main.py`` would run it, without paying an interpreter's start per case.

A verdict comes from the program's own answer: its exit status (what it asked to exit
with, or ``waitpid``'s), the signal that killed it, its time, and what its pipes hold
when it ended, compared on the host (the expected outputs never enter the sandbox). A case ends when the program's main
process ends: the runner's guard holds it at its exit system call and kills the case's
process group there (the exit barrier: a seccomp user notification), so a process it left
behind cannot answer after it ended, and nothing it prints can speak the runner's
protocol. A judged program cannot leave its process group (``setsid``, ``setpgid`` and
``clone`` with ``CLONE_PARENT`` fail with ``EPERM``); see docs/judging.md for what the
barrier still leaves open (the moment between the exit request and the kill). A checker program, when given, runs in a sandbox of its own, out of the judged
program's reach.

A failure of the sandbox or the backend (``InfrastructureError``), or a language whose
compiler or interpreter the sandbox lacks, is not the program's fault: the result's
verdict is :attr:`Verdict.INFRASTRUCTURE_ERROR` and its ``score`` is ``None`` (TRL leaves
``None`` rewards unscored), never a wrong answer.
"""

from ._judge._engine import judge
from ._judge._model import (
    LANGUAGES,
    CaseResult,
    Checker,
    Comparison,
    CompileResult,
    FloatTolerance,
    JudgeRequest,
    JudgeResult,
    JudgingBackend,
    Language,
    Program,
    TestCase,
    Verdict,
)
from ._util import claim_public

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

# Show public objects as `asyncsandbox.judge.X` (see asyncsandbox._util.claim_public).
claim_public(__name__, globals())
