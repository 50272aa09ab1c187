"""Reward hacks against the judge: a verdict comes from the program's own answer only.

Each program here does not answer itself: its main process exits at once, without
output, and leaves something behind that prints the right answer afterwards (the
answer is computed from the case's input before the main process exits). Whatever it
leaves is killed when the main process ends, and nothing written after that counts, so
no case may be accepted. Several of them race the main process's exit on a second CPU
(they wait for the parent to change, for a parent-death signal): killing what is left
*after* the exit loses that race about half the time, so each judgement has many cases,
and one accepted case fails the test.
"""

from __future__ import annotations

import shutil
import textwrap
from collections.abc import AsyncIterator
from pathlib import Path

import anyio
import pytest
from structlog.testing import capture_logs

from asyncsandbox import Resources, Session
from asyncsandbox.judge import JudgeResult, Language, Program, TestCase, Verdict

from ._support import docker_test_image

CASES = [TestCase(stdin=f"{n} {n + 1}\n", expected=f"{2 * n + 1}\n") for n in range(16)]
# The same programs, one command per case (the path of languages without a fork runner).
PYTHON_COMMAND = Language(name="python-command", source="main.py", run=("python3", "{source}"))

# Each program reads its input, then `leave(answer)` arranges for the answer to be written
# after the main process exited.
PRELUDE = textwrap.dedent("""\
    import ctypes, os, signal, sys, threading, time
    a, b = map(int, sys.stdin.read().split())
    answer = b"%d\\n" % (a + b)
    libc = ctypes.CDLL(None, use_errno=True)
    parent = os.getpid()

    def until_orphaned():
        while os.getppid() == parent:
            pass

    def on_parent_death():
        got = []
        signal.signal(signal.SIGUSR1, lambda *_: got.append(1))
        libc.prctl(1, signal.SIGUSR1)  # PR_SET_PDEATHSIG
        return got

    def leave_the_group():
        try:
            os.setsid()  # refused behind today's barrier; the answer comes all the same
        except PermissionError:
            pass

    def stat_of(pid):
        # A process's parent and process group ((0, 0) once it is gone).
        try:
            with open("/proc/%d/stat" % pid, "rb") as f:
                stat = f.read()
        except OSError:
            return (0, 0)
        return tuple(int(field) for field in stat[stat.rindex(b")") + 2 :].split()[1:3])

    def until_exiting():
        # Until the main process is in its exit system call (x86-64's and arm64's
        # exit_group and exit): it asked to exit, and everything after that is late. (A
        # judged program is not dumpable; the main process makes itself so, for this.)
        exits = {b"231", b"60", b"94", b"93"}
        while True:
            with open("/proc/%d/syscall" % parent, "rb") as f:
                if f.read().split(b" ")[0] in exits:
                    return
""")

