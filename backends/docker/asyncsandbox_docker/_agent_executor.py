"""asyncsandbox's in-container executor: the fast path's commands, over one channel.

``serve UID GID WORKDIR HOME LIFETIME``
    The container's main process (under Docker's init), attached by the host before start;
    its stdin and stdout carry framed messages (see FRAME below), so a command costs a fork
    instead of three Engine API calls. It prepares WORKDIR and HOME for UID, then runs each
    command under its own shepherd (as the agent's ``run``: ``_agent.py``), relays the
    command's output tagged with its job id, and reports how the command ended (exit
    status, signal, OOM kill, CPU time), or that it could not be started
    (``launch_error``). It is not dumpable and runs as root while commands run as UID: a
    command can neither signal it nor reach its file descriptors, so it cannot forge a
    frame. It exits — ending the container — when its LIFETIME (seconds) is over, or when
    the host disconnects (stdin EOF: the owner died), killing every command first.

Never imported by the host: shipped with the agent as one ``python3 -c`` program (see
``_executor.PROGRAM``), in which the agent is the module ``agent`` (a global here).
Standard library only, Python >= 3.6.
"""

import json
import os
import selectors
import signal
import struct
import sys
import time

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Dict, List, Optional

    from asyncsandbox_docker import _agent as agent  # shipped before this file (see above)

# FRAME: type (1 byte), job id (4 bytes), payload length (4 bytes), payload.
FRAME = struct.Struct(">BII")
START, STDIN, STDIN_EOF, KILL = 1, 2, 3, 4  # host -> executor; START's payload is JSON
READY, STDOUT, STDERR, EXIT, FAILED = 10, 11, 12, 13, 14  # executor -> host
OUT_HIGH = 8 << 20  # stop reading commands' output while this much waits for the host


def shepherd(spec: "Dict[str, object]", uid: int, gid: int) -> None:
    """In a forked child of the executor, fds 0-3 set: run one command and report on fd 3
    how it ended, or that it could not be started (``launch_error``). SIGTERM (the host's
    KILL) and SIGCHLD stay blocked from the fork on (see Executor.start): a KILL waits,
    pending, for ``agent.wait_or_term``, even one sent before the command started."""
    os.closerange(4, 65536)
    if not agent.set_subreaper():
        agent.own_pid_namespace()
    status: Dict[str, object] = {"returncode": 137, "signal": 9, "oom": False}

    def report() -> None:
        os.write(3, json.dumps(status).encode())

    def on_term() -> None:
        agent.kill_tree()
        report()
        os._exit(0)

    try:
        env = dict(os.environ)
        env.update(spec["env"])  # type: ignore[call-overload]
        before = agent.oom_kills()
        argv: List[str] = spec["argv"]  # type: ignore[assignment]
        child = agent.spawn(argv, str(spec["cwd"]), uid, gid, env, -1, (3,))
    except agent.LaunchFailed as failure:
        status = launch_error(failure.record)
        report()
        os._exit(0)
    except Exception as exc:  # noqa: BLE001 - whatever it is, the command never ran
        status = launch_error(agent.failure_record("prepare", exc))
        report()
        os._exit(0)
    # The command's stdio belongs to the command's tree alone: EOF means it is all gone.
    devnull = os.open(os.devnull, os.O_RDWR)
    for fd in (0, 1, 2):
        os.dup2(devnull, fd)
    code, usage = agent.wait_or_term(child, on_term)
    killed_by = os.WTERMSIG(code) if os.WIFSIGNALED(code) else None
    agent.kill_tree()
    status = {
        "returncode": os.WEXITSTATUS(code) if killed_by is None else 128 + killed_by,
        "signal": killed_by,
        "oom": killed_by == signal.SIGKILL and before >= 0 and agent.oom_kills() > before,
        "cpu": usage.ru_utime + usage.ru_stime,  # the command and the children it waited for
    }
    report()
    os._exit(0)


def launch_error(record: bytes) -> "Dict[str, object]":
    """The status of a command that could not be started (see LaunchFailed)."""
    return {"launch_error": record[1:].decode(errors="replace"), "retryable": record[:1] == b"1"}


class Job:
    def __init__(self, pid: int, out: int, err: int, status: int, stdin: "Optional[int]") -> None:
        self.pid = pid
        self.streams = {out: STDOUT, err: STDERR}
        self.status_fd: Optional[int] = status
        self.status: Optional[bytes] = None  # complete once status_fd is None (EOF)
        self.stdin = stdin
        self.pending = bytearray()  # stdin waiting for the command to read it
        self.stdin_eof = False


