"""asyncsandbox's in-container agent: runs one command so that it can be killed whole.

Runs inside the sandbox as ``python3 -c <this file> MODE ...`` (stdlib only, Python >= 3.6;
never imported by the host). Docker has no call to kill an exec's process, let alone its
process tree, so every command runs under this shepherd (the fast path's executor,
``_agent_executor.py``, is shipped with this file and runs each of its commands under it
too):

``run TOKEN UID GID STDIN_BYTES CWD -- ARGV...``
    Starts as root, records its pid in a root-only directory under TOKEN, becomes a child
    subreaper (so orphaned descendants, even ``setsid`` and double-forked daemons, stay
    below it), and runs ARGV in a new session as UID:GID in CWD, with exactly STDIN_BYTES
    bytes of our stdin as its stdin. When ARGV exits, every process it left behind is
    killed, then the shepherd exits with ARGV's status (128+N for signal N). On SIGTERM it
    kills the whole tree and exits 137. The command cannot signal the shepherd (it runs as
    another user), and the shepherd never reads the command's output: results come from
    Docker itself, so they stay honest. If the shepherd cannot start ARGV (a fork fails,
    say), it writes why in TOKEN.failed in that root-only directory and exits
    LAUNCH_FAILED: the host reads the file (a command can exit LAUNCH_FAILED too, but
    cannot write there) and reports a launch failure instead of an exit status.

``kill TOKEN``
    SIGTERMs the shepherd recorded under TOKEN and waits until it is gone.
"""

import errno
import os
import signal
import sys
import time

# Startup is paid by every command on the Engine API path: only what ``run`` and ``kill``
# need is imported here (threading comes when used; annotations stay unevaluated strings,
# so typing is never imported at run time).
TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any, Callable, Dict, List, NoReturn, Optional, Tuple


class suppress:
    """contextlib.suppress, without importing contextlib (and collections, functools)."""

    def __init__(self, *errors: "type[BaseException]") -> None:
        self.errors = errors

    def __enter__(self) -> None:
        pass

    def __exit__(self, kind: "Optional[type[BaseException]]", value: object, tb: object) -> bool:
        return kind is not None and issubclass(kind, self.errors)


RUN_DIR = "/run/asyncsandbox"
PR_SET_CHILD_SUBREAPER = 36
PR_SET_DUMPABLE = 4
LAUNCH_FAILED = 125  # `run`: the command could not be started (why: RUN_DIR/TOKEN.failed)
# Failures to start a command that may pass (a full pids cgroup, memory, descriptors).
TRANSIENT = (errno.EAGAIN, errno.ENOMEM, errno.EMFILE, errno.ENFILE, errno.EINTR)


def prctl(option: int, value: int) -> bool:
    try:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        return bool(libc.prctl(option, value, 0, 0, 0) == 0)
    except (ImportError, OSError, AttributeError):
        return False


def set_subreaper() -> bool:
    return prctl(PR_SET_CHILD_SUBREAPER, 1)


CLONE_NEWPID = 0x20000000
IN_PID_NAMESPACE = [False]  # kill_tree: the shepherd is PID 1 of the command's namespace


def own_pid_namespace() -> None:
    """Where there is no child subreaper (gVisor 20221219 refuses it), keep the command's
    tree below us another way: a PID namespace of its own, whose init we become (orphans
    are reparented to it; SIGKILL to it ends them all). Needs CAP_SYS_ADMIN (the Docker
    backend adds it under gVisor only, where it is gVisor's kernel's, not the host's).
    Our parent stays outside, forwards SIGTERM to us, and exits as we do. Called with
    SIGTERM and SIGCHLD blocked (see :func:`wait_or_term`); the init inherits that."""
    try:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        if libc.unshare(CLONE_NEWPID) != 0:
            return
    except (ImportError, OSError, AttributeError):
        return
    init = os.fork()
    if init == 0:
        IN_PID_NAMESPACE[0] = True
        return
    status, _ = wait_or_term(init, lambda: os.kill(init, signal.SIGTERM))
    os._exit(os.WEXITSTATUS(status) if os.WIFEXITED(status) else 128 + os.WTERMSIG(status))


