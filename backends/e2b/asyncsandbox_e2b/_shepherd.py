"""The e2b backend's shepherd: runs one command inside an E2B sandbox so that its whole
process tree can be killed.

Runs in the sandbox as ``python3 -I -S -c <this file> DEADLINE STDIN CWD ARGV...``
(stdlib only, Python >= 3.6; never imported by the host). envd starts a command and can
signal that one process; it neither kills what the command leaves behind nor a tree on
a timeout (its own deadline SIGKILLs the process it started, and only that). So the
backend starts every command under this shepherd, which

* becomes a child subreaper, so that whatever the command starts stays below it, even
  ``setsid`` and double-forked daemons;
* runs ARGV in a new session in CWD, its stdin the file STDIN (``-``: envd's, which the
  backend leaves empty), which it unlinks once open; a command that cannot start exits
  as a shell's would (126: bad cwd or not executable; 127: not found);
* when ARGV exits, kills every process it left behind and exits with ARGV's status
  (128+N after signal N);
* on SIGTERM (the backend's cancellation) or at DEADLINE seconds (``-``: none; the
  backend's own deadline comes first, this one is for a client that vanished), kills the
  whole tree and exits 137.

It writes nothing of its own but the shell-like messages of a command that cannot start.
"""

import os
import signal
import sys
import time

# Annotations stay unevaluated strings (Python 3.6 has no list[int]); typing is never
# imported at run time.
TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Dict, List

PR_SET_CHILD_SUBREAPER = 36


def set_subreaper() -> None:
    try:
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)
    except Exception:  # noqa: BLE001, S110 - without it a detached daemon escapes the kill
        pass


def descendants(root: int) -> "List[int]":
    children: "Dict[int, List[int]]" = {}
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open("/proc/" + name + "/stat", "rb") as f:
                stat = f.read()
            # The command name (field 2) may hold spaces and parentheses: ppid follows
            # the last ')'.
            ppid = int(stat[stat.rindex(b")") + 2 :].split()[1])
        except (OSError, ValueError):
            continue
        children.setdefault(ppid, []).append(int(name))
    found: "List[int]" = []
    stack = [root]
    while stack:
        for child in children.get(stack.pop(), ()):
            found.append(child)
            stack.append(child)
    return found


def reap() -> None:
    while True:
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return


def kill_tree() -> None:
    """SIGKILL every descendant until none is left (new forks are caught next round)."""
    me = os.getpid()
    for _ in range(10000):
        pids = descendants(me)
        if not pids:
            return
        for pid in pids:
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass
        reap()
        time.sleep(0.001)


def end(signum: int, frame: object) -> None:
    kill_tree()
    os._exit(137)


def say(message: str) -> None:
    os.write(2, message.encode("utf-8", "replace") + b"\n")


def become(argv: "List[str]", cwd: str, stdin: str) -> None:
    """In the forked child: become the command (never returns)."""
    try:
        for sig in (signal.SIGTERM, signal.SIGALRM, signal.SIGPIPE, signal.SIGXFSZ):
            signal.signal(sig, signal.SIG_DFL)
        os.setsid()
        if stdin != "-":
            fd = os.open(stdin, os.O_RDONLY)
            try:
                os.unlink(stdin)
            except OSError:
                pass
            os.dup2(fd, 0)
            os.close(fd)
        try:
            os.chdir(cwd)
        except OSError as exc:
            say("cannot change to directory %s: %s" % (cwd, exc.strerror))
            os._exit(126)
        try:
            os.execvp(argv[0], argv)
        except FileNotFoundError:
            say("%s: command not found" % argv[0])
            os._exit(127)
        except OSError as exc:
            say("%s: %s" % (argv[0], exc.strerror))
            os._exit(126)
    except BaseException as exc:  # noqa: BLE001 - a forked child: report, never return
        say("asyncsandbox: the command could not be started: %r" % (exc,))
        os._exit(125)


def main() -> None:
    deadline, stdin, cwd = sys.argv[1:4]
    argv = sys.argv[4:]
    signal.signal(signal.SIGTERM, end)
    set_subreaper()
    try:
        child = os.fork()
    except OSError as exc:
        if stdin != "-":
            try:
                os.unlink(stdin)
            except OSError:
                pass
        say("asyncsandbox: the command could not be started: fork: %s" % exc.strerror)
        os._exit(125)
    if child == 0:
        become(argv, cwd, stdin)
    if deadline != "-":
        signal.signal(signal.SIGALRM, end)
        signal.setitimer(signal.ITIMER_REAL, max(0.001, float(deadline)))
    _, status = os.waitpid(child, 0)
    code = os.WEXITSTATUS(status) if os.WIFEXITED(status) else 128 + os.WTERMSIG(status)
    # The command owns what it started: nothing it left behind outlives it.
    kill_tree()
    os._exit(code)


main()