class Executor:
    def __init__(self, uid: int, gid: int) -> None:
        self.uid, self.gid = uid, gid
        self.selector = selectors.DefaultSelector()
        self.jobs: Dict[int, Job] = {}
        self.inbox = bytearray()
        self.outbox = bytearray()
        self.paused = False
        os.set_blocking(1, False)
        self.selector.register(0, selectors.EVENT_READ, None)

    def send(self, kind: int, job: int, payload: bytes = b"") -> None:
        self.outbox += FRAME.pack(kind, job, len(payload)) + payload
        self._update_stdout()

    def _update_stdout(self) -> None:
        want_write = bool(self.outbox)
        try:
            key = self.selector.get_key(1)
            if not want_write:
                self.selector.unregister(1)
            elif key.events != selectors.EVENT_WRITE:
                self.selector.modify(1, selectors.EVENT_WRITE, None)
        except KeyError:
            if want_write:
                self.selector.register(1, selectors.EVENT_WRITE, None)
        # Backpressure: stop reading commands' output while the host lags behind.
        pause = len(self.outbox) > OUT_HIGH
        if pause != self.paused:
            self.paused = pause
            for job_id, job in self.jobs.items():
                for fd in job.streams:
                    if pause:
                        self.selector.unregister(fd)
                    else:
                        self.selector.register(fd, selectors.EVENT_READ, job_id)

    def start(self, job_id: int, spec: "Dict[str, object]") -> None:
        """Fork the command's shepherd. Raises OSError (nothing left open) if it cannot.

        The shepherd is forked with SIGTERM (the host's KILL) and SIGCHLD blocked, and
        keeps them blocked (``agent.wait_or_term``): until it waits, it would run our
        handler (the executor's exit); a KILL sent meanwhile waits, pending."""
        opened: List[int] = []
        signal.pthread_sigmask(signal.SIG_BLOCK, agent.WAITED)
        try:
            out_r, out_w = os.pipe()
            opened += (out_r, out_w)
            err_r, err_w = os.pipe()
            opened += (err_r, err_w)
            st_r, st_w = os.pipe()
            opened += (st_r, st_w)
            in_r, in_w = os.pipe() if spec.get("stdin") else (None, None)
            if in_r is not None and in_w is not None:
                opened += (in_r, in_w)
            pid = os.fork()
        except OSError:
            for leftover in opened:
                os.close(leftover)
            signal.pthread_sigmask(signal.SIG_UNBLOCK, agent.WAITED)
            raise
        if pid == 0:
            try:
                os.dup2(os.open(os.devnull, os.O_RDONLY) if in_r is None else in_r, 0)
                os.dup2(out_w, 1)
                os.dup2(err_w, 2)
                os.dup2(st_w, 3)
                shepherd(spec, self.uid, self.gid)
            except BaseException as exc:  # noqa: BLE001 - a forked child: report, never return
                with agent.suppress(OSError):
                    failure = launch_error(agent.failure_record("prepare the shepherd", exc))
                    os.write(st_w, json.dumps(failure).encode())
            finally:
                os._exit(agent.LAUNCH_FAILED)
        signal.pthread_sigmask(signal.SIG_UNBLOCK, agent.WAITED)
        for fd in (out_w, err_w, st_w, in_r):
            if fd is not None:
                os.close(fd)
        job = Job(pid, out_r, err_r, st_r, in_w)
        self.jobs[job_id] = job
        for fd in (out_r, err_r, st_r) + ((in_w,) if in_w is not None else ()):
            os.set_blocking(fd, False)
        if not self.paused:
            for fd in job.streams:
                self.selector.register(fd, selectors.EVENT_READ, job_id)
        self.selector.register(st_r, selectors.EVENT_READ, job_id)

    def feed(self, job_id: int, data: bytes, eof: bool) -> None:
        job = self.jobs.get(job_id)
        if job is None or job.stdin is None:
            return
        job.pending += data
        job.stdin_eof = job.stdin_eof or eof
        self._flush_stdin(job_id, job)

    def _flush_stdin(self, job_id: int, job: Job) -> None:
        assert job.stdin is not None
        try:
            while job.pending:
                written = os.write(job.stdin, job.pending)
                del job.pending[:written]
        except BlockingIOError:
            pass
        except OSError:  # the command stopped reading: drop the rest
            job.pending.clear()
            job.stdin_eof = True
        with agent.suppress(KeyError):
            self.selector.unregister(job.stdin)
        if job.pending:
            self.selector.register(job.stdin, selectors.EVENT_WRITE, job_id)
        elif job.stdin_eof:
            os.close(job.stdin)
            job.stdin = None

    def kill(self, job_id: int) -> None:
        job = self.jobs.get(job_id)
        if job is not None:
            with agent.suppress(OSError):
                os.kill(job.pid, signal.SIGTERM)

    def finish_if_done(self, job_id: int) -> None:
        job = self.jobs[job_id]
        # Done when the output pipes and the status pipe have all reached EOF: a job removed
        # with one of them still registered would leave an fd that polls ready forever.
        if job.streams or job.status_fd is not None:
            return
        _, code = os.waitpid(job.pid, 0)
        if job.stdin is not None:
            with agent.suppress(KeyError):
                self.selector.unregister(job.stdin)
            os.close(job.stdin)
        del self.jobs[job_id]
        if not job.status:  # the shepherd died unheard: say how
            signaled = os.WIFSIGNALED(code)
            lost = {
                "lost": ("killed by signal " if signaled else "exited with status ")
                + str(os.WTERMSIG(code) if signaled else os.WEXITSTATUS(code)),
                "signal": os.WTERMSIG(code) if signaled else None,
            }
            job.status = json.dumps(lost).encode()
        self.send(EXIT, job_id, job.status)

    def on_host_frames(self) -> bool:
        data = os.read(0, 1 << 18)
        if not data:
            return False
        self.inbox += data
        while len(self.inbox) >= FRAME.size:
            kind, job_id, length = FRAME.unpack_from(self.inbox)
            if len(self.inbox) < FRAME.size + length:
                break
            payload = bytes(self.inbox[FRAME.size : FRAME.size + length])
            del self.inbox[: FRAME.size + length]
            if kind == START:
                try:
                    self.start(job_id, json.loads(payload))
                except (OSError, ValueError) as exc:
                    failure = launch_error(agent.failure_record("start a shepherd", exc))
                    self.send(FAILED, job_id, json.dumps(failure).encode())
            elif kind in (STDIN, STDIN_EOF):
                self.feed(job_id, payload, kind == STDIN_EOF)
            elif kind == KILL:
                self.kill(job_id)
        return True

    def on_job_fd(self, fd: int, job_id: int) -> None:
        job = self.jobs[job_id]
        if fd == job.stdin:
            self._flush_stdin(job_id, job)
            return
        try:
            data = os.read(fd, 1 << 16)
        except BlockingIOError:
            return
        if fd == job.status_fd:
            job.status = (job.status or b"") + data
            if data:
                return
            self.selector.unregister(fd)
            os.close(fd)
            job.status_fd = None
        elif data:
            self.send(job.streams[fd], job_id, data)
            return
        else:
            if not self.paused:
                self.selector.unregister(fd)
            del job.streams[fd]
            os.close(fd)
        self.finish_if_done(job_id)

    def loop(self, deadline: float) -> None:
        self.send(
            READY, 0, json.dumps({"pid": os.getpid(), "python": sys.version.split()[0]}).encode()
        )
        while True:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return  # the sandbox's max lifetime is over
            for key, _ in self.selector.select(min(remaining, 3600.0)):
                if self.selector.get_map().get(key.fd) is not key:
                    # Handling an earlier event of this batch closed (and maybe reused) the
                    # fd: this event is stale. Reading it would fail (EBADF) or read another
                    # job's pipe. Still registered fds are reported again by the next select.
                    continue
                if key.fd == 0:
                    if not self.on_host_frames():
                        return
                elif key.fd == 1:
                    with agent.suppress(BlockingIOError):
                        del self.outbox[: os.write(1, self.outbox)]
                    self._update_stdout()
                elif key.data in self.jobs:
                    self.on_job_fd(key.fd, key.data)

    def shutdown(self) -> None:
        for job in self.jobs.values():
            with agent.suppress(OSError):
                os.kill(job.pid, signal.SIGTERM)
        for job in self.jobs.values():
            with agent.suppress(OSError):
                os.waitpid(job.pid, 0)
        agent.kill_tree()


