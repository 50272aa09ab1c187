"""The judge's Python runner: compile a program once, run each test case in a fork.

Run inside the sandbox, by the sandbox's own ``python3``, as ``python3 -c SOURCE PROGRAM``
(this file is sent, not imported; standard library only, Python 3.8 and later). Starting
an interpreter costs tens of milliseconds, most of a short test case; a fork of this one,
which has already started and compiled the program, costs about one. Each case then runs
as ``python3 PROGRAM`` would run it: ``__main__`` is a fresh module, ``sys.argv`` is
``[PROGRAM]``, the standard streams are the case's (as configured by the interpreter, never
used before), uncaught exceptions print their traceback and exit 1, ``SystemExit`` exits
as the interpreter does, and non-daemon threads, ``atexit`` functions and the flush of
the streams happen at the end.

Request, on stdin (read whole, with ``os.read``: ``sys.stdin`` is left untouched for the
cases): one JSON line ``{"parallel", "output_limit", "cases": [{"time_limit",
"memory_kb", "stdin": length}]}`` followed by the cases' stdin bytes, concatenated.

Answers, on stdout (written with ``os.write``), one per case as it ends, in the order
they end: a JSON line ``{"case", "status", "signal", "timed_out", "seconds",
"stdout": length, "stderr": length, "stdout_truncated", "stderr_truncated"}`` followed by
that many bytes of output; then ``{"end": true}``. The program's output is only ever
payload: it cannot end or forge an answer.

What a case cannot do: write to this process's stdout (a case's descriptors other than
its own three are closed before the program runs, and this process is not dumpable, so
``/proc/PPID/fd`` is closed to it), read the expected outputs (they never enter the
sandbox), or see its result altered (status from ``waitpid``, output from its own pipes).
It can kill this process (same user): the answers then stop short of ``end``, and the
host judges the cases without an answer on its own, one command each.
"""

from __future__ import annotations

import json
import os
import resource
import select
import signal
import sys
import time
import types

TYPE_CHECKING = False  # not typing's: nothing is imported that the runner does not use
if TYPE_CHECKING:
    from typing import Any, NoReturn

MAX_FD = 1 << 16
PR_SET_DUMPABLE = 4


def not_dumpable() -> None:
    import ctypes

    if ctypes.CDLL(None, use_errno=True).prctl(PR_SET_DUMPABLE, 0, 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_DUMPABLE, 0)")


def read_request() -> tuple[dict[str, Any], int]:
    """The request, and a memory file holding every case's stdin: kept out of this
    process's memory, which each fork inherits (and a memory limit counts)."""
    head = b""
    while b"\n" not in head:
        chunk = os.read(0, 1 << 16)
        if not chunk:
            raise SystemExit("the request ended early")
        head += chunk
    header, _, rest = head.partition(b"\n")
    request: dict[str, Any] = json.loads(header)
    inputs = os.memfd_create("inputs")
    while rest:
        write_all(inputs, rest)
        rest = os.read(0, 1 << 20)
    offset = 0
    for case in request["cases"]:
        case["stdin"], offset = (offset, case["stdin"]), offset + case["stdin"]
    return request, inputs


def case_stdin(inputs: int, offset: int, size: int) -> int:
    stdin = os.memfd_create("stdin")
    while size:
        chunk = os.pread(inputs, min(size, 1 << 20), offset)
        write_all(stdin, chunk)
        offset, size = offset + len(chunk), size - len(chunk)
    os.lseek(stdin, 0, os.SEEK_SET)
    return stdin


def write_all(fd: int, data: bytes | bytearray) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]


# -- a case, in its fork ----------------------------------------------------------------


def run_program(
    path: str, code: types.CodeType | None, error: BaseException | None, memory_kb: int | None
) -> NoReturn:
    """Become ``python3 PATH`` for one case."""
    status = 1
    try:
        if memory_kb is not None:
            try:
                limit = memory_kb * 1024
                resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
            except (OSError, ValueError) as exc:
                os.write(2, ("cannot limit memory: %s\n" % exc).encode())
                os._exit(125)
        main = types.ModuleType("__main__")
        main.__file__ = os.path.abspath(path)
        sys.modules["__main__"] = main
        sys.argv = [path]
        sys.path[0] = os.path.dirname(os.path.abspath(path))
        try:
            if error is not None:
                raise error
            exec(code, main.__dict__)  # type: ignore[arg-type] # code is None only with error
            status = 0
        except SystemExit as exc:
            status = exit_status(exc.code)
        except KeyboardInterrupt as exc:
            report_uncaught(exc)
            status = 128 + signal.SIGINT
        except BaseException as exc:  # noqa: BLE001 - what the interpreter does with it
            report_uncaught(exc)
            status = 1
        threading = sys.modules.get("threading")
        if threading is not None:
            threading._shutdown()  # as the interpreter does
        import atexit

        atexit._run_exitfuncs()
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except BaseException:  # noqa: BLE001 - as the interpreter: status 120
                status = 120
    finally:
        os._exit(status)


def report_uncaught(exc: BaseException) -> None:
    if exc.__traceback__ is not None:  # from the program's frame on, not ours
        exc.__traceback__ = exc.__traceback__.tb_next
    sys.excepthook(type(exc), exc, exc.__traceback__)


def exit_status(code: object) -> int:
    if code is None:
        return 0
    if isinstance(code, int):
        return code & 0xFF
    try:
        sys.stderr.write("%s\n" % (code,))
    except BaseException:  # noqa: BLE001, S110 - as the interpreter: the status is 1 anyway
        pass
    return 1


# -- the runner --------------------------------------------------------------------------


class Output:
    def __init__(self, name: str) -> None:
        self.name = name
        self.data = bytearray()
        self.truncated = False