LEAVE = {
    # A daemon in a session of its own, answering half a second later.
    "setsid": """
        if os.fork() == 0:
            leave_the_group()
            time.sleep(0.5)
            os.write(1, answer)
            os._exit(0)
    """,
    # A double-forked daemon (its parent gone at once, it is nobody's child). The main
    # process waits for that parent: it ends a moment after, or later on a busy machine,
    # where a shorter nap could see it still running (and its answer then counts: CI's
    # newcomer run, three suites on two cores, saw it with a nap of 1 s).
    "double_fork": """
        if os.fork() == 0:
            if os.fork() == 0:
                leave_the_group()
                time.sleep(5.0)
                os.write(1, answer)
            os._exit(0)
        os.wait()
    """,
    # A child among 300 that answers 0.2 s after the main process asked to exit. The
    # runner answered the cases' ends one after another, each by searching every process
    # for what to kill and waiting for all of it to die (their exits take the kernel
    # about 0.3 ms each here): the fourth case's end, longer than that.
    "among_many": """
        libc.prctl(4, 1)  # PR_SET_DUMPABLE: its exit can be watched
        for _ in range(300):
            if os.fork() == 0:
                time.sleep(60)
                os._exit(0)
        if os.fork() == 0:
            until_exiting()
            time.sleep(0.2)
            os.write(1, answer)
            os._exit(0)
    """,
    # A child that answers the moment the main process asked to exit: in the moment
    # before the guard kills the case (one in ten here, when what answered was whatever
    # the case's output held once it ended).
    "at_once": """
        libc.prctl(4, 1)  # PR_SET_DUMPABLE: its exit can be watched
        if os.fork() == 0:
            until_exiting()
            os.write(1, answer)
            os._exit(0)
    """,
    # A child that stops the guard (the runner's first child, in the runner's process
    # group: the cases have sessions of their own), answers once the main process is
    # held at its exit, and lets the guard go on: a guard that cannot answer in time,
    # made so. It runs as the same user as the case.
    "stopped_guard": """
        guard = min(
            int(name) for name in os.listdir("/proc")
            if name.isdigit() and stat_of(int(name))[:2] == (os.getppid(), os.getpgid(os.getppid()))
        )
        try:
            os.kill(guard, signal.SIGSTOP)
        except PermissionError:
            pass
        if os.fork() == 0:
            time.sleep(0.5)
            os.write(1, answer)
            try:
                os.kill(guard, signal.SIGCONT)
            except PermissionError:
                pass
            os._exit(0)
    """,
    # A child that answers before the main process ends, and lives on: claiming, where
    # its output says who wrote it, to be the main process (the kernel refuses the claim
    # without CAP_SYS_ADMIN over the sandbox's pid namespace).
    "forged_sender": """
        import socket, struct
        ready_r, ready_w = os.pipe()
        if os.fork() == 0:
            creds = struct.pack("iII", parent, os.getuid(), os.getgid())
            try:
                out = socket.socket(fileno=os.dup(1))
                out.sendmsg([answer], [(socket.SOL_SOCKET, socket.SCM_CREDENTIALS, creds)])
            except OSError:  # not a socket, or the claim refused
                os.write(1, answer)
            os.write(ready_w, b"x")
            time.sleep(60)
        os.read(ready_r, 1)
    """,
    # A child that answers the moment its parent is gone.
    "orphaned": """
        if os.fork() == 0:
            until_orphaned()
            os.write(1, answer)
            os._exit(0)
    """,
    # A child that answers on its parent-death signal.
    "parent_death_signal": """
        ready_r, ready_w = os.pipe()
        if os.fork() == 0:
            got = on_parent_death()
            os.write(ready_w, b"x")
            while not got:
                signal.pause()
            os.write(1, answer)
            os._exit(0)
        os.read(ready_r, 1)
    """,
    # The same, forked by a thread of the main process.
    "thread_parent_death_signal": """
        ready_r, ready_w = os.pipe()
        def fork_from_a_thread():
            if os.fork() == 0:
                got = on_parent_death()
                os.write(ready_w, b"x")
                while not got:
                    signal.pause()
                os.write(1, answer)
                os._exit(0)
            time.sleep(60)
        threading.Thread(target=fork_from_a_thread, daemon=True).start()
        os.read(ready_r, 1)
    """,
    # The main process ends with the raw exit system call (no C library, no Python).
    "raw_exit": """
        if os.fork() == 0:
            until_orphaned()
            os.write(1, answer)
            os._exit(0)
        libc.syscall({"x86_64": 60, "aarch64": 93, "riscv64": 93}[os.uname().machine], 0)
    """,
}


def program(leave: str) -> str:
    return PRELUDE + textwrap.dedent(LEAVE[leave]) + "os._exit(0)\n"


@pytest.fixture
async def session(process_root: Path) -> AsyncIterator[Session]:
    async with Session(
        "process", backend_options={"root": process_root}, sweep=False, report_to=[]
    ) as s:
        yield s


