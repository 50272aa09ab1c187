"""asyncsandbox's in-container agent: runs one command so that it can be killed whole.

Runs inside the sandbox as ``python3 -c <this file> MODE ...`` (stdlib only, Python >= 3.6;
never imported by the host). Docker has no call to kill an exec's process, let alone its
process tree, so every command runs under this shepherd:

``run TOKEN UID GID STDIN_BYTES CWD -- ARGV...``
    Starts as root, records its pid in a root-only directory under TOKEN, becomes a child
    subreaper (so orphaned descendants, even ``setsid`` and double-forked daemons, stay
    below it), and runs ARGV in a new session as UID:GID in CWD, with exactly STDIN_BYTES
    bytes of our stdin as its stdin. When ARGV exits, every process it left behind is
    killed, then the shepherd exits with ARGV's status (128+N for signal N). On SIGTERM it
    kills the whole tree and exits 137. The command cannot signal the shepherd (it runs as
    another user), and the shepherd never reads the command's output: results come from
    Docker itself, so they stay honest.

``kill TOKEN``
    SIGTERMs the shepherd recorded under TOKEN and waits until it is gone.
"""

import contextlib
import errno
import os
import signal
import sys
import threading
import time
from typing import Dict, List, Optional, Tuple

RUN_DIR = "/run/asyncsandbox"
PR_SET_CHILD_SUBREAPER = 36


def set_subreaper() -> bool:
    try:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        return bool(libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) == 0)
    except (ImportError, OSError, AttributeError):
        return False


def descendants(root: int) -> List[int]:
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
    me = os.getpid()
    for _ in range(10000):
        pids = descendants(me)
        if not pids:
            return
        for pid in pids:
            with contextlib.suppress(OSError):
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


def run(token: str, uid: int, gid: int, stdin_bytes: int, cwd: str, argv: List[str]) -> None:
    try:
        os.makedirs(RUN_DIR, 0o700)
    except OSError as exc:
        if exc.errno != errno.EEXIST:
            raise
    path = pidfile(token)
    with open(path, "w") as f:
        f.write(str(os.getpid()))
    set_subreaper()
    pipe: Optional[Tuple[int, int]] = os.pipe() if stdin_bytes > 0 else None
    child = os.fork()
    if child == 0:
        try:
            os.setsid()
            if pipe is None:
                source = os.open(os.devnull, os.O_RDONLY)
            else:
                source = pipe[0]
                os.close(pipe[1])
            os.dup2(source, 0)
            os.close(source)
            # Python ignores SIGPIPE; ignored signals survive exec, so restore the default.
            for sig in (signal.SIGPIPE, signal.SIGXFSZ):
                signal.signal(sig, signal.SIG_DFL)
            if uid >= 0 and os.getuid() == 0:
                os.setgroups([])
                os.setgid(gid)
                os.setuid(uid)
            try:
                os.chdir(cwd)
            except OSError as exc:
                os.write(2, f"cannot change to directory {cwd}: {exc.strerror}\n".encode())
                os._exit(126)
            try:
                os.execvp(argv[0], argv)
            except FileNotFoundError:
                os.write(2, f"{argv[0]}: command not found\n".encode())
                os._exit(127)
            except OSError as exc:
                os.write(2, f"{argv[0]}: {exc.strerror}\n".encode())
                os._exit(126)
        finally:
            os._exit(126)

    def on_term(signum: int, frame: object) -> None:
        kill_tree()
        with contextlib.suppress(OSError):
            os.unlink(path)
        os._exit(137)

    signal.signal(signal.SIGTERM, on_term)
    if pipe is not None:
        os.close(pipe[0])
        threading.Thread(target=feed_stdin, args=(pipe[1], stdin_bytes), daemon=True).start()
    _, status = os.waitpid(child, 0)
    code = os.WEXITSTATUS(status) if os.WIFEXITED(status) else 128 + os.WTERMSIG(status)
    # The command owns what it started: nothing it left behind outlives it.
    kill_tree()
    with contextlib.suppress(OSError):
        os.unlink(path)
    os._exit(code)


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


def main(args: List[str]) -> None:
    if args[:1] == ["run"] and len(args) >= 8 and args[6] == "--":
        run(args[1], int(args[2]), int(args[3]), int(args[4]), args[5], args[7:])
    elif args[:1] == ["kill"] and len(args) == 2:
        sys.exit(kill(args[1]))
    else:
        sys.exit("usage: agent run TOKEN UID GID STDIN_BYTES CWD -- ARGV... | agent kill TOKEN")


if __name__ == "__main__":
    main(sys.argv[1:])