class Case:
    def __init__(self, index: int, spec: dict[str, Any]) -> None:
        self.index = index
        self.spec = spec
        self.pid = 0
        self.started = self.deadline = self.ended = 0.0
        self.open: dict[int, Output] = {}  # its pipes not at their end yet
        self.outputs = {"stdout": Output("stdout"), "stderr": Output("stderr")}
        self.status: int | None = None
        self.timed_out = False

    def done(self) -> bool:
        return self.status is not None and not self.open


def start(
    case: Case, path: str, code: types.CodeType | None, error: BaseException | None, inputs: int
) -> None:
    stdin = case_stdin(inputs, *case.spec["stdin"])
    out_r, out_w = os.pipe()
    err_r, err_w = os.pipe()
    case.started = time.monotonic()
    pid = os.fork()
    if pid == 0:
        try:
            signal.set_wakeup_fd(-1)
            signal.signal(signal.SIGCHLD, signal.SIG_DFL)
            os.setsid()
            os.dup2(stdin, 0)
            os.dup2(out_w, 1)
            os.dup2(err_w, 2)
            os.closerange(3, MAX_FD)  # ours: the request, the other cases' pipes
        except BaseException:  # noqa: BLE001
            os._exit(125)
        run_program(path, code, error, case.spec["memory_kb"])
    for fd in (stdin, out_w, err_w):
        os.close(fd)
    for fd in (out_r, err_r):
        os.set_blocking(fd, False)
    case.pid = pid
    case.deadline = case.started + case.spec["time_limit"]
    case.open = {out_r: case.outputs["stdout"], err_r: case.outputs["stderr"]}


def kill(case: Case) -> None:
    for target in (-case.pid, case.pid):  # its process group (its session), then itself
        try:
            os.kill(target, signal.SIGKILL)
        except OSError:
            pass


def answer(case: Case) -> bytes:
    status, out, err = case.status, case.outputs["stdout"], case.outputs["stderr"]
    assert status is not None
    meta = {
        "case": case.index,
        "status": os.WEXITSTATUS(status) if os.WIFEXITED(status) else None,
        "signal": os.WTERMSIG(status) if os.WIFSIGNALED(status) else None,
        "timed_out": case.timed_out,
        "seconds": case.ended - case.started,
        "stdout": len(out.data),
        "stderr": len(err.data),
        "stdout_truncated": out.truncated,
        "stderr_truncated": err.truncated,
    }
    return json.dumps(meta).encode() + b"\n" + out.data + err.data


def main() -> None:
    not_dumpable()  # first: before anything of ours can be read through /proc
    path = sys.argv[1]
    request, inputs = read_request()
    with open(path, "rb") as file:
        source = file.read()
    code, error = None, None
    try:
        code = compile(source, os.path.abspath(path), "exec", dont_inherit=True)
    except (SyntaxError, ValueError) as exc:
        error = exc.with_traceback(None)  # raised in each case, as the interpreter would
    limit = request["output_limit"]
    wake_r, wake_w = os.pipe()
    os.set_blocking(wake_r, False)
    os.set_blocking(wake_w, False)
    signal.signal(signal.SIGCHLD, lambda signum, frame: None)
    signal.set_wakeup_fd(wake_w)
    pending = [Case(i, spec) for i, spec in enumerate(request["cases"])]
    pending.reverse()
    running: dict[int, Case] = {}  # by pid
    # Answers wait here until stdout takes them: a reader that falls behind must never
    # stop this loop from enforcing the other cases' time limits.
    outbox = bytearray()
    os.set_blocking(1, False)
    readers: dict[int, Case] = {}  # by the fd of one of its pipes
    while pending or running:
        while pending and len(running) < request["parallel"]:
            case = pending.pop()
            start(case, path, code, error, inputs)
            running[case.pid] = case
            readers.update((fd, case) for fd in case.open)
        timeout = max(0.0, min(c.deadline for c in running.values()) - time.monotonic())
        poller = select.poll()
        poller.register(wake_r, select.POLLIN)
        if outbox:
            poller.register(1, select.POLLOUT)
        for fd in readers:
            poller.register(fd, select.POLLIN)
        try:
            ready = poller.poll(timeout * 1000)
        except InterruptedError:
            ready = []
        for fd, _ in ready:
            if fd == 1:
                try:
                    del outbox[: os.write(1, outbox)]
                except BlockingIOError:
                    pass
                continue
            if fd == wake_r:
                try:
                    while os.read(wake_r, 512):
                        pass
                except BlockingIOError:
                    pass
                continue
            case = readers[fd]
            output = case.open[fd]
            try:
                chunk = os.read(fd, 1 << 16)
            except BlockingIOError:
                continue
            if chunk:
                room = limit - len(output.data)
                output.data += chunk[: max(room, 0)]
                if len(chunk) > room:
                    output.truncated = True
                    kill(case)  # its verdict is settled: output limit
                continue
            os.close(fd)
            del readers[fd], case.open[fd]
        while running:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                break
            if pid == 0:
                break
            if pid in running:
                case = running[pid]
                case.status, case.ended = status, time.monotonic()
                kill(case)  # what it left in its process group
        now = time.monotonic()
        for case in list(running.values()):
            if case.status is None and now >= case.deadline:
                case.timed_out = True
                kill(case)
            elif case.status is not None and case.open and now >= case.deadline:
                # Exited, but something it left in another session holds its output
                # open: what was written by its deadline is its output.
                for fd in list(case.open):
                    os.close(fd)
                    del readers[fd], case.open[fd]
            if case.done():
                del running[case.pid]
                outbox += answer(case)
    os.set_blocking(1, True)
    write_all(1, outbox + b'{"end": true}\n')


if __name__ == "__main__":
    main()
