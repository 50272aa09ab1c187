"""The code interpreter's runner: stateful Python contexts inside a sandbox.

Run inside the sandbox by its own ``python3``, as ``python3 -c SOURCE`` (this file is sent,
not imported; standard library only, Python 3.8 and later), as one long-running command of
the sandbox, started on the first ``run_code``. Three kinds of processes:

* The **supervisor** (this program's main process) talks to the host on its stdin and
  stdout. It never runs the user's code: it is not dumpable (nothing of it can be read or
  written through ``/proc``), single-threaded, and a child subreaper. It forks one holder
  per context and relays what the context's kernel says, reframed, to the host.
* A **holder** per context (a fork of the supervisor) forks the context's kernel, becomes
  the subreaper of everything the kernel starts (daemons and ``setsid`` included), reaps
  it, and when the kernel exits tells the supervisor how (its wait status, which the
  kernel cannot forge), kills whatever the kernel left behind, and exits.
* A **kernel** per context (a fork of the holder) runs the user's code in its main thread,
  in a namespace of its own that persists from one call to the next. What the code prints
  through ``sys.stdout``/``sys.stderr``, its results, errors and the end of each call go
  to the supervisor on an events pipe, in the order they happened; its descriptors 1 and
  2 (what subprocesses and C code write) are pipes of their own, which the supervisor
  reads before each event; requests come on another pipe.

Frames, both ways: ``>II`` (the header's length, the payload's length), a JSON header, the
payload bytes. Host to supervisor: ``{"op": "create", "id", "context", "cwd"}``,
``{"op": "run", "id", "context", "env", "limit"}`` with the code as payload,
``{"op": "interrupt", "id", "grace"}``, ``{"op": "restart", "id", "context"}``,
``{"op": "remove", "id", "context"}``. Supervisor to host: ``hello`` once, then
``created``/``failed``/``restarted``/``removed`` answers, and for a call (by its ``id``)
``stdout``/``stderr`` (the output as payload), ``result`` (a display bundle, JSON, as
payload, or ``dropped``: its size), ``error`` (JSON payload) and last ``done``
(``count``: the kernel's execution count; ``restarted``; ``fault``: why the kernel died or
was killed, if it was).

What the user's code cannot do: write to the supervisor's stdout (it holds no descriptor
of it, and the supervisor is not dumpable), make its output end a call or pass for a frame
(output is only ever payload, in frames the supervisor builds), speak for another context
(each kernel has pipes of its own), or hold a call open past its interrupt's grace (the
supervisor kills the kernel and everything it started, and forks a fresh one). What it
can do, as any code in the sandbox can: kill the supervisor (same user); the host then
sees its channel end, says so, and starts a new runner on the next call. Writing to its
own kernel's event pipe is the only forgery within reach, and it is no more than the code
can do by displaying values itself; what does not parse restarts the context.

Output a kernel writes while no call of its is active is dropped, and so are the
Python-level writes (``print``, ``sys.stdout``, ``display()``) of threads started during an
earlier call: late background output never lands in the next call.
"""

from __future__ import annotations

import errno
import json
import os
import select
import signal
import struct
import sys
import time

TYPE_CHECKING = False  # not typing's: nothing is imported that the runner does not use
if TYPE_CHECKING:
    from collections.abc import Callable
    from typing import Any, NoReturn

VERSION = 1
FRAME = struct.Struct(">II")
MAX_HEADER = 1 << 20
MAX_CODE = 64 << 20
HIGH_WATER = 1 << 20
"""Bytes waiting for the host beyond which kernels' output is no longer read (their
writes block: backpressure instead of memory)."""
RESULT_SLACK = 1 << 16
OUTPUT_CHUNK = 1 << 15
"""Largest frame of output a kernel sends (below RESULT_SLACK: one is always accepted)."""
CHUNK = 1 << 16
MAX_FD = 1 << 16
PR_SET_PDEATHSIG = 1
PR_SET_DUMPABLE = 4
PR_SET_CHILD_SUBREAPER = 36
TAG = "_asyncsandbox_call"  # the call a thread was started in