def prepare(directory: str, uid: int, gid: int) -> None:
    """Make ``directory`` the sandbox user's: create it, or take it over while it is empty
    (Docker creates the workdir for root). An image's populated directory keeps its owner."""
    os.makedirs(directory, 0o755, exist_ok=True)
    if uid >= 0 and not os.listdir(directory):
        os.chown(directory, uid, gid)


# The loopback lines of the hosts file Docker writes under its network "none" (with
# networking disabled, it writes none: the file stays empty).
HOSTS = b"127.0.0.1\tlocalhost\n::1\tlocalhost ip6-localhost ip6-loopback\n"


def name_localhost() -> None:
    """Give an empty /etc/hosts (a container created with networking disabled: see the
    backend's create) the loopback names, so that ``localhost`` resolves as it does under
    Docker's own network "none". No hosts file, or a read-only one: left as it is."""
    with agent.suppress(OSError), open("/etc/hosts", "r+b") as hosts:
        if not hosts.read(1):
            hosts.write(HOSTS)


def serve(uid: int, gid: int, workdir: str, home: str, lifetime: float) -> None:
    agent.prctl(agent.PR_SET_DUMPABLE, 0)  # not even root commands may open our /proc/<pid>/fd
    agent.set_subreaper()
    signal.signal(signal.SIGPIPE, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(0))  # `docker stop`
    name_localhost()
    for directory in (workdir, home):
        prepare(directory, uid, gid)
    executor = Executor(uid, gid)
    try:
        executor.loop(time.monotonic() + lifetime)
    finally:
        executor.shutdown()


def main(args: "List[str]") -> None:
    if args[:1] == ["serve"] and len(args) == 6:
        serve(int(args[1]), int(args[2]), args[3], args[4], float(args[5]))
    else:
        sys.exit("usage: executor serve UID GID WORKDIR HOME LIFETIME")
