"""How late a judged program's leftover can answer and still be counted: the exit
barrier's open moment, measured.

Each program reads its case's input, forks a child, and exits at once without an answer.
The child watches its main process (``/proc/PID/syscall``) until the main process is in
its exit system call (``exit_group``: it asked to exit, and the kernel holds it there for
the judge's guard), waits ``NAP`` seconds, and writes the right answer. By the verdict
rule nothing written after the program asked to exit counts, so every case accepted is a
leftover's answer let in. When a case's output was whatever it held once the guard had
killed the case, this measured the guard's delay (6-8 of 80 at a nap of 0 on two cores,
14 of 480 at 50 ms beside the test suite); now the output of a process still running
when the main one asked to exit never counts, and every figure must be 0 whatever the
load. With ``--siblings N`` the program first forks N sleeping processes (the exits the
kernel then runs, when the case is killed, compete with the guard for the CPUs).

    uv run python -m bench.judge_races                          # naps 0, 0.5, 1, 2 ms
    uv run python -m bench.judge_races --naps 200 --siblings 300 --rounds 4

Every point judges ``--rounds`` times 16 cases, 4 at a time, in a process sandbox, the
program run by ``python3 main.py`` (``--fork``: the judge's Python fork runner, the main
process made dumpable so that the child can watch it). Prints accepted/total per nap.
The ratio that matters is against zero; run it beside the old code to see the change
(``git stash`` the runtime, run again).
"""

from __future__ import annotations

import argparse
import textwrap

import anyio

from asyncsandbox import Resources, Session
from asyncsandbox.judge import Language, Program, TestCase, Verdict

CASES = [TestCase(stdin=f"{n} {n + 1}\n", expected=f"{2 * n + 1}\n") for n in range(16)]
COMMAND = Language(name="python-command", source="main.py", run=("python3", "{source}"))
PROGRAM = """\
import ctypes, os, sys, time
a, b = map(int, sys.stdin.read().split())
ctypes.CDLL(None).prctl(4, 1)  # PR_SET_DUMPABLE: a forked case is not; let it be watched
main = os.getpid()
for _ in range({siblings}):
    if os.fork() == 0:
        time.sleep(60)
        os._exit(0)
if os.fork() == 0:
    exits = {{b"231", b"60", b"94", b"93"}}  # exit_group and exit, x86-64 and arm64
    while True:
        with open("/proc/%d/syscall" % main, "rb") as f:
            if f.read().split(b" ")[0] in exits:
                break
    time.sleep({nap})
    os.write(1, b"%d\\n" % (a + b))
    os._exit(0)
os._exit(0)
"""


async def point(session: Session, nap: float, args: argparse.Namespace) -> tuple[int, int]:
    source = textwrap.dedent(PROGRAM).format(nap=nap, siblings=args.siblings)
    language = "python" if args.fork else COMMAND
    accepted = total = 0
    for _ in range(args.rounds):
        result = await session.judge(
            Program(source=source, language=language),
            CASES,
            time_limit=20,
            parallel=4,
            resources=Resources(pids=4 * args.siblings + 512),
        )
        accepted += sum(case.verdict == Verdict.ACCEPTED for case in result.cases)
        total += len(result.cases)
    return accepted, total


async def main(args: argparse.Namespace) -> None:
    async with Session("process", report_to=[]) as session:
        for nap in args.naps:
            accepted, total = await point(session, nap / 1000, args)
            print(f"nap {nap:g} ms, {args.siblings} siblings: {accepted}/{total} accepted")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--naps",
        type=lambda text: [float(n) for n in text.split(",")],
        default=[0.0, 0.5, 1.0, 2.0],
        help="comma-separated milliseconds",
    )
    parser.add_argument("--siblings", type=int, default=0, help="sleeping processes forked first")
    parser.add_argument("--rounds", type=int, default=10, help="judgements of 16 cases per nap")
    parser.add_argument("--fork", action="store_true", help="the Python fork runner")
    anyio.run(main, parser.parse_args())