def assert_none_accepted(result: JudgeResult) -> None:
    accepted = [case.index for case in result.cases if case.verdict == Verdict.ACCEPTED]
    assert not accepted, f"cases {accepted} accepted with an answer printed after the exit"
    assert result.verdict == Verdict.WRONG_ANSWER, result


@pytest.mark.parametrize("leave", sorted(LEAVE))
@pytest.mark.parametrize("language", ["python", "python-command"])
async def test_no_answer_after_the_main_process_ended(
    session: Session, leave: str, language: str
) -> None:
    lang = "python" if language == "python" else PYTHON_COMMAND
    result = await session.judge(
        Program(source=program(leave), language=lang),
        CASES,
        time_limit=20,
        parallel=4,
        resources=Resources(pids=2048),  # 4 cases at a time, 300 processes each
    )
    assert_none_accepted(result)


C_ORPHANED = textwrap.dedent("""\
    #include <stdio.h>
    #include <unistd.h>
    int main(void) {
        long a, b;
        if (scanf("%ld %ld", &a, &b) != 2) return 1;
        pid_t parent = getpid();
        if (fork() == 0) {
            while (getppid() == parent) {}
            printf("%ld\\n", a + b);
            return 0;
        }
        return 0;
    }
""")


async def test_a_compiled_program_cannot_answer_after_it_ended(session: Session) -> None:
    if shutil.which("gcc") is None:
        pytest.skip("no C compiler on this machine")
    result = await session.judge(Program(source=C_ORPHANED, language="c"), CASES, parallel=4)
    assert result.compile is not None
    assert result.compile.returncode == 0, result.compile
    assert_none_accepted(result)


KILL_THE_RUNNER = """
    try:
        os.kill(os.getppid(), signal.SIGKILL)
    except OSError:
        pass
"""
# Every other child of its parent: whatever else watches over the cases (and the other
# cases with it).
KILL_THE_RUNNERS_OTHER_CHILDREN = """
    for name in os.listdir("/proc"):
        if name.isdigit() and int(name) != parent:
            try:
                with open("/proc/%s/stat" % name, "rb") as f:
                    stat = f.read()
                if int(stat[stat.rindex(b")") + 2 :].split()[1]) == os.getppid():
                    os.kill(int(name), signal.SIGKILL)
            except (OSError, ValueError):
                pass
"""


@pytest.mark.parametrize("kill", [KILL_THE_RUNNER, KILL_THE_RUNNERS_OTHER_CHILDREN])
async def test_a_program_that_kills_the_runner_gains_nothing(session: Session, kill: str) -> None:
    # Each case kills its parent (the runner, whoever that is), or what else it started,
    # then leaves an answer behind: killing them must not open a way around them.
    source = PRELUDE + textwrap.dedent(kill) + textwrap.dedent(LEAVE["orphaned"]) + "os._exit(0)\n"
    result = await session.judge(Program(source=source), CASES, time_limit=20, parallel=4)
    accepted = [case.index for case in result.cases if case.verdict == Verdict.ACCEPTED]
    assert not accepted, result


@pytest.mark.parametrize("language", ["python", "python-command"])
async def test_only_processes_that_ended_before_the_main_one_add_to_the_answer(
    session: Session, language: str
) -> None:
    """What a child wrote counts once the child has ended (a subprocess the program ran);
    what a process still running when the main one asked to exit wrote does not, even
    written before (nobody can tell when it wrote), and the log says how much was left out."""
    source = textwrap.dedent("""\
        import os, subprocess, sys, time
        a, b = map(int, sys.stdin.read().split())
        subprocess.run(["echo", str(a + b)], check=True)
        ready_r, ready_w = os.pipe()
        if os.fork() == 0:
            os.write(1, b"junk\\n")
            os.write(ready_w, b"x")
            time.sleep(60)
        os.read(ready_r, 1)
        os._exit(0)
    """)
    lang = "python" if language == "python" else PYTHON_COMMAND
    with capture_logs() as logs:
        result = await session.judge(Program(source=source, language=lang), CASES[:4], parallel=2)
    assert result.verdict == Verdict.ACCEPTED, result
    dropped = [log for log in logs if log["event"] == "judge.case.output_dropped"]
    assert sorted((log["case"], log["bytes"]) for log in dropped) == [(n, 5) for n in range(4)]