def prctl(option: int, value: int) -> None:
    import ctypes

    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(option, value, 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(%d)" % option)


def encode(header: dict[str, Any], payload: bytes = b"") -> bytes:
    head = json.dumps(header).encode()
    return FRAME.pack(len(head), len(payload)) + head + payload


class Frames:
    """Frames parsed from a byte stream as it comes (bounded: a header over MAX_HEADER
    or a payload over ``max_payload`` is an error)."""

    def __init__(self, max_payload: int) -> None:
        self.buffer = bytearray()
        self.max_payload = max_payload

    def feed(self, data: bytes) -> list[tuple[dict[str, Any], bytes]]:
        self.buffer += data
        frames = []
        while len(self.buffer) >= FRAME.size:
            head, size = FRAME.unpack_from(self.buffer)
            if head > MAX_HEADER or size > self.max_payload:
                raise ValueError("a frame of %d+%d bytes" % (head, size))
            end = FRAME.size + head + size
            if len(self.buffer) < end:
                break
            header = json.loads(bytes(self.buffer[FRAME.size : FRAME.size + head]))
            if not isinstance(header, dict):
                raise TypeError("a header that is not an object")
            frames.append((header, bytes(self.buffer[FRAME.size + head : end])))
            del self.buffer[:end]
        if len(self.buffer) > FRAME.size + MAX_HEADER + self.max_payload:
            raise ValueError("an unending frame")
        return frames


def read_some(fd: int) -> bytes | None:
    """What ``fd`` has now (``b""`` at its end), or None if nothing (non-blocking)."""
    try:
        return os.read(fd, CHUNK)
    except BlockingIOError:
        return None
    except OSError as exc:
        if exc.errno == errno.EIO:
            return b""
        raise


def children() -> list[int]:
    """This process's children (it is single-threaded)."""
    me = os.getpid()
    try:
        with open("/proc/self/task/%d/children" % me) as f:
            return [int(pid) for pid in f.read().split()]
    except OSError:
        pass
    found = []  # without CONFIG_PROC_CHILDREN: every process's parent, from /proc
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open("/proc/%s/stat" % name, "rb") as f:
                stat = f.read()
        except OSError:
            continue
        fields = stat[stat.rfind(b")") + 2 :].split()
        if len(fields) > 1 and int(fields[1]) == me:
            found.append(int(name))
    return found


def kill(pid: int, signum: int = signal.SIGKILL) -> None:
    try:
        os.kill(pid, signum)
    except OSError:
        pass


def describe(status: int) -> tuple[str, str]:
    """A dead kernel's wait status, as an error's name and value."""
    if os.WIFSIGNALED(status):
        signum = os.WTERMSIG(status)
        try:
            name = signal.Signals(signum).name
        except ValueError:
            name = "signal %d" % signum
        why = "killed by %s" % name
        if signum == signal.SIGKILL:
            why += " (out of memory, or killed from outside)"
        return "InterpreterDied", "the interpreter was %s; its state is lost" % why
    return (
        "InterpreterDied",
        "the interpreter exited with status %d; its state is lost" % os.WEXITSTATUS(status),
    )


# -- the supervisor ---------------------------------------------------------------------


class Context:
    def __init__(self, context_id: str, cwd: str) -> None:
        self.id = context_id
        self.cwd = cwd
        self.holder = 0
        self.kernel = 0
        self.fds: dict[str, int] = {}  # our ends: out, err, events, requests, status
        self.events = Frames(0)
        self.status = Frames(1 << 10)
        self.requests = bytearray()  # waiting for the kernel's request pipe
        self.ready = False
        self.waiting: tuple[str, Any] | None = None  # ("create"|"restart", request id)
        self.call: Any = None  # the active call's id
        self.limit = 0
        self.kill_at: float | None = None
        self.lost: tuple[str, str] | None = None  # why the previous kernel is gone
        self.ended = False  # its kernel exited (status in hand) or was killed
        self.broken = False  # its kernel could not start (a cwd gone): not respawned
        self.run: bytes = b""  # the active call's request, for a kernel forked after it came


class Supervisor:
    def __init__(self) -> None:
        self.contexts: dict[str, Context] = {}
        self.outbox = bytearray()
        self.inbox = Frames(MAX_CODE)
        self.holders: dict[int, Context] = {}
        self.wake_r, self.wake_w = os.pipe()
        self.host_open = True
        for fd in (self.wake_r, self.wake_w):
            os.set_blocking(fd, False)
            os.set_inheritable(fd, False)
        signal.signal(signal.SIGCHLD, lambda signum, frame: None)
        signal.set_wakeup_fd(self.wake_w)
        os.set_blocking(0, False)
        os.set_blocking(1, False)

    def send(self, header: dict[str, Any], payload: bytes = b"") -> None:
        self.outbox += encode(header, payload)

    # -- contexts --

    def spawn(self, ctx: Context) -> None:
        """Fork the context's holder, which forks its kernel."""
        out_r, out_w = os.pipe()
        err_r, err_w = os.pipe()
        ev_r, ev_w = os.pipe()
        req_r, req_w = os.pipe()
        st_r, st_w = os.pipe()
        ours = (out_r, err_r, ev_r, req_w, st_r)
        theirs = (out_w, err_w, ev_w, req_r, st_w)
        supervisor = os.getpid()
        pid = os.fork()
        if pid == 0:
            try:
                holder(ctx.cwd, supervisor, out_w, err_w, ev_w, req_r, st_w)
            finally:
                os._exit(1)
        for fd in theirs:
            os.close(fd)
        for fd in ours:
            os.set_blocking(fd, False)
            os.set_inheritable(fd, False)
        ctx.holder = pid
        ctx.kernel = 0
        ctx.fds = {"out": out_r, "err": err_r, "events": ev_r, "requests": req_w, "status": st_r}
        ctx.events = Frames(RESULT_SLACK)
        ctx.status = Frames(1 << 10)
        # A call that came while the previous kernel was dying goes to this one.
        ctx.requests = bytearray(ctx.run if ctx.call is not None else b"")
        ctx.ready = False
        ctx.ended = False
        ctx.broken = False
        ctx.kill_at = None
        self.holders[pid] = ctx

    def close_fds(self, ctx: Context) -> None:
        for fd in ctx.fds.values():
            try:
                os.close(fd)
            except OSError:
                pass
        ctx.fds = {}

    def kill_context(self, ctx: Context) -> None:
        """Kill the kernel, its holder and (through the sweep) all they left."""
        if ctx.kernel:
            kill(ctx.kernel)
        if ctx.holder:
            kill(ctx.holder)
        ctx.ended = True
        self.close_fds(ctx)

    def sweep(self) -> None:
        """Kill every child that is not a live holder: what a killed holder's subtree left
        (orphans come to us, the subreaper above the holders); reaped as they die."""
        live = set(self.holders)
        for pid in children():
            if pid not in live:
                kill(pid)

    def restart(self, ctx: Context, name: str, value: str) -> None:
        """Kill the context's kernel and start a fresh one; the active call (if any) ends
        with a fault saying why."""
        self.drain(ctx)
        self.kill_context(ctx)
        self.holders.pop(ctx.holder, None)
        self.sweep()
        if ctx.call is not None:
            self.finish(ctx, fault={"name": name, "value": value}, restarted=True)
        else:
            ctx.lost = (name, value)
        self.spawn(ctx)

    def finish(
        self, ctx: Context, count: Any = None, fault: Any = None, restarted: bool = False
    ) -> None:
        """End the active call: its remaining output first, then ``done``."""
        self.drain(ctx)
        if ctx.lost is not None:
            restarted = True
            ctx.lost = None
        self.send(
            {"type": "done", "id": ctx.call, "count": count, "restarted": restarted, "fault": fault}
        )
        ctx.call = None
        ctx.run = b""
        ctx.kill_at = None

    def drain(self, ctx: Context) -> None:
        """Forward what the kernel's stdout and stderr hold now (they are read before each
        of its events, so that output and results keep their order)."""
        for name in ("out", "err"):
            fd = ctx.fds.get(name)
            while fd is not None:
                data = read_some(fd)
                if not data:
                    break
                self.output(ctx, name, data)

    def output(self, ctx: Context, name: str, data: bytes) -> None:
        if ctx.call is not None:  # else: nobody's output (a call of its is not active)
            self.send({"type": "stdout" if name == "out" else "stderr", "id": ctx.call}, data)

    # -- what the kernel says --

    def on_events(self, ctx: Context) -> None:
        data = read_some(ctx.fds["events"])
        if data is None:
            return
        if not data:
            # Its end: the kernel is gone (its holder says how), or it closed the pipe
            # (then its call ends at its interrupt's grace, or it dies of the closed pipe).
            self.close_fd(ctx, "events")
            return
        try:
            frames = ctx.events.feed(data)
            for header, payload in frames:
                self.on_event(ctx, header, payload)
        except (ValueError, KeyError, TypeError) as exc:
            self.restart(
                ctx,
                "InterpreterRestarted",
                "the interpreter broke the runner's protocol (%s); it was restarted and its "
                "state is lost" % exc,
            )

    def on_event(self, ctx: Context, header: dict[str, Any], payload: bytes) -> None:
        kind = header["type"]
        if kind == "ready" and not ctx.ready:
            ctx.ready = True
            ctx.kernel = int(header["pid"])
            self.answer(ctx, None)
            return
        if kind == "failed" and not ctx.ready:
            ctx.broken = True
            self.answer(ctx, str(header["error"]))
            return
        if ctx.call is None or header.get("call") != ctx.call or not ctx.ready:
            raise ValueError("a %r message for no call of its" % kind)
        self.drain(ctx)
        if kind in ("stdout", "stderr"):
            self.output(ctx, "out" if kind == "stdout" else "err", payload)
        elif kind == "result":
            if len(payload) > ctx.limit + RESULT_SLACK:
                raise ValueError("a result over the limit")
            self.send({"type": "result", "id": ctx.call, "dropped": header.get("dropped")}, payload)
        elif kind == "error":
            self.send({"type": "error", "id": ctx.call}, payload)
        elif kind == "done":
            self.finish(ctx, count=int(header["count"]))
        else:
            raise ValueError("an unknown message %r" % kind)

    def answer(self, ctx: Context, failure: str | None) -> None:
        """The kernel started (``failure`` None) or could not: answer what waited for it."""
        waiting, ctx.waiting = ctx.waiting, None
        if failure is not None and ctx.call is not None:
            self.finish(ctx, fault={"name": "InterpreterDied", "value": failure}, restarted=True)
        if waiting is None:
            return
        op, request = waiting
        if failure is None:
            reply = {"type": {"create": "created", "restart": "restarted"}[op], "id": request}
            self.send(dict(reply, context=ctx.id, cwd=ctx.cwd))
            return
        self.send({"type": "failed", "id": request, "error": failure})
        if op == "create":
            self.kill_context(ctx)
            self.contexts.pop(ctx.id, None)

    def on_status(self, ctx: Context) -> None:
        """The holder says how the kernel ended (a JSON line: ``{"exit": status}``)."""
        data = read_some(ctx.fds["status"])
        if data is None:
            return
        if not data:
            self.close_fd(ctx, "status")
            return
        for line in data.split(b"\n"):
            if not line:
                continue
            status = json.loads(line).get("exit")
            if status is None or ctx.ended:
                continue
            self.on_events_remaining(ctx)
            ctx.ended = True
            name, value = describe(int(status))
            if not ctx.ready and not ctx.broken:
                self.answer(ctx, value)
            if ctx.call is not None:
                self.finish(ctx, fault={"name": name, "value": value}, restarted=True)
            else:
                ctx.lost = (name, value)

    def on_events_remaining(self, ctx: Context) -> None:
        """Take in what a dead kernel said before it died."""
        fd = ctx.fds.get("events")
        while fd is not None and ctx.fds.get("events") == fd:
            data = read_some(fd)
            if not data:
                break
            try:
                for header, payload in ctx.events.feed(data):
                    self.on_event(ctx, header, payload)
            except (ValueError, KeyError, TypeError):
                break

    def close_fd(self, ctx: Context, name: str) -> None:
        fd = ctx.fds.pop(name, None)
        if fd is not None:
            os.close(fd)

    def on_child(self) -> None:
        while True:
            try:
                pid, _ = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return
            if pid == 0:
                return
            ctx = self.holders.pop(pid, None)
            if ctx is None:
                self.sweep()  # a leftover died: its children came to us
                continue
            # A holder exits once its kernel is gone and reported (or it was killed: by
            # us, or by the code, which leaves its kernel to the sweep). Start afresh.
            if ctx.fds.get("status") is not None:
                self.on_status(ctx)
            if not ctx.ended:
                ctx.ended = True
                value = "the interpreter's holder process was killed; its state is lost"
                if not ctx.ready:
                    self.answer(ctx, value)
                if ctx.call is not None:
                    self.finish(
                        ctx, fault={"name": "InterpreterDied", "value": value}, restarted=True
                    )
                else:
                    ctx.lost = ("InterpreterDied", value)
            self.close_fds(ctx)
            self.sweep()
            if self.contexts.get(ctx.id) is ctx and (not ctx.broken or ctx.call is not None):
                self.spawn(ctx)  # the next call gets a fresh kernel (its id and cwd kept)

    # -- what the host says --

    def on_request(self, header: dict[str, Any], payload: bytes) -> None:
        op, request = header["op"], header["id"]
        if op == "create":
            context_id = str(header["context"])
            if context_id in self.contexts:
                self.send({"type": "failed", "id": request, "error": "the context exists"})
                return
            created = self.contexts[context_id] = Context(context_id, str(header["cwd"]))
            created.waiting = ("create", request)
            self.spawn(created)
            return
        if op == "interrupt":
            for running in self.contexts.values():
                if running.call == request and running.kill_at is None:
                    if running.kernel:
                        kill(running.kernel, signal.SIGINT)
                    running.kill_at = time.monotonic() + float(header["grace"])
            return
        ctx = self.contexts.get(str(header.get("context")))
        if ctx is None:
            self.send({"type": "failed", "id": request, "error": "no such context"})
            return
        if op == "run":
            if ctx.call is not None:
                self.send({"type": "failed", "id": request, "error": "the context is busy"})
                return
            ctx.call = request
            ctx.limit = int(header["limit"])
            ctx.events.max_payload = ctx.limit + RESULT_SLACK
            message = {"call": request, "env": header.get("env") or {}, "limit": ctx.limit}
            ctx.run = encode(message, payload)
            if ctx.broken and ctx.holder not in self.holders:
                self.spawn(ctx)  # try again: its answer ends the call if it fails again
            elif not ctx.ended:
                ctx.requests += ctx.run
                self.flush_requests(ctx)
        elif op == "restart":
            self.restart(ctx, "InterpreterRestarted", "the context was restarted")
            ctx.lost = None
            ctx.waiting = ("restart", request)
        elif op == "remove":
            if ctx.call is not None:
                self.finish(
                    ctx,
                    fault={"name": "InterpreterRestarted", "value": "the context was removed"},
                    restarted=True,
                )
            self.kill_context(ctx)
            self.holders.pop(ctx.holder, None)
            del self.contexts[ctx.id]
            self.sweep()
            self.send({"type": "removed", "id": request})
        else:
            raise ValueError("unknown op %r" % op)

    def flush_requests(self, ctx: Context) -> None:
        fd = ctx.fds.get("requests")
        if fd is None or not ctx.requests:
            return
        try:
            del ctx.requests[: os.write(fd, ctx.requests)]
        except BlockingIOError:
            pass
        except OSError:  # the kernel is gone: its status (or the holder's end) tells
            ctx.requests.clear()

    # -- the loop --

    def loop(self) -> None:
        self.send(
            {
                "type": "hello",
                "version": VERSION,
                "python": sys.version.split()[0],
                "pid": os.getpid(),
            }
        )
        while self.host_open or self.outbox:
            poller = select.poll()
            fds: dict[int, tuple[str, Context | None]] = {self.wake_r: ("wake", None)}
            poller.register(self.wake_r, select.POLLIN)
            if self.host_open:
                poller.register(0, select.POLLIN)
                fds[0] = ("from host", None)
            if self.outbox:
                poller.register(1, select.POLLOUT)
                fds[1] = ("to host", None)
            reading = len(self.outbox) < HIGH_WATER
            deadline: float | None = None
            for each in self.contexts.values():
                for name, fd in each.fds.items():
                    if name == "requests":
                        if each.requests:
                            poller.register(fd, select.POLLOUT)
                            fds[fd] = (name, each)
                    elif reading or name == "status":
                        poller.register(fd, select.POLLIN)
                        fds[fd] = (name, each)
                if each.kill_at is not None:
                    deadline = each.kill_at if deadline is None else min(deadline, each.kill_at)
            timeout = -1 if deadline is None else max(0, deadline - time.monotonic()) * 1000
            try:
                ready = poller.poll(timeout)
            except InterruptedError:
                ready = []
            for fd, _ in ready:
                name, ctx = fds[fd]
                if ctx is not None and ctx.fds.get(name) != fd:
                    continue  # closed by an earlier event of this round
                if name == "wake":
                    while read_some(self.wake_r):
                        pass
                    self.on_child()
                elif name == "from host":
                    self.on_host()
                elif name == "to host":
                    try:
                        del self.outbox[: os.write(1, self.outbox)]
                    except BlockingIOError:
                        pass
                    except OSError:  # the host is gone
                        self.host_open = False
                        self.outbox.clear()
                elif ctx is None:
                    continue
                elif name == "requests":
                    self.flush_requests(ctx)
                elif name == "events":
                    self.on_events(ctx)
                elif name == "status":
                    self.on_status(ctx)
                else:
                    data = read_some(fd)
                    if data == b"":
                        self.close_fd(ctx, name)
                    elif data:
                        self.output(ctx, name, data)
            now = time.monotonic()
            for each in list(self.contexts.values()):
                if each.kill_at is not None and now >= each.kill_at and each.call is not None:
                    if each.fds.get("events") is not None:
                        self.on_events(each)  # a done on its way wins
                    if each.call is not None and each.kill_at is not None:
                        self.restart(
                            each,
                            "InterpreterRestarted",
                            "the code did not stop on the interrupt: its interpreter was "
                            "killed and restarted; its state is lost",
                        )
        for each in self.contexts.values():
            self.kill_context(each)
        self.sweep()

    def on_host(self) -> None:
        data = read_some(0)
        if data is None:
            return
        if not data:  # the host is gone: so is everything here
            self.host_open = False
            self.outbox.clear()
            return
        for header, payload in self.inbox.feed(data):
            self.on_request(header, payload)


# -- the holder ---------------------------------------------------------------------------


def holder(
    cwd: str, supervisor: int, out: int, err: int, events: int, requests: int, status: int
) -> NoReturn:
    """Fork the kernel and be the subreaper of everything it starts (see the module
    docstring); report the kernel's end on ``status``, then kill what it left."""
    signal.set_wakeup_fd(-1)
    signal.signal(signal.SIGCHLD, signal.SIG_DFL)
    prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
    if os.getppid() != supervisor:
        os._exit(1)
    prctl(PR_SET_CHILD_SUBREAPER, 1)
    null = os.open(os.devnull, os.O_RDWR)
    os.dup2(null, 0)
    os.dup2(null, 1)  # the host's channel is the supervisor's alone
    keep = {2, out, err, events, requests, status}
    for entry in os.listdir("/proc/self/fd"):
        if int(entry) not in keep:
            try:
                os.close(int(entry))
            except OSError:
                pass
    me = os.getpid()
    kernel = os.fork()
    if kernel == 0:
        try:
            os.close(status)
            kernel_main(cwd, me, out, err, events, requests)
        finally:
            os._exit(1)
    for fd in (out, err, events, requests):
        os.close(fd)
    while True:
        try:
            pid, wait_status = os.waitpid(-1, 0)
        except ChildProcessError:
            break
        except InterruptedError:
            continue
        if pid == kernel:
            try:
                os.write(status, json.dumps({"exit": wait_status}).encode() + b"\n")
            except OSError:
                pass
            kernel = -1
        if kernel == -1:
            for child in children():  # what it left, until nothing is left
                kill(child)
    os._exit(0)


# -- the kernel ---------------------------------------------------------------------------


def kernel_main(
    cwd: str, holder_pid: int, out: int, err: int, events: int, requests: int
) -> NoReturn:
    os.setsid()
    prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
    if os.getppid() != holder_pid:
        os._exit(1)
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    os.dup2(out, 1)
    os.dup2(err, 2)
    for fd in (null, out, err):
        if fd > 2:
            os.close(fd)
    for fd in (events, requests):
        os.set_inheritable(fd, False)  # subprocesses of the code never hold them
    kernel = Kernel(events, requests)
    try:
        os.chdir(cwd)
    except OSError as exc:
        kernel.emit({"type": "failed", "error": "cannot start in %s: %s" % (cwd, exc.strerror)})
        os._exit(1)
    kernel.setup()
    kernel.emit({"type": "ready", "pid": os.getpid()})
    kernel.serve()
    os._exit(0)


class Stream:
    """``sys.stdout``/``sys.stderr`` of a kernel: text line-buffered, then sent on the
    events pipe (so that it keeps its order with the results displayed between), dropped
    when written by a thread of an earlier call (or between calls). Descriptors 1 and 2
    stay for what writes to them (subprocesses, C code)."""

    def __init__(self, kernel: Kernel, fd: int, name: str) -> None:
        import threading

        self.kernel = kernel
        self.fd = fd
        self.kind = name
        self.name = "<%s>" % name
        self.encoding = "utf-8"
        self.errors = "surrogateescape"
        self.parts: list[str] = []
        self.size = 0
        self.lock = threading.RLock()  # re-entered by a signal handler that prints
        self.buffer = RawStream(self)

    def write(self, text: str) -> int:
        if not isinstance(text, str):
            raise TypeError("write() argument must be str, not %s" % type(text).__name__)
        if not self.kernel.may_write():
            return len(text)
        with self.lock:
            self.parts.append(text)
            self.size += len(text)
            full = "\n" in text or self.size > 8192
        if full:
            self.flush()
        return len(text)

    def writelines(self, lines: Any) -> None:
        for line in lines:
            self.write(line)

    def flush(self) -> None:
        # The lock is held to take the text, not to send it: sending may block for as
        # long as the host reads nothing, and another thread's flush must not wait for it
        # (the main thread's, reporting an interrupt).
        with self.lock:
            if not self.parts:
                return
            text, self.parts, self.size = "".join(self.parts), [], 0
        try:
            data = text.encode("utf-8", "surrogateescape")
        except UnicodeEncodeError:
            data = text.encode("utf-8", "backslashreplace")
        self.kernel.emit_output(self.kind, data)

    def fileno(self) -> int:
        return self.fd

    def isatty(self) -> bool:
        return False

    def readable(self) -> bool:
        return False

    def writable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return False

    @property
    def closed(self) -> bool:
        return False

    def close(self) -> None:
        pass


class RawStream:
    """``sys.stdout.buffer``: bytes, after the text written before them."""

    def __init__(self, stream: Stream) -> None:
        self.stream = stream

    def write(self, data: Any) -> int:
        data = bytes(data)
        if self.stream.kernel.may_write():
            self.stream.flush()
            self.stream.kernel.emit_output(self.stream.kind, data)
        return len(data)

    def flush(self) -> None:
        self.stream.flush()

    def fileno(self) -> int:
        return self.stream.fd

    def isatty(self) -> bool:
        return False

    def writable(self) -> bool:
        return True


def write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]