WAITED = {signal.SIGTERM, signal.SIGCHLD}


def wait_or_term(child: int, on_term: "Callable[[], object]") -> "Tuple[int, Any]":
    """Wait until ``child`` ended, calling ``on_term`` at each SIGTERM meanwhile (if it
    returns, the wait goes on); return ``os.wait4``'s status and resource usage.

    The caller blocks ``WAITED`` first (signals then wait, pending, for ``sigwaitinfo``):
    with a handler instead, a SIGTERM that came after the interpreter's last check for
    signals and before a blocking wait's system call would run its handler only once the
    wait ended; a KILL would wait for the command to end by itself (seen under gVisor,
    whose system calls take long enough for it to happen in one command of a few hundred
    cancelled as they start)."""
    while True:
        pid, status, usage = os.wait4(child, os.WNOHANG)
        if pid:
            return status, usage
        if signal.sigwaitinfo(WAITED).si_signo == signal.SIGTERM:
            on_term()


class LaunchFailed(Exception):
    """We could not start the command (it never ran); ``record`` says why: b"1" (may pass:
    retryable) or b"0", then a message."""

    def __init__(self, record: bytes) -> None:
        super().__init__(record)
        self.record = record


def failure_record(step: str, exc: BaseException, transient: bool = False) -> bytes:
    reason = getattr(exc, "strerror", None) or str(exc) or type(exc).__name__
    transient = transient or getattr(exc, "errno", None) in TRANSIENT
    return (b"1" if transient else b"0") + (step + ": " + reason).encode(errors="replace")[:1000]


def read_all(fd: int) -> bytes:
    data = b""
    while True:
        chunk = os.read(fd, 4096)
        if not chunk:
            return data
        data += chunk


def spawn(
    argv: "List[str]",
    cwd: str,
    uid: int,
    gid: int,
    env: "Optional[Dict[str, str]]",
    stdin: "Optional[int]",
    close: "Tuple[int, ...]" = (),
) -> int:
    """Fork and exec the command; return its pid once it runs (or failed as a command does:
    not found, bad cwd). Raise LaunchFailed if we could not start it.

    ``stdin``: the fd the command reads (None: /dev/null; -1: keep ours); ``close``:
    inheritable fds the command must not hold. The child reports a failure of ours on a
    pipe that its exec closes (Python's pipes are close-on-exec), so an empty read means
    the command runs.
    """
    report_r, report_w = os.pipe()
    try:
        child = os.fork()
    except OSError as exc:
        os.close(report_r)
        os.close(report_w)
        raise LaunchFailed(failure_record("fork", exc)) from None
    if child == 0:
        step = "set up stdin"
        try:
            os.close(report_r)
            for fd in close:
                os.close(fd)
            if stdin != -1:
                source = os.open(os.devnull, os.O_RDONLY) if stdin is None else stdin
                os.dup2(source, 0)
                os.close(source)
        except BaseException as exc:  # noqa: BLE001 - a forked child: report, never return
            os.write(report_w, failure_record(step, exc))
            os._exit(LAUNCH_FAILED)
        exec_command(argv, cwd, uid, gid, env, report_w)
    os.close(report_w)
    try:
        record = read_all(report_r)
    finally:
        os.close(report_r)
    if record:
        os.waitpid(child, 0)  # it exits at once
        raise LaunchFailed(record)
    return child


def oom_kills() -> int:
    """OOM kills so far in this container's memory cgroup (-1: unknown)."""
    for path, key in (
        ("/sys/fs/cgroup/memory.events", "oom_kill"),
        ("/sys/fs/cgroup/memory/memory.oom_control", "oom_kill"),
    ):
        try:
            with open(path) as f:
                for line in f:
                    name, _, value = line.partition(" ")
                    if name == key:
                        return int(value)
        except (OSError, ValueError):
            continue
    return -1