# Threads of the main process that end one by one (the exit system call, not exit_group),
# the main thread among the first: the program ends with its last thread, with that
# thread's status, and what that thread wrote is the program's.
LAST_THREAD = textwrap.dedent("""\
    import ctypes, os, sys, threading
    libc = ctypes.CDLL(None, use_errno=True)
    EXIT = {"x86_64": 60, "aarch64": 93, "riscv64": 93}[os.uname().machine]
    a, b = map(int, sys.stdin.read().split())

    def alive(tid):
        try:
            with open("/proc/self/task/%s/stat" % tid, "rb") as f:
                stat = f.read()
        except OSError:
            return False
        return stat[stat.rindex(b")") + 2 :][:1] not in (b"Z", b"X")

    def last():
        # Once every other thread is gone (the main one a zombie): this one is the last.
        me = threading.get_native_id()
        while any(alive(tid) for tid in os.listdir("/proc/self/task") if int(tid) != me):
            pass
        os.write(1, b"%d\\n" % (a + b))
        libc.syscall(EXIT, STATUS)

    for _ in range(8):
        threading.Thread(target=lambda: libc.syscall(EXIT, 0)).start()
    threading.Thread(target=last).start()
    libc.syscall(EXIT, 0)  # the main thread ends; the program goes on
""")


@pytest.mark.parametrize("status", [0, 3])
@pytest.mark.parametrize("language", ["python", "python-command"])
async def test_a_program_ends_with_its_last_thread(
    session: Session, language: str, status: int
) -> None:
    lang = "python" if language == "python" else PYTHON_COMMAND
    source = LAST_THREAD.replace("STATUS", str(status))
    result = await session.judge(Program(source=source, language=lang), CASES[:4], parallel=2)
    assert [(c.returncode, c.stdout) for c in result.cases] == [
        (status, f"{2 * n + 1}\n") for n in range(4)
    ], result


@pytest.mark.parametrize("language", ["python", "python-command"])
async def test_a_child_that_ends_with_its_last_thread_has_ended(
    session: Session, language: str
) -> None:
    # The same threads in a child the main process waits for: the child ended (its last
    # thread's exit) before the main process asked to, so what it wrote counts.
    child = textwrap.indent(LAST_THREAD.replace("STATUS", "0"), "    ")
    source = f"import os\npid = os.fork()\nif pid == 0:\n{child}os.waitpid(pid, 0)\n"
    lang = "python" if language == "python" else PYTHON_COMMAND
    result = await session.judge(Program(source=source, language=lang), CASES[:4], parallel=2)
    assert result.verdict == Verdict.ACCEPTED, result