PLAIN = (int, float, str, bool, complex, bytes)
REPR_METHODS = (
    ("_repr_html_", "text/html"),
    ("_repr_markdown_", "text/markdown"),
    ("_repr_svg_", "image/svg+xml"),
    ("_repr_png_", "image/png"),
    ("_repr_jpeg_", "image/jpeg"),
    ("_repr_pdf_", "application/pdf"),
    ("_repr_latex_", "text/latex"),
    ("_repr_json_", "application/json"),
    ("_repr_javascript_", "application/javascript"),
)
BINARY = ("image/png", "image/jpeg", "application/pdf")


class Kernel:
    def __init__(self, events: int, requests: int) -> None:
        import threading

        self.events = events
        self.requests = requests
        self.lock = threading.Lock()  # one frame at a time on the pipe
        self.threading = threading
        self.main = threading.main_thread()
        self.call: Any = None
        self.limit = 0
        self.count = 0
        self.interruptible = False
        self.pending = False
        self.formatter: Any = None
        self.loop: Any = None
        self.namespace: dict[str, Any] = {}
        self.stdout = Stream(self, 1, "stdout")
        self.stderr = Stream(self, 2, "stderr")

    # -- setup --

    def setup(self) -> None:
        import builtins
        import types

        signal.signal(signal.SIGINT, self.on_interrupt)
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        sys.stdout = self.stdout
        sys.stderr = self.stderr
        sys.argv = [""]
        main = types.ModuleType("__main__")
        main.__dict__["__builtins__"] = builtins
        sys.modules["__main__"] = main
        self.namespace = main.__dict__
        builtins.display = self.display  # type: ignore[attr-defined]
        setattr(builtins, SHELL, Shell(self))  # what `!cmd` lines call
        kernel = self
        start = self.threading.Thread.start

        def tagged_start(thread: Any) -> None:
            setattr(thread, TAG, kernel.tag())
            start(thread)

        setattr(self.threading.Thread, "start", tagged_start)  # noqa: B010
        sys.meta_path.insert(
            0,
            PostImport(
                {
                    "matplotlib.pyplot": self.patch_pyplot,
                    "IPython.display": self.patch_ipython,
                    "IPython.core.display_functions": self.patch_ipython,
                    "PIL.Image": self.patch_pil,
                }
            ),
        )

    def patch_pyplot(self, pyplot: Any) -> None:
        kernel = self

        def show(*args: Any, **kwargs: Any) -> None:
            kernel.show_figures()

        pyplot.show = show

    def patch_ipython(self, module: Any) -> None:
        if hasattr(module, "display"):
            module.display = self.display

    def patch_pil(self, module: Any) -> None:
        """As E2B's code interpreter: an image shown, or saved to a file name, is a result
        (``show()`` has no viewer to open here)."""
        kernel = self
        image = module.Image
        save = image.save

        def show_image(self: Any, *args: Any, **kwargs: Any) -> None:
            kernel.display(self)

        def save_image(self: Any, fp: Any, *args: Any, **kwargs: Any) -> Any:
            if isinstance(fp, (str, os.PathLike)):
                kernel.display(self)
            return save(self, fp, *args, **kwargs)

        image.show = show_image
        image.save = save_image

    # -- threads and interrupts --

    def tag(self) -> Any:
        thread = self.threading.current_thread()
        if thread is self.main:
            return self.call
        return getattr(thread, TAG, self.call)

    def may_write(self) -> bool:
        """Whether the calling thread's output belongs to the active call."""
        call = self.call
        if call is None:
            return False
        thread = self.threading.current_thread()
        return thread is self.main or getattr(thread, TAG, call) == call

    def on_interrupt(self, signum: int, frame: Any) -> None:
        if self.interruptible:
            raise KeyboardInterrupt
        self.pending = True

    def enter(self) -> None:
        """Back into the code's own time: an interrupt that came meanwhile takes effect."""
        self.interruptible = True
        if self.pending:
            self.pending = False
            raise KeyboardInterrupt

    # -- messages --

    def emit(self, header: dict[str, Any], payload: bytes = b"") -> None:
        with self.lock:
            self.send(header, payload)

    def emit_output(self, kind: str, data: bytes) -> None:
        """Output of the active call (``stdout`` or ``stderr``), in frames of at most
        OUTPUT_CHUNK bytes; none between calls. The pipe is taken for one frame at a time:
        another thread's frames may come between (its error, the call's end: the rest of
        this output is then dropped, as any output after its call)."""
        call = self.call
        for start in range(0, len(data), OUTPUT_CHUNK):
            with self.lock:
                if call is None or self.call != call:
                    return
                self.send({"type": kind, "call": call}, data[start : start + OUTPUT_CHUNK])

    def send(self, header: dict[str, Any], payload: bytes = b"") -> None:
        """Write one frame whole: an interrupt that comes meanwhile (the write may block
        for as long as the host reads nothing) waits for its end, then takes effect."""
        if self.threading.current_thread() is not self.main:
            # Only the main thread is interrupted (signal handlers run there): another
            # thread's write must leave its state alone, or an interrupt that comes during
            # it would be held back from the code until its next output.
            write_all(self.events, encode(header, payload))
            return
        interruptible, self.interruptible = self.interruptible, False
        try:
            write_all(self.events, encode(header, payload))
        finally:
            self.interruptible = interruptible
        if interruptible and self.pending:
            self.pending = False
            raise KeyboardInterrupt

    def read_request(self) -> tuple[dict[str, Any], bytes]:
        head = self.read_exactly(FRAME.size)
        size, payload = FRAME.unpack(head)
        header = json.loads(self.read_exactly(size))
        return header, self.read_exactly(payload)

    def read_exactly(self, size: int) -> bytes:
        data = bytearray()
        while len(data) < size:
            chunk = os.read(self.requests, size - len(data))
            if not chunk:
                os._exit(0)  # the supervisor is gone
            data += chunk
        return bytes(data)

    # -- calls --

    def serve(self) -> None:
        while True:
            header, code = self.read_request()
            self.pending = False
            self.call = header["call"]
            self.limit = int(header["limit"])
            env = header.get("env") or {}
            saved = {key: os.environ.get(key) for key in env}
            os.environ.update(env)
            try:
                self.run(code.decode("utf-8", "surrogateescape"))
            except KeyboardInterrupt:
                pass  # an interrupt that came after the code ended
            finally:
                for key, value in saved.items():
                    if value is None:
                        os.environ.pop(key, None)
                    else:
                        os.environ[key] = value
                self.interruptible = False
                for stream in (self.stdout, self.stderr):
                    try:
                        stream.flush()
                    except Exception:  # noqa: BLE001, S110 - a broken pipe: the call ends anyway
                        pass
                with self.lock:
                    self.send({"type": "done", "call": self.call, "count": self.count})
                    self.call = None

    def run(self, source: str) -> None:
        import linecache

        self.count += 1
        filename = "<cell-%d>" % self.count
        lines = source.splitlines(True)
        linecache.cache[filename] = (len(source), None, lines, filename)
        try:
            tree, parsed = self.parse(source, filename)
            body, last = self.split(tree, parsed)
        except (SyntaxError, ValueError, OverflowError, MemoryError, RecursionError) as exc:
            self.report(exc, compile_error=True)
            return
        try:
            try:
                self.enter()
                if body is not None:
                    self.execute(body, "exec")
                if last is not None:
                    value = self.execute(last, "eval")
                    if value is not None:
                        self.namespace["_"] = value
                        self.publish(value, main=True)
            except BaseException as exc:  # noqa: BLE001 - the code's own outcome: data
                self.interruptible = False
                self.report(exc)
            try:
                self.enter()
                self.show_figures()
            except BaseException as exc:  # noqa: BLE001
                self.interruptible = False
                self.report(exc)
        finally:
            self.interruptible = False

    def parse(self, source: str, filename: str) -> tuple[Any, str]:
        """The cell's tree, and the source it was parsed from: the cell itself, else (when
        it is not Python) the cell with its ``!cmd`` lines as calls; else the cell's own
        syntax error."""
        import ast

        try:
            return ast.parse(source, filename), source
        except SyntaxError as exc:
            error = exc
        shell = shell_lines(source)
        if shell is not None:
            try:
                return ast.parse(shell, filename), shell
            except SyntaxError:
                pass
        raise error

    def split(self, tree: Any, source: str) -> tuple[Any, Any]:
        """The cell's statements but the last expression, and that expression (``None``
        when the cell ends with another statement or with ``;``)."""
        import ast

        last = None
        if tree.body and isinstance(tree.body[-1], ast.Expr) and not self.quiet(source):
            last = ast.Expression(tree.body.pop().value)
        body = tree if tree.body else None
        return body, last

    @staticmethod
    def quiet(source: str) -> bool:
        """The cell ends with ``;`` (as in IPython: its value is not shown)."""
        import io
        import tokenize

        try:
            tokens = list(tokenize.generate_tokens(io.StringIO(source).readline))
        except (tokenize.TokenError, SyntaxError):
            return False
        skip = (tokenize.NEWLINE, tokenize.NL, tokenize.COMMENT, tokenize.ENDMARKER,
                tokenize.INDENT, tokenize.DEDENT)  # fmt: skip
        for token in reversed(tokens):
            if token.type not in skip:
                return token.type == tokenize.OP and token.string == ";"
        return False

    def execute(self, tree: Any, mode: str) -> Any:
        import ast

        flags = getattr(ast, "PyCF_ALLOW_TOP_LEVEL_AWAIT", 0)
        filename = "<cell-%d>" % self.count
        code = compile(tree, filename, mode, flags=flags, dont_inherit=True)
        if code.co_flags & 0x80:  # CO_COROUTINE: top-level await
            coroutine = eval(code, self.namespace)  # running code is our job
            return self.event_loop().run_until_complete(coroutine)
        if mode == "eval":
            return eval(code, self.namespace)
        exec(code, self.namespace)
        return None

    def event_loop(self) -> Any:
        if self.loop is None:
            import asyncio

            self.loop = asyncio.new_event_loop()
            asyncio.set_event_loop(self.loop)
        return self.loop

    def report(self, exc: BaseException, compile_error: bool = False) -> None:
        import traceback

        tb = exc.__traceback__
        while tb is not None and not tb.tb_frame.f_code.co_filename.startswith("<cell-"):
            tb = tb.tb_next  # from the code's first frame on, not ours
        ours = {
            getattr(function, "__func__", function).__code__
            for owner in (Kernel, Stream, RawStream, Shell)
            for function in vars(owner).values()
            if hasattr(getattr(function, "__func__", function), "__code__")
        }
        link = tb
        while link is not None:  # nor the runner's, where the code called it (print, display)
            while link.tb_next is not None and link.tb_next.tb_frame.f_code in ours:
                link.tb_next = link.tb_next.tb_next
            link = link.tb_next
        try:
            if compile_error:
                text = "".join(traceback.format_exception_only(type(exc), exc))
            else:
                text = "".join(traceback.format_exception(type(exc), exc, tb))
        except Exception:  # noqa: BLE001 - a broken __str__
            text = "%s: <unprintable>\n" % type(exc).__name__
        try:
            value = str(exc)
        except Exception:  # noqa: BLE001
            value = "<unprintable>"
        limit = max(self.limit // 2, 1024)
        if len(text) > limit:  # its end says most: where it was raised
            text = "...\n" + text[-limit:]
        error = {"name": type(exc).__name__, "value": value[:limit], "traceback": text}
        self.flush_streams()
        self.emit({"type": "error", "call": self.call}, json.dumps(error).encode())

    def flush_streams(self) -> None:
        for stream in (self.stdout, self.stderr):
            try:
                stream.flush()
            except Exception:  # noqa: BLE001, S110 - the result matters more
                pass

    # -- display --

    def display(self, *objects: Any, **kwargs: Any) -> None:
        """``display(obj, ...)``: show each object as a result now (not the main one)."""
        for obj in objects:
            if kwargs.get("raw") and isinstance(obj, dict):
                self.publish_bundle(obj, main=False)
            else:
                self.publish(obj, main=False)

    def publish(self, value: Any, main: bool) -> None:
        self.publish_bundle(self.bundle(value), main)

    def publish_bundle(self, bundle: dict[str, Any], main: bool) -> None:
        if not self.may_write():
            return
        try:
            payload = json.dumps({"data": bundle, "main": main}).encode()
        except (TypeError, ValueError) as exc:
            sys.stderr.write("display: a format is not JSON: %s\n" % exc)
            bundle = {"text/plain": bundle.get("text/plain", "")}
            payload = json.dumps({"data": bundle, "main": main}).encode()
        self.flush_streams()
        with self.lock:
            if not self.may_write():
                return
            if len(payload) > self.limit:
                self.send({"type": "result", "call": self.call, "dropped": len(payload)})
            else:
                self.send({"type": "result", "call": self.call}, payload)

    def bundle(self, obj: Any) -> dict[str, Any]:
        """The formats of ``obj``, by MIME type (binary ones base64-encoded), with its
        table as E2B's code interpreter gives it (``e2b/data``)."""
        data = self.formats(obj)
        if type(obj) not in PLAIN and not isinstance(obj, type):
            table = self.table(obj)
            if table is not None:
                data["e2b/data"] = table
        return data

    def table(self, obj: Any) -> Any:
        """A pandas DataFrame's columns (``{name: [values]}``, dates in ISO format), or
        what the object's ``_repr_e2b_data_`` gives (the two E2B's formatter knows)."""
        pandas = sys.modules.get("pandas")
        frame = getattr(pandas, "DataFrame", None)
        if frame is not None and isinstance(obj, frame):
            try:
                return {
                    str(name): json.loads(
                        obj.iloc[:, i].to_json(orient="values", date_format="iso")
                    )
                    for i, name in enumerate(obj.columns)
                }
            except Exception:  # noqa: BLE001 - a frame that will not convert: its other formats
                return None
        value = self.call_repr(obj, "_repr_e2b_data_")
        return value if isinstance(value, (dict, str)) else None

    def formats(self, obj: Any) -> dict[str, Any]:
        if type(obj) in PLAIN:
            return {"text/plain": repr(obj)}
        figure = self.figure_png(obj)
        if figure is not None:
            return figure
        formatter = self.ipython_formatter()
        if formatter is not None:
            try:
                formats, _ = formatter.format(obj)
                return {mime: self.encoded(mime, value) for mime, value in formats.items()}
            except Exception:  # noqa: BLE001, S110 - fall back to our own formatting
                pass
        data: dict[str, Any] = {}
        if not isinstance(obj, type):  # a class's _repr_*_ are unbound methods
            bundle = self.call_repr(obj, "_repr_mimebundle_")
            if isinstance(bundle, tuple):
                bundle = bundle[0]
            if isinstance(bundle, dict):
                data.update((m, self.encoded(m, v)) for m, v in bundle.items())
            for method, mime in REPR_METHODS:
                if mime in data:
                    continue
                value = self.call_repr(obj, method)
                if isinstance(value, tuple):
                    value = value[0]
                if value is not None:
                    data[mime] = self.encoded(mime, value)
        if "text/plain" not in data:
            data["text/plain"] = repr(obj)
        return data

    def call_repr(self, obj: Any, method: str) -> Any:
        try:
            function = getattr(obj, method, None)
        except Exception:  # noqa: BLE001 - a broken __getattr__
            return None
        if not callable(function):
            return None
        try:
            return function()
        except Exception:  # noqa: BLE001 - as IPython: warn, and skip that format
            import traceback

            sys.stderr.write(
                "%s of %s failed:\n%s" % (method, type(obj).__name__, traceback.format_exc())
            )
            return None

    @staticmethod
    def encoded(mime: str, value: Any) -> Any:
        if mime in BINARY and isinstance(value, (bytes, bytearray)):
            import base64

            return base64.b64encode(bytes(value)).decode("ascii")
        if isinstance(value, bytes):
            return value.decode("utf-8", "replace")
        return value

    def ipython_formatter(self) -> Any:
        """IPython's display formatter when IPython is importable (imported on first use)."""
        if self.formatter is None:
            self.formatter = False
            try:
                import importlib.util

                if importlib.util.find_spec("IPython") is not None:
                    from IPython.core.formatters import DisplayFormatter

                    self.formatter = DisplayFormatter()
            except Exception:  # noqa: BLE001 - a broken IPython: our own formatting
                self.formatter = False
        return self.formatter or None

    def figure_png(self, obj: Any) -> dict[str, Any] | None:
        figure_type = getattr(sys.modules.get("matplotlib.figure"), "Figure", None)
        if figure_type is None or not isinstance(obj, figure_type):
            return None
        bundle = self.render(obj)
        pyplot = sys.modules.get("matplotlib.pyplot")
        if pyplot is not None:
            pyplot.close(obj)  # shown: not again at the end of the cell
        return bundle

    @staticmethod
    def render(figure: Any) -> dict[str, Any]:
        import base64
        import io

        buffer = io.BytesIO()
        figure.savefig(buffer, format="png", bbox_inches="tight")  # drawn: tick labels set
        bundle: dict[str, Any] = {
            "text/plain": repr(figure),
            "image/png": base64.b64encode(buffer.getvalue()).decode("ascii"),
        }
        try:
            chart = figure_chart(figure)
            size = len(json.dumps(chart))
        except Exception:  # noqa: BLE001 - a figure we cannot read: its image only
            chart, size = None, 0
        if chart and size <= MAX_CHART:  # a bigger one would cost the image its room
            bundle["e2b/chart"] = chart
        return bundle

    def show_figures(self) -> None:
        """Every open matplotlib figure, as a PNG result, then closed (as a notebook's
        inline backend does at ``plt.show()`` and at the end of a cell)."""
        pyplot = sys.modules.get("matplotlib.pyplot")
        if pyplot is None:
            return
        helpers = sys.modules.get("matplotlib._pylab_helpers")
        managers = helpers.Gcf.get_all_fig_managers() if helpers is not None else []
        try:
            for manager in managers:
                self.publish_bundle(self.render(manager.canvas.figure), main=False)
        finally:
            pyplot.close("all")


def figure_chart(figure: Any) -> dict[str, Any] | None:
    """A matplotlib figure's data in E2B's chart format (``e2b/chart``): per axes a
    ``line``, ``scatter``, ``bar``, ``pie`` or ``box_and_whisker`` chart (else ``unknown``,
    without elements), several axes as a ``superchart``; ``None`` for a blank figure."""
    axes = figure.get_axes()
    if not any(ax.has_data() for ax in axes):
        return None
    if len(axes) == 1:
        return axes_chart(axes[0])
    get_suptitle = getattr(figure, "get_suptitle", None)  # matplotlib 3.8 and later
    if get_suptitle is not None:
        title = get_suptitle()
    else:
        suptitle = figure._suptitle  # matplotlib before 3.8: no public accessor
        title = suptitle.get_text() if suptitle is not None else ""
    return {
        "type": "superchart",
        "title": title or None,
        "elements": [axes_chart(ax) for ax in axes],
    }


def axes_chart(ax: Any) -> dict[str, Any]:
    Line2D = matplotlib("lines").Line2D
    PathCollection = matplotlib("collections").PathCollection
    patches = matplotlib("patches")
    PathPatch, Rectangle, Wedge = patches.PathPatch, patches.Rectangle, patches.Wedge

    drawn = [*ax.lines, *ax.collections, *ax.patches, *ax.images, *ax.tables, *ax.artists]
    if all(isinstance(a, Line2D) for a in drawn):
        kind = "line"
    elif all(isinstance(a, (PathPatch, Line2D)) for a in drawn):
        kind = "box_and_whisker"
    else:
        rest = [a for a in drawn if not (isinstance(a, Line2D) and straight(a))]
        kind = "unknown"
        for name, types in (("scatter", PathCollection), ("pie", Wedge), ("bar", Rectangle)):
            if rest and all(isinstance(a, types) for a in rest):
                kind = name
                break
    chart: dict[str, Any] = {"type": kind, "title": ax.get_title() or None, "elements": []}
    if kind in ("unknown", "pie"):
        if kind == "pie":
            chart["elements"] = [
                {"label": w.get_label(), "angle": rounded(abs(w.theta2 - w.theta1)), "radius": w.r}
                for w in ax.patches
            ]
        return chart
    for axis in ("x", "y"):
        label = getattr(ax, "get_%slabel" % axis)() or None
        chart["%s_label" % axis] = label
        chart["%s_unit" % axis] = unit(label)
    if kind in ("line", "scatter"):
        for axis in ("x", "y"):
            chart.update(scale(ax, axis))
        if kind == "line":
            lines = [line for line in ax.get_lines() if not straight(line)]
            chart["elements"] = [
                {"label": line_label(line.get_label()),
                 "points": [[point(x), point(y)] for x, y in zip(line.get_xdata(), line.get_ydata())]}  # noqa: B905
                for line in lines
            ]  # fmt: skip
        else:
            chart["elements"] = [
                {"label": c.get_label(), "points": [[float(x), float(y)] for x, y in c.get_offsets()]}
                for c in ax.collections
            ]  # fmt: skip
    elif kind == "bar":
        chart["elements"] = bars(ax, chart)
    else:
        chart["elements"] = boxes(ax, chart)
    return chart


def matplotlib(name: str) -> Any:
    """A module of matplotlib (imported: the code drew a figure with it)."""
    import importlib

    return importlib.import_module("matplotlib." + name)


def straight(line: Any) -> bool:
    """An axis-parallel segment of two points (``axhline``, ``axvline``): no data."""
    xs, ys = line.get_xdata(), line.get_ydata()
    return len(xs) == 2 and len(ys) == 2 and (xs[0] == xs[1] or ys[0] == ys[1])


def unit(label: str | None) -> str | None:
    import re

    match = re.search(r" \(([^)]*)\)|\[([^\]]*)\]", label or "")
    return (match.group(1) or match.group(2)) if match else None


def rounded(value: Any) -> float:
    """A drawn value without what float arithmetic added to it: as many significant
    digits as E2B keeps (8 less the value's decimal exponent, at least 1)."""
    import math

    number = float(value)
    if number == 0 or not math.isfinite(number):
        return number
    digits = max(1, 8 - math.floor(math.log10(abs(number))))
    return float("%.*g" % (digits, number))


def point(value: Any) -> Any:
    import datetime

    if isinstance(value, (datetime.date, datetime.datetime)):
        return value.isoformat()
    if type(value).__name__ == "datetime64":
        return str(value.astype("datetime64[s]"))
    return value.item() if hasattr(value, "item") else value


def line_label(label: str) -> str:
    return "Line %s" % label[6:] if label.startswith("_child") else label


def scale(ax: Any, axis: str) -> dict[str, Any]:
    """An axis's ticks (dates in ISO format), their labels and its scale (``linear``,
    ``datetime``, ``categorical`` or matplotlib's name: ``log``, ...)."""
    category, mdates = matplotlib("category"), matplotlib("dates")
    which = getattr(ax, axis + "axis")
    formatter = which.get_major_formatter()
    ticks = list(getattr(ax, "get_%sticks" % axis)())
    labels = [t.get_text() for t in getattr(ax, "get_%sticklabels" % axis)()]
    dates = (mdates.AutoDateFormatter, mdates.ConciseDateFormatter, mdates.DateFormatter)
    if isinstance(formatter, dates):
        kind = "datetime"
        ticks = [mdates.num2date(t).isoformat() for t in ticks]
    else:
        kind = getattr(ax, "get_%sscale" % axis)()
        if kind == "linear" and isinstance(formatter, category.StrCategoryFormatter):
            kind = "categorical"
        ticks = [float(t) for t in ticks]
    return {axis + "_ticks": ticks, axis + "_tick_labels": labels, axis + "_scale": kind}


def bars(ax: Any, chart: dict[str, Any]) -> list[dict[str, Any]]:
    """One element per bar: its group (the container's label), its category (the tick
    label at its place, else its place) and its value."""
    found = []
    for number, container in enumerate(ax.containers):
        group = container.get_label()
        if group.startswith("_container"):
            group = "Group %s" % group[10:]
        horizontal = getattr(container, "orientation", None) == "horizontal"
        axis = "y" if horizontal else "x"
        ticks = getattr(ax, "get_%sticks" % axis)()
        tick_labels = getattr(ax, "get_%sticklabels" % axis)()
        names = {rounded(t): label.get_text() for t, label in zip(ticks, tick_labels)}  # noqa: B905 - Python 3.8
        values = getattr(container, "datavalues", None)
        for i, bar in enumerate(container):
            x, y, width, height = bar.get_x(), bar.get_y(), bar.get_width(), bar.get_height()
            where = rounded(y + height / 2 if horizontal else x + width / 2)
            value = values[i] if values is not None else (width if horizontal else height)
            found.append({"label": names.get(where) or str(where), "group": group,
                          "value": float(value)})  # fmt: skip
        if horizontal and number == 0:  # the categories are on y: E2B's x is theirs
            swap_axes(chart)
    return found


def swap_axes(chart: dict[str, Any]) -> None:
    chart["x_label"], chart["y_label"] = chart["y_label"], chart["x_label"]
    chart["x_unit"], chart["y_unit"] = chart["y_unit"], chart["x_unit"]


def boxes(ax: Any, chart: dict[str, Any]) -> list[dict[str, Any]]:
    """From what ``boxplot(patch_artist=True)`` drew: each box (quartiles), the segments
    beside it (whiskers: min and max), across it (median) and its markers (outliers)."""
    spans = []
    for patch in ax.patches:
        vertices = patch.get_path().vertices
        spans.append((min(vertices[:, 0]), max(vertices[:, 0]),
                      min(vertices[:, 1]), max(vertices[:, 1])))  # fmt: skip
    widths = {rounded(x1 - x0) for x0, x1, _, _ in spans}
    vertical = len(widths) == 1
    if not vertical:  # horizontal boxes: read them with the axes swapped
        spans = [(y0, y1, x0, x1) for x0, x1, y0, y1 in spans]
        swap_axes(chart)
    labels = [t.get_text() for t in (ax.get_xticklabels() if vertical else ax.get_yticklabels())]
    found = []
    for i, (left, right, q1, q3) in enumerate(spans):
        slack = (right - left) * 1e-9
        x0, x1 = left - slack, right + slack
        outliers: list[float] = []
        box: dict[str, Any] = {"label": labels[i] if i < len(labels) else str(i + 1),
               "min": rounded(q1), "first_quartile": rounded(q1), "median": rounded(q1),
               "third_quartile": rounded(q3), "max": rounded(q3), "outliers": outliers}  # fmt: skip
        for line in ax.lines:
            xs, ys = line.get_xdata(), line.get_ydata()
            if not vertical:
                xs, ys = ys, xs
            if len(xs) == 0 or not all(x0 <= x <= x1 for x in xs):
                continue
            if line.get_linestyle() in ("None", "none", " ", ""):  # markers: outliers
                outliers.extend(rounded(y) for y in ys)
            elif len(ys) == 2 and ys[0] == ys[1] and q1 < ys[0] < q3:
                box["median"] = rounded(ys[0])
            elif len(xs) == 2 and xs[0] == xs[1]:  # a whisker, from the box outwards
                if max(ys) <= q1:
                    box["min"] = rounded(min(ys))
                elif min(ys) >= q3:
                    box["max"] = rounded(max(ys))
        found.append(box)
    return found


MAX_CHART = 1 << 20
"""Largest chart (JSON bytes) a figure's result carries (past it: the image alone)."""
SHELL = "__asyncsandbox_shell__"
SHELL_LINE = (
    r"^([ \t]*)(?:([A-Za-z_][\w.]*(?:[ \t]*,[ \t]*[A-Za-z_][\w.]*)*)[ \t]*=[ \t]*)?"
    r"!(!?)(.*?)(\r?\n)?$"
)


def shell_lines(source: str) -> str | None:
    """The cell with each IPython shell line as a call of the kernel's :class:`Shell`
    (``!cmd``: run it; ``x = !cmd`` and ``!!cmd``: its output's lines), one line for one
    (the traceback's line numbers stay); ``None`` when it has none."""
    import re

    pattern = re.compile(SHELL_LINE)
    lines = source.splitlines(True)
    changed = False
    for i, line in enumerate(lines):
        match = pattern.match(line)
        if match is None or not match.group(4).strip():
            continue
        indent, target, output, command, end = match.groups()
        call = "%s.%s(%r)" % (SHELL, "getoutput" if target or output else "system", command)
        lines[i] = indent + ("%s = %s" % (target, call) if target else call) + (end or "")
        changed = True
    return "".join(lines) if changed else None


class Shell:
    """IPython's shell lines: the command runs in ``/bin/bash`` (else ``/bin/sh``) in the
    context's directory, its stdout and stderr merged (as IPython's), after ``{expr}`` and
    ``$name`` are expanded from the code's namespace (the command as written when one
    does not expand, as IPython's ``var_expand``). An interrupt kills its process group."""

    def __init__(self, kernel: Kernel) -> None:
        self.kernel = kernel

    def system(self, command: str) -> None:
        """``!cmd``: its output is the cell's; its status is ``_exit_code``."""
        self.kernel.namespace["_exit_code"] = self.run(command, None)

    def getoutput(self, command: str) -> list[str]:
        """``x = !cmd``: its output's lines."""
        sink: list[str] = []
        self.run(command, sink)
        return "".join(sink).splitlines()

    def expand(self, command: str) -> str:
        import re

        namespace = self.kernel.namespace

        def one(match: Any) -> str:
            if match.group(0) == "$$":
                return "$"
            if match.group(1) is not None:
                return str(namespace[match.group(1)])
            return str(eval(match.group(2), namespace))  # as IPython's: the code's own

        try:
            return re.sub(r"\$\$|\$([A-Za-z_]\w*)|\{([^{}]+)\}", one, command)
        except Exception:  # noqa: BLE001 - as IPython: the command as written
            return command

    def run(self, command: str, sink: list[str] | None) -> int:
        import codecs
        import subprocess

        shell = "/bin/bash" if os.path.exists("/bin/bash") else "/bin/sh"
        self.kernel.flush_streams()
        process = subprocess.Popen(
            [shell, "-c", self.expand(command)],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        decoder = codecs.getincrementaldecoder("utf-8")("replace")
        assert process.stdout is not None
        try:
            while True:
                data = os.read(process.stdout.fileno(), CHUNK)
                text = decoder.decode(data, final=not data)
                if sink is not None:
                    sink.append(text)
                elif text:
                    sys.stdout.write(text)
                    sys.stdout.flush()
                if not data:
                    return process.wait()
        except BaseException:
            kill(-process.pid)  # interrupted: the command's whole group goes
            process.wait()
            raise
        finally:
            process.stdout.close()


class PostImport:
    """Runs a hook on a module right after it is first imported (so that the code's own
    ``plt.show`` and ``IPython.display.display`` are ours)."""

    def __init__(self, hooks: dict[str, Callable[[Any], None]]) -> None:
        self.hooks = hooks

    def find_spec(self, name: str, path: Any = None, target: Any = None) -> Any:
        hook = self.hooks.get(name)
        if hook is None:
            return None
        for finder in sys.meta_path:
            find = getattr(finder, "find_spec", None)
            if finder is self or find is None:
                continue
            spec = find(name, path, target)
            if spec is not None:
                break
        else:
            return None
        loader = spec.loader
        execute = getattr(loader, "exec_module", None)
        if execute is None:
            return spec

        def exec_module(module: Any) -> None:
            execute(module)
            try:
                hook(module)
            except Exception:  # noqa: BLE001, S110 - the module works without our hook
                pass

        loader.exec_module = exec_module
        return spec


def main() -> None:
    prctl(PR_SET_DUMPABLE, 0)  # first: before anything of ours can be read through /proc
    prctl(PR_SET_CHILD_SUBREAPER, 1)
    # What a kernel needs, imported once here: a fork of this process starts with it.
    import ast  # noqa: F401
    import base64  # noqa: F401
    import linecache  # noqa: F401
    import threading  # noqa: F401
    import tokenize  # noqa: F401
    import traceback  # noqa: F401
    import types  # noqa: F401

    Supervisor().loop()


if __name__ == "__main__":
    main()