def descendants(root: int) -> "List[int]":
    children: Dict[int, List[int]] = {}
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open("/proc/" + name + "/stat", "rb") as f:
                stat = f.read()
        except OSError:
            continue
        # Field 2 (the command) may hold spaces and parentheses; ppid follows the last ')'.
        ppid = int(stat[stat.rindex(b")") + 2 :].split()[1])
        children.setdefault(ppid, []).append(int(name))
    found: List[int] = []
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
    if IN_PID_NAMESPACE[0]:  # everything else in the namespace is the command's
        while True:
            with suppress(OSError):
                os.kill(-1, signal.SIGKILL)
            try:
                os.waitpid(-1, 0)
            except ChildProcessError:
                return
    me = os.getpid()
    for _ in range(10000):
        pids = descendants(me)
        if not pids:
            return
        for pid in pids:
            with suppress(OSError):
                os.kill(pid, signal.SIGKILL)
        reap()
        time.sleep(0.001)


def pidfile(token: str) -> str:
    if not token or "/" in token:
        raise SystemExit("bad token")
    return os.path.join(RUN_DIR, token)


def feed_stdin(fd: int, remaining: int) -> None:
    try:
        while remaining > 0:
            data = os.read(0, min(remaining, 1 << 16))
            if not data:
                break
            remaining -= len(data)
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view) :]
    except OSError:
        pass  # the command exited or closed its stdin: not an error
    finally:
        os.close(fd)


def run(token: str, uid: int, gid: int, stdin_bytes: int, cwd: str, argv: "List[str]") -> None:
    path: Optional[str] = None
    step = "create " + RUN_DIR

    def on_term() -> "NoReturn":
        kill_tree()
        if path is not None:
            with suppress(OSError):
                os.unlink(path)
        os._exit(137)

    # Before the pid file (`kill TOKEN` may come once it is there) and before the stdin
    # feeder starts (its thread inherits the mask): a SIGTERM waits, pending, for
    # wait_or_term, which kills the tree once the command runs.
    signal.pthread_sigmask(signal.SIG_BLOCK, WAITED)
    try:
        try:
            os.makedirs(RUN_DIR, 0o700)
        except OSError as exc:
            if exc.errno != errno.EEXIST:
                raise
        path = pidfile(token)
        step = "write " + path
        with open(path, "w") as f:
            f.write(str(os.getpid()))
        set_subreaper()
        pipe: Optional[Tuple[int, int]] = None
        if stdin_bytes > 0:
            step = "stdin"
            pipe = os.pipe()
            import threading
            import warnings

            # Started before the command, so that a failure to start it is ours to report.
            # The fork below is then one of a threaded process, which Python >= 3.12 warns
            # about on the command's stderr; the child only execs (no lock to deadlock on).
            warnings.filterwarnings("ignore", "This process", DeprecationWarning)
            feeder = threading.Thread(target=feed_stdin, args=(pipe[1], stdin_bytes), daemon=True)
            try:
                feeder.start()
            except RuntimeError as exc:  # "can't start new thread": no task left to clone
                raise LaunchFailed(failure_record("start a thread", exc, transient=True)) from None
        # (The feeder's end of the pipe is close-on-exec: the command never holds it, and
        # sees EOF once the feeder is done, maybe before this fork.)
        child = spawn(argv, cwd, uid, gid, None, None if pipe is None else pipe[0])
    except LaunchFailed as failure:
        launch_failed(token, path, failure.record)
    except Exception as exc:  # noqa: BLE001 - whatever it is, the command never ran
        launch_failed(token, path, failure_record(step, exc))
    if pipe is not None:
        os.close(pipe[0])
    status, _ = wait_or_term(child, on_term)
    code = os.WEXITSTATUS(status) if os.WIFEXITED(status) else 128 + os.WTERMSIG(status)
    # The command owns what it started: nothing it left behind outlives it.
    kill_tree()
    with suppress(OSError):
        os.unlink(pidfile(token))
    os._exit(code)