# What a program tries, to reach the processes that answer for it (its runner, the guard
# that holds its exit, their process group): each with arguments that would change
# nothing, so that the old code, which let them through, only said "ok".
REACHING = textwrap.dedent("""\
    import ctypes, errno, fcntl, os, resource
    libc = ctypes.CDLL(None, use_errno=True)
    def outcome(call, *args):
        try:
            result = call(*args)
        except OSError as exc:
            return errno.errorcode[exc.errno]
        if isinstance(result, int) and result < 0:  # a C library call
            return errno.errorcode[ctypes.get_errno()]
        return "ok"
    def stat_of(pid):
        with open("/proc/%d/stat" % pid, "rb") as f:
            stat = f.read()
        return tuple(int(field) for field in stat[stat.rindex(b")") + 2 :].split()[1:3])
    runner = os.getppid()
    group = os.getpgid(runner)
    (guard,) = [
        int(name) for name in os.listdir("/proc")
        if name.isdigit() and int(name) != runner and stat_of(int(name)) == (runner, group)
    ]
    pidfd_open, pidfd_send_signal = 434, 424
    tried = []
    for pid in (guard, runner):
        tried += [
            outcome(os.kill, pid, 0),
            outcome(libc.tgkill, pid, pid, 0),
            outcome(libc.syscall, pidfd_open, pid, 0),
            outcome(os.setpriority, os.PRIO_PROCESS, pid, os.getpriority(os.PRIO_PROCESS, pid)),
            outcome(os.sched_setaffinity, pid, os.sched_getaffinity(pid)),
            outcome(os.sched_setscheduler, pid, os.SCHED_OTHER, os.sched_param(0)),
            outcome(os.sched_setparam, pid, os.sched_param(0)),
            outcome(resource.prlimit, pid, resource.RLIMIT_CORE),
        ]
    tried += [
        outcome(os.kill, -group, 0),
        outcome(os.kill, -1, 0),
        outcome(os.setpriority, os.PRIO_PGRP, group, os.getpriority(os.PRIO_PGRP, group)),
    ]
    proc = os.open("/proc/%d" % guard, os.O_DIRECTORY)  # a pidfd, to pidfd_send_signal
    tried.append(outcome(libc.syscall, pidfd_send_signal, proc, 0, None, 0))
    r, w = os.pipe()
    tried.append(outcome(fcntl.fcntl, r, 10, 0))  # F_SETSIG: a signal for its owner
    # Its own processes, it still reaches.
    if os.fork() == 0:
        os._exit(0)
    tried.append(outcome(os.kill, 0, 0))
    tried.append(outcome(os.setpriority, os.PRIO_PROCESS, 0, 1))
    tried.append(outcome(resource.prlimit, os.getpid(), resource.RLIMIT_CORE))
    tried.append(outcome(os.sched_setaffinity, 0, os.sched_getaffinity(0)))
    print(*tried)
""")


@pytest.mark.parametrize("language", ["python", "python-command"])
async def test_a_program_cannot_reach_what_answers_for_it(session: Session, language: str) -> None:
    """The runner and the guard run as the same user as the program. A program that stopped
    the guard (or starved it, or pinned it to a busy CPU) would hold its exit unanswered
    while what it left writes: none of that reaches them."""
    lang = "python" if language == "python" else PYTHON_COMMAND
    expected = " ".join(["EPERM"] * 21 + ["ok"] * 4) + "\n"
    result = await session.judge(
        Program(source=REACHING, language=lang), [TestCase(stdin="", expected=expected)]
    )
    assert result.verdict == Verdict.ACCEPTED, result.cases[0]


# What a program's processes try, to leave its process group or the tree below its main
# process (where the end of the case could not reach them), and what each gets.
LEAVING = textwrap.dedent("""\
    import ctypes, errno, os, subprocess, threading
    libc = ctypes.CDLL(None, use_errno=True)
    def outcome(result):
        return "ok" if result >= 0 else errno.errorcode[ctypes.get_errno()]
    calls = {"x86_64": (56, 435), "aarch64": (220, 435)}[os.uname().machine]
    tried = [
        outcome(libc.setsid()),
        outcome(libc.setpgid(0, 0)),
        outcome(libc.prctl(36, 0, 0, 0, 0)),  # PR_SET_CHILD_SUBREAPER: unset
        outcome(libc.syscall(calls[0], 0x8000 | 17, 0, 0, 0, 0)),  # clone: CLONE_PARENT
        outcome(libc.syscall(calls[1], 0, 0)),  # clone3: its flags cannot be read
    ]
    # What programs do still works: fork, threads, subprocesses.
    if os.fork() == 0:
        os._exit(7)
    tried.append(os.waitstatus_to_exitcode(os.wait()[1]))
    thread = threading.Thread(target=lambda: tried.append("thread"))
    thread.start()
    thread.join()
    tried.append(subprocess.run(["echo", "child"], capture_output=True, text=True).stdout.strip())
    print(*tried)
""")


