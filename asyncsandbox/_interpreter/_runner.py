"""The code interpreter's runner: stateful Python contexts inside a sandbox.

Run inside the sandbox by its own ``python3``, as ``python3 -c RUNNER`` (this file and the
modules it uses are sent, not imported: see :data:`._engine.RUNNER`; standard library only,
Python 3.8 and later), as one long-running command of the sandbox, started on the first
``run_code``. Three kinds of processes:

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

import json
import os
import select
import signal
import sys
import time

TYPE_CHECKING = False  # not typing's: nothing is imported that the runner does not use
if TYPE_CHECKING:
    from typing import Any, NoReturn

    from asyncsandbox._interpreter import (
        _common as common,  # shipped before this file (see RUNNER)
        _kernel as kernel,  # shipped before this file (see RUNNER)
    )

# -- the supervisor ---------------------------------------------------------------------


class Context:
    def __init__(self, context_id: str, cwd: str) -> None:
        self.id = context_id
        self.cwd = cwd
        self.holder = 0
        self.kernel = 0
        self.fds: dict[str, int] = {}  # our ends: out, err, events, requests, status
        self.events = common.Frames(0)
        self.status = common.Frames(1 << 10)
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
        self.pending: tuple[str, Any, bytearray] | None = None  # output (see output())
        self.inbox = common.Frames(common.MAX_CODE)
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
        self.send_output()
        self.outbox += common.encode(header, payload)

    def send_output(self) -> None:
        """Send the output gathered since the last frame (see :meth:`output`)."""
        pending, self.pending = self.pending, None
        if pending is not None:
            kind, call, data = pending
            self.outbox += common.encode({"type": kind, "id": call}, bytes(data))

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
        ctx.events = common.Frames(common.RESULT_SLACK)
        ctx.status = common.Frames(1 << 10)
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
            common.kill(ctx.kernel)
        if ctx.holder:
            common.kill(ctx.holder)
        ctx.ended = True
        self.close_fds(ctx)

    def sweep(self) -> None:
        """Kill every child that is not a live holder: what a killed holder's subtree left
        (orphans come to us, the subreaper above the holders); reaped as they die."""
        live = set(self.holders)
        for pid in common.children():
            if pid not in live:
                common.kill(pid)

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
                data = common.read_some(fd)
                if not data:
                    break
                self.output(ctx, name, data)

    def output(self, ctx: Context, name: str, data: bytes) -> None:
        """Output of the context's call, gathered: what one stream of one call says in a
        row, within one round of the loop, goes to the host as one frame (sent before any
        other frame, and at the round's end). A flood of short writes, a frame per line
        from the kernel, costs the host a frame per round, not per line; nothing waits."""
        if ctx.call is None:
            return  # nobody's output (a call of its is not active)
        kind = "stdout" if name == "out" else "stderr"
        pending = self.pending
        if pending is not None and pending[0] == kind and pending[1] == ctx.call:
            pending[2].extend(data)
        else:
            self.send_output()
            self.pending = (kind, ctx.call, bytearray(data))

    # -- what the kernel says --

    def on_events(self, ctx: Context) -> None:
        data = common.read_some(ctx.fds["events"])
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
            if len(payload) > ctx.limit + common.RESULT_SLACK:
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
        data = common.read_some(ctx.fds["status"])
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
            name, value = common.describe(int(status))
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
            data = common.read_some(fd)
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
                        common.kill(running.kernel, signal.SIGINT)
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
            ctx.events.max_payload = ctx.limit + common.RESULT_SLACK
            message = {"call": request, "env": header.get("env") or {}, "limit": ctx.limit}
            ctx.run = common.encode(message, payload)
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
                "version": common.VERSION,
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
            reading = len(self.outbox) < common.HIGH_WATER
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
                    while common.read_some(self.wake_r):
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
                        self.pending = None
                elif ctx is None:
                    continue
                elif name == "requests":
                    self.flush_requests(ctx)
                elif name == "events":
                    self.on_events(ctx)
                elif name == "status":
                    self.on_status(ctx)
                else:
                    data = common.read_some(fd)
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
            self.send_output()  # the round's gathered output
        for each in self.contexts.values():
            self.kill_context(each)
        self.sweep()

    def on_host(self) -> None:
        data = common.read_some(0)
        if data is None:
            return
        if not data:  # the host is gone: so is everything here
            self.host_open = False
            self.outbox.clear()
            self.pending = None
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
    common.prctl(common.PR_SET_PDEATHSIG, signal.SIGKILL)
    if os.getppid() != supervisor:
        os._exit(1)
    common.prctl(common.PR_SET_CHILD_SUBREAPER, 1)
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
    kernel_pid = os.fork()
    if kernel_pid == 0:
        try:
            os.close(status)
            kernel.kernel_main(cwd, me, out, err, events, requests)
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
        if pid == kernel_pid:
            try:
                os.write(status, json.dumps({"exit": wait_status}).encode() + b"\n")
            except OSError:
                pass
            kernel_pid = -1
        if kernel_pid == -1:
            for child in common.children():  # what it left, until nothing is left
                common.kill(child)
    os._exit(0)


def main() -> None:
    # First: before anything of ours can be read through /proc.
    common.prctl(common.PR_SET_DUMPABLE, 0)
    common.prctl(common.PR_SET_CHILD_SUBREAPER, 1)
    # What a kernel needs, imported once here: a fork of this process starts with it.
    import ast  # noqa: F401
    import base64  # noqa: F401
    import linecache  # noqa: F401
    import threading  # noqa: F401
    import tokenize  # noqa: F401
    import traceback  # noqa: F401
    import types  # noqa: F401

    Supervisor().loop()