def launch_failed(token: str, path: "Optional[str]", record: bytes) -> "NoReturn":
    """``run`` could not start the command: say why where only root can write, and exit
    LAUNCH_FAILED (never returns)."""
    try:
        with open(os.path.join(RUN_DIR, token + ".failed"), "wb") as f:
            f.write(record)
    except OSError:
        pass  # the host then sees the exit status alone
    if path is not None:
        with suppress(OSError):
            os.unlink(path)
    os.write(2, b"asyncsandbox: the command could not be started: " + record[1:] + b"\n")
    os._exit(LAUNCH_FAILED)


def kill(token: str) -> int:
    try:
        with open(pidfile(token)) as f:
            pid = int(f.read())
    except (OSError, ValueError):
        return 0  # already finished (or never started)
    try:
        os.kill(pid, signal.SIGTERM)
    except OSError:
        return 0
    deadline = time.time() + 10
    while time.time() < deadline:
        try:
            with open(f"/proc/{pid}/stat", "rb") as f:
                state = f.read().rsplit(b")", 1)[1].split()[0]
        except OSError:
            return 0  # gone
        if state == b"Z":
            return 0  # dead, waiting to be reaped
        time.sleep(0.005)
    return 1


def exec_command(
    argv: "List[str]",
    cwd: str,
    uid: int,
    gid: int,
    env: "Optional[Dict[str, str]]",
    report: int,
) -> None:
    """In a forked child with its stdio in place: become the command (never returns).

    A command that cannot start is an exit status as a shell gives it (bad cwd, not
    executable: 126; not found: 127). A failure of ours (the user switch, a transient
    EAGAIN from exec) is written to ``report`` instead, and the child exits LAUNCH_FAILED.
    """
    step = "set up the session"
    try:
        os.setsid()
        for sig in (signal.SIGPIPE, signal.SIGXFSZ, signal.SIGTERM, signal.SIGCHLD):
            signal.signal(sig, signal.SIG_DFL)
        signal.pthread_sigmask(signal.SIG_SETMASK, ())  # ours blocks WAITED (wait_or_term)
        if uid >= 0 and os.getuid() == 0:
            step = "switch to uid " + str(uid)
            os.setgroups([])
            os.setgid(gid)
            os.setuid(uid)
        try:
            os.chdir(cwd)
        except OSError as exc:
            os.write(2, f"cannot change to directory {cwd}: {exc.strerror}\n".encode())
            os._exit(126)
        step = "exec " + argv[0]
        try:
            if env is None:
                os.execvp(argv[0], argv)
            os.execvpe(argv[0], argv, env)
        except FileNotFoundError:
            os.write(2, f"{argv[0]}: command not found\n".encode())
            os._exit(127)
        except OSError as exc:
            if exc.errno in TRANSIENT:
                raise  # the program is there: we could not start it now
            os.write(2, f"{argv[0]}: {exc.strerror}\n".encode())
            os._exit(126)
    except BaseException as exc:  # noqa: BLE001 - a forked child: report, never return
        with suppress(OSError):
            os.write(report, failure_record(step, exc))
    finally:
        os._exit(LAUNCH_FAILED)


def main(args: "List[str]") -> None:
    if args[:1] == ["run"] and len(args) >= 8 and args[6] == "--":
        run(args[1], int(args[2]), int(args[3]), int(args[4]), args[5], args[7:])
    elif args[:1] == ["kill"] and len(args) == 2:
        sys.exit(kill(args[1]))
    else:
        sys.exit("usage: agent run TOKEN UID GID STDIN_BYTES CWD -- ARGV... | kill TOKEN")


if __name__ == "__main__":
    main(sys.argv[1:])