@pytest.mark.parametrize("language", ["python", "python-command"])
async def test_what_a_program_starts_cannot_leave_its_process_group(
    session: Session, language: str
) -> None:
    lang = "python" if language == "python" else PYTHON_COMMAND
    expected = "EPERM EPERM EPERM EPERM ENOSYS 7 thread child\n"
    result = await session.judge(
        Program(source=LEAVING, language=lang), [TestCase(stdin="", expected=expected)]
    )
    assert result.verdict == Verdict.ACCEPTED, result.cases[0]


@pytest.mark.parametrize("language", ["python", "python-command"])
async def test_what_holds_the_output_open_does_not_hold_the_answer(
    session: Session, language: str
) -> None:
    # The program answers and exits; a daemon it left holds its output open for a minute.
    # The case ends when the program does, not when the daemon lets go (or at the time
    # limit, as it did).
    source = textwrap.dedent("""\
        import os, sys, time
        a, b = map(int, sys.stdin.read().split())
        print(a + b, flush=True)
        if os.fork() == 0:
            time.sleep(60)
        os._exit(0)
    """)
    lang = "python" if language == "python" else PYTHON_COMMAND
    with anyio.fail_after(45):  # far below the time limit: the case must not wait for it
        result = await session.judge(
            Program(source=source, language=lang), CASES[:4], time_limit=100
        )
    assert result.verdict == Verdict.ACCEPTED, result


# Programs that fail with the exit status of a command that cannot run (126, 127), having
# printed nothing: their own failure, never the sandbox's (an infrastructure error is kept
# out of a score, and SandboxFusion's client retries it).
EXIT_AS_IF_MISSING = {
    "python": "import sys\nsys.exit({status})\n",
    "python-command": "import sys\nsys.exit({status})\n",
    "bash": "exit {status}\n",
    "c": "int main(void) {{ return {status}; }}\n",
}


@pytest.mark.parametrize("status", [126, 127])
@pytest.mark.parametrize("language", sorted(EXIT_AS_IF_MISSING))
async def test_exiting_as_if_the_command_were_missing_is_the_programs_own_failure(
    session: Session, language: str, status: int
) -> None:
    if language == "c" and shutil.which("gcc") is None:
        pytest.skip("no C compiler on this machine")
    lang = PYTHON_COMMAND if language == "python-command" else language
    source = EXIT_AS_IF_MISSING[language].format(status=status)
    result = await session.judge(Program(source=source, language=lang), CASES[:2])
    assert result.verdict == Verdict.RUNTIME_ERROR, result
    assert result.score == 0.0
    assert [case.returncode for case in result.cases] == [status, status]


@pytest.mark.parametrize("language", ["python", "python-command"])
async def test_exiting_as_if_the_memory_limit_were_refused_is_the_programs_own_failure(
    session: Session, language: str
) -> None:
    """125 with no output, under a memory limit: what a refused limit once looked like."""
    lang = PYTHON_COMMAND if language == "python-command" else language
    program = Program(source="import os\nos._exit(125)\n", language=lang)
    result = await session.judge(program, CASES[:2], memory_mb=512)
    assert result.verdict == Verdict.RUNTIME_ERROR, result
    assert result.score == 0.0


@pytest.mark.docker
@pytest.mark.parametrize("anyio_backend", ["asyncio"])  # aiodocker is asyncio only
@pytest.mark.parametrize(
    "leave",
    ["orphaned", "parent_death_signal", "double_fork", "at_once", "stopped_guard", "forged_sender"],
)
async def test_on_docker_too(docker_engine: None, leave: str) -> None:
    options = {"default_image": docker_test_image()}
    async with Session("docker", backend_options=options, sweep=False, report_to=[]) as s:
        for language in ("python", PYTHON_COMMAND):
            result = await s.judge(
                Program(source=program(leave), language=language), CASES, parallel=4
            )
            assert_none_accepted(result)
