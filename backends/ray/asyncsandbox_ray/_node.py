"""The per-node half: :class:`NodeAgent`, one async Ray actor per node, driving a local
asyncsandbox backend (``process`` by default) on that node.

It is a *named, detached* actor (``asyncsandbox-<node>-<kind>`` in the namespace
``asyncsandbox``), made on first use by whichever driver or task places a sandbox there
(``get_if_exists``, so concurrent owners share one). Detached because it is a node
service: many owners (drivers, Ray tasks of many jobs) share it, and it must outlive an
owner that crashes, to remove that owner's sandboxes (an owned actor dies with its owner
and leaves the sandboxes with nobody to sweep them). ``max_restarts=0``: a restarted
actor pinned to a dead node would hold calls pending forever; a dead one fails them at
once, which the driver reports as :class:`~asyncsandbox.SandboxDied`.

It lives exactly as long as its node: a thread watches the node's raylet through a pidfd
(readable the moment the raylet exits, reaped or not). When the raylet is gone the node
is gone, and so are its sandboxes: every call answers that they died, every command is
killed, the sandboxes are removed, and the process exits within ``EXIT_GRACE`` seconds.
Ray's own check does not suffice: it counts a raylet that nobody reaped (a zombie, under
an init that does not reap) as alive, and it kills the actor's children before the actor,
so a command could end as "its executor went away" instead of "its sandbox died".

Owners hold leases: every owner renews its lease on the nodes it uses; sandboxes whose
owner's lease ran out are removed by the actor's sweeper (``asyncsandbox gc`` for a
cluster). A command runs as a task of the actor and its output waits in a bounded buffer
until the driver polls it (long polls, at most ``POLL_WAIT`` seconds each); a command
nobody polled for ``ORPHAN_AFTER`` seconds is killed (its driver is gone).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import socket
import threading
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import anyio
import anyio.abc

from asyncsandbox import (
    CodeContext,
    InfrastructureError,
    InvalidArgument,
    Resources,
    SandboxDied,
    SandboxError,
    Timeouts,
    create_backend,
)
from asyncsandbox.abc import (
    Backend,
    CodeRequest,
    SandboxHandle,
    SandboxInterpreter,
    SandboxSpec,
)
from asyncsandbox.log import get_logger

from ._raylet import Raylet
from ._runs import EXCHANGED, Answer, DriverLink, Op, Run
from ._wire import WireError, error_to_wire

OWNER_LABEL = "asyncsandbox.ray.owner"
POLL_WAIT = 2.0
"""Longest a poll waits for output before answering empty (so a dead node is noticed)."""
LINGER = 0.2
"""After the first output arrives, how long a poll waits for the command to end (or for
``BATCH_BYTES`` of output) before answering: a short command's output comes just before
its exit, and answering with both saves a round trip (two calls per command became one:
see backends/ray/README.md). Output of a long command streams in batches at least this
often."""
ORPHAN_AFTER = 30.0
SWEEP_EVERY = 1.0
EXIT_GRACE = 5.0
"""Seconds an agent whose raylet exited spends removing its sandboxes before it exits.
Its commands die at once (killed first); removal is what takes time (each sandbox's
cgroup and files), and a node that is gone should not keep its disk. 5 s covers removing
a few hundred process sandboxes here; what is left after that stays on disk."""

log = get_logger("asyncsandbox.ray.node")


def _node_root(node: str) -> Path:
    """Where a node's process sandboxes live: one root per node, so that nodes sharing a
    machine (tests) never list each other's sandboxes. Traversable by the sandbox user."""
    if os.geteuid() == 0:
        base = Path("/var/lib/asyncsandbox")
    else:
        cache = os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache")
        base = Path(cache, "asyncsandbox")
    return base / f"ray-{node[:16]}"


def _remove_root(root: Path) -> None:
    shutil.rmtree(root, ignore_errors=True)
    if root.exists():
        log.warning("ray.node.root_left", root=str(root), why="it could not be removed whole")


class NodeAgent:
    """The Ray actor class (decorated in :mod:`._backend`). Methods return plain values;
    errors come back as ``("error", WireError)`` instead of raising."""

    def __init__(self, kind: str, options: dict[str, Any], lease_ttl: float) -> None:
        self._kind = kind
        self._options = dict(options)
        self._lease_ttl = lease_ttl
        self._backend: Backend | None = None
        self._lock = asyncio.Lock()
        self._handles: dict[str, SandboxHandle] = {}
        self._runs: dict[str, Run] = {}
        self._links: dict[str, DriverLink] = {}
        self._leases: dict[str, float] = {}
        self._killed: dict[str, float] = {}  # run ids killed before they started
        self._abandoned: dict[str, float] = {}  # create tokens the driver gave up on
        self._created: dict[str, tuple[str, float]] = {}  # create token -> (sandbox, when)
        self._started = time.time()
        self._sweeper: asyncio.Task[None] | None = None
        self._interpreters: dict[str, SandboxInterpreter] = {}  # by local id
        self._services: anyio.abc.TaskGroup | None = None
        self._serving: asyncio.Task[None] | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._root: Path | None = None  # the node's own root, made here (see _node_root)
        self._lost: str | None = None
        self._closed = threading.Event()
        self._losing: asyncio.Task[None] | None = None
        self._raylet = Raylet.of_this_worker()
        if self._raylet is not None:
            threading.Thread(
                target=self._watch_raylet, name="asyncsandbox-raylet-watch", daemon=True
            ).start()

    # -- the node's end ------------------------------------------------------------------

    def _watch_raylet(self) -> None:
        """(Its own thread.) Once the raylet exits: the node is gone; clean up on the
        event loop, and exit within ``EXIT_GRACE`` seconds whatever the loop does."""
        assert self._raylet is not None
        self._raylet.wait()
        loop = self._loop
        if loop is not None:  # else nothing was ever made here: nothing to clean up
            with contextlib.suppress(RuntimeError):  # the loop is closed: so are we
                loop.call_soon_threadsafe(self._start_losing)
                self._closed.wait(EXIT_GRACE)
        os._exit(0 if self._closed.is_set() else 1)

    def _start_losing(self) -> None:
        assert self._loop is not None
        self._losing = self._loop.create_task(self._lose_node())

    def _node_lost(self) -> str | None:
        """Why this node is gone (its raylet exited), or None while it is alive."""
        if self._lost is None and self._raylet is not None and self._raylet.gone():
            self._lost = f"its Ray node is gone (the raylet, pid {self._raylet.pid}, exited)"
        return self._lost

    async def _lose_node(self) -> None:
        """The node is gone: kill every command, remove every sandbox, close."""
        reason = self._node_lost()
        log.warning("ray.node.lost", reason=reason, sandboxes=len(self._handles))
        try:
            for run in list(self._runs.values()):
                if run.task is not None:
                    run.task.cancel()
            await asyncio.gather(
                *(run.task for run in self._runs.values() if run.task is not None),
                return_exceptions=True,
            )
            if self._sweeper is not None:
                self._sweeper.cancel()
            for local_id in list(self._interpreters):
                with contextlib.suppress(Exception):  # its sandbox goes next, whatever this did
                    await self._interpreters.pop(local_id).aclose()
            backend = self._backend
            if backend is not None:
                emptied = True
                for info in await backend.list(labels={}):
                    try:
                        await self._remove(info.id)
                    except SandboxError:
                        emptied = False
                # The node's own root goes with its last sandbox, before the backend's
                # close: the agent may not live that long (Ray ends a worker whose raylet
                # is gone, and EXIT_GRACE bounds us), and nothing can use the root now.
                if emptied and self._root is not None:
                    await anyio.to_thread.run_sync(_remove_root, self._root)
                await backend.aclose()
        finally:
            self._closed.set()

    def _died(self, local_id: str) -> WireError:
        return "died", {"id": local_id, "reason": self._lost or "its Ray node is gone"}

    def _error(self, exc: SandboxError, local_id: str) -> WireError:
        """``exc`` for the wire; an infrastructure failure on a node that is gone is the
        sandbox's death (Ray kills an actor's children when its raylet dies: a command
        then fails as "its executor went away" before the actor itself is killed)."""
        if (
            isinstance(exc, InfrastructureError)
            and not isinstance(exc, SandboxDied)
            and self._node_lost()
        ):
            return self._died(local_id)
        return error_to_wire(exc)

    # -- the local backend ---------------------------------------------------------------

    async def _open(self) -> Backend:
        if self._backend is not None:
            return self._backend
        async with self._lock:
            if self._backend is None:
                import ray

                self._loop = asyncio.get_running_loop()
                node = ray.get_runtime_context().get_node_id()
                options = dict(self._options)
                if self._kind == "process" and "root" not in options:
                    self._root = _node_root(node)
                    options["root"] = str(self._root)
                backend = create_backend(self._kind, options)
                await backend.__aenter__()
                self._backend = backend
                loop = asyncio.get_running_loop()
                self._sweeper = loop.create_task(self._sweep_forever())
                ready = asyncio.Event()
                self._serving = loop.create_task(self._serve(ready))
                await ready.wait()
            return self._backend

    async def _serve(self, ready: asyncio.Event) -> None:
        """Hold the task group the code interpreters' runners live in (an actor's method
        calls are tasks of their own: none outlives its call)."""
        async with anyio.create_task_group() as tg:
            self._services = tg
            ready.set()
            await anyio.sleep_forever()

    async def _handle(self, local_id: str) -> SandboxHandle:
        handle = self._handles.get(local_id)
        if handle is None:
            backend = await self._open()
            handle = self._handles[local_id] = await backend.attach(local_id)
        return handle

    # -- many calls in one round trip ---------------------------------------------------

    async def exchange(self, link_id: str, ops: list[Op]) -> list[Answer]:
        """Start the calls ``ops`` of the driver's link ``link_id``, and answer with every
        answer of that link ready so far, waiting up to ``POLL_WAIT`` for one while calls
        run. A newer exchange of the link takes the wait over: the older answers at once
        (with what is ready), so a driver always has a free exchange to send new calls
        with. Calls answered after their exchange went back wait for the next one.

        One Ray call carries the calls (and answers) of many sandboxes: under load each
        costs a fraction of a round trip (see backends/ray/README.md)."""
        link = self._links.get(link_id)
        if link is None:
            link = self._links[link_id] = DriverLink()
        link.seen = time.monotonic()
        loop = asyncio.get_running_loop()
        for number, method, args in ops:
            link.running += 1
            task = loop.create_task(self._op(link, number, method, args))
            task.add_done_callback(lambda _: None)
        link.turn += 1
        turn = link.turn
        link.notify()  # the older exchange answers now
        await asyncio.sleep(0)  # calls that answer at once go back with this exchange
        with anyio.move_on_after(POLL_WAIT):
            while not link.answers and link.running and link.turn == turn:
                await link.changed.wait()
        answers, link.answers = link.answers, []
        link.seen = time.monotonic()
        return answers

    async def _op(self, link: DriverLink, number: int, method: str, args: tuple[Any, ...]) -> None:
        try:
            if method not in EXCHANGED:
                raise InvalidArgument(f"no node call {method!r}")
            answer: Answer = (number, True, await getattr(self, method)(*args))
        except Exception as exc:  # noqa: BLE001 - the driver reports it (as Ray did)
            answer = (number, False, f"{type(exc).__name__}: {exc}")
        finally:
            link.running -= 1
        link.answers.append(answer)
        link.notify()

    # -- facts about the node (placement checks, tests) ---------------------------------

    async def where(self) -> dict[str, Any]:
        import ray

        return {
            "node_id": ray.get_runtime_context().get_node_id(),
            "pid": os.getpid(),
            "host": socket.gethostname(),
            "sandboxes": len(self._handles),
            "runs": len(self._runs),
            "raylet_pid": None if self._raylet is None else self._raylet.pid,
            "lost": self._node_lost(),
        }

    # -- leases and the sweeper ---------------------------------------------------------

    async def renew(self, owner: str, ttl: float) -> None:
        """The owner is alive; its sandboxes are kept for ``ttl`` more seconds."""
        self._leases[owner] = time.time() + ttl

    async def release(self, owner: str) -> None:
        """The owner closed: its lease ends now (its sandboxes were removed by it)."""
        self._leases[owner] = 0.0

    async def _sweep_forever(self) -> None:
        while True:
            await asyncio.sleep(SWEEP_EVERY)
            try:
                await self.reap_orphans()
                await self.sweep()
            except Exception:  # noqa: BLE001, S110 - the sweeper must outlive one failed round
                pass

    async def sweep(self) -> list[str]:
        """Remove sandboxes whose owner's lease ran out (owners this actor never heard
        of get one lease period from the actor's start: they may be renewing)."""
        backend = await self._open()
        now = time.time()
        removed = []
        for info in await backend.list(labels={}):
            owner = info.labels.get(OWNER_LABEL)
            if owner is None:
                continue
            if self._leases.get(owner, self._started + self._lease_ttl) < now:
                await self._remove(info.id)
                removed.append(info.id)
        return removed

    # -- lifecycle -----------------------------------------------------------------------

    async def create(self, token: str, owner: str, ttl: float, spec: dict[str, Any]) -> Any:
        """Renew ``owner``'s lease and create a sandbox (one round trip); ``token`` (the
        driver's) lets :meth:`abandon` undo it."""
        self._leases[owner] = time.time() + ttl
        if self._node_lost():
            return "error", ("unavailable", {"message": self._lost, "retryable": True})
        try:
            backend = await self._open()
            spec = dict(spec)
            spec["resources"] = Resources(**spec["resources"])
            handle = await backend.create(SandboxSpec(**spec))
        except SandboxError as exc:
            return "error", self._error(exc, "?")
        self._handles[handle.id] = handle
        if token in self._abandoned:  # the driver gave up while we were creating
            await self._remove(handle.id)
            return "error", ("died", {"id": handle.id, "reason": "create abandoned"})
        # Kept for ORPHAN_AFTER seconds (the sweeper forgets it): a driver cancelled just
        # as this answer was on its way still finds what to undo.
        self._created[token] = (handle.id, time.monotonic())
        return "ok", handle.id

    async def abandon(self, token: str) -> None:
        """The driver cancelled the create ``token``: remove what it made, now or later."""
        self._abandoned[token] = time.monotonic()
        created = self._created.pop(token, None)
        if created is not None:
            await self._remove(created[0])

    async def attach(self, local_id: str) -> Any:
        if self._node_lost():
            return "error", self._died(local_id)
        try:
            await self._handle(local_id)
        except SandboxError as exc:
            return "error", self._error(exc, local_id)
        return "ok", None

    async def list(self, labels: dict[str, str]) -> Any:
        if self._node_lost():
            return "error", ("unavailable", {"message": self._lost, "retryable": True})
        try:
            backend = await self._open()
            infos = await backend.list(labels=labels)
        except SandboxError as exc:
            return "error", self._error(exc, "?")
        return "ok", infos

    async def inspect(self, local_id: str) -> Any:
        return await self._call(local_id, "inspect")

    async def remove(self, local_id: str) -> Any:
        if self._node_lost():
            return "ok", None  # gone with its node (and removed by _lose_node)
        try:
            await self._remove(local_id)
        except SandboxError as exc:
            return "error", self._error(exc, local_id)
        return "ok", None

    async def _remove(self, local_id: str) -> None:
        interpreter = self._interpreters.pop(local_id, None)
        if interpreter is not None:  # its contexts end with it, before it is removed
            await interpreter.aclose()
        handle = self._handles.pop(local_id, None)
        if handle is None:
            backend = await self._open()
            try:
                handle = await backend.attach(local_id)
            except SandboxError:
                return  # gone already: removing is idempotent
        await handle.remove()

    # -- files ---------------------------------------------------------------------------

    async def _call(self, local_id: str, method: str, *args: Any, **kwargs: Any) -> Any:
        if self._node_lost():
            return "error", self._died(local_id)
        try:
            handle = await self._handle(local_id)
            return "ok", await getattr(handle, method)(*args, **kwargs)
        except SandboxError as exc:
            return "error", self._error(exc, local_id)

    async def read_file(self, local_id: str, path: str, max_bytes: int) -> Any:
        return await self._call(local_id, "read_file", path, max_bytes=max_bytes)

    async def write_file(self, local_id: str, path: str, data: bytes, mode: int) -> Any:
        return await self._call(local_id, "write_file", path, data, mode=mode)

    async def put_archive(self, local_id: str, path: str, data: bytes) -> Any:
        async def chunks() -> Any:
            yield data

        return await self._call(local_id, "put_archive", path, chunks())

    async def get_archive(self, local_id: str, path: str) -> Any:
        if self._node_lost():
            return "error", self._died(local_id)
        try:
            handle = await self._handle(local_id)
            out = bytearray()
            async with handle.get_archive(path) as stream:
                async for chunk in stream:
                    out += chunk
        except SandboxError as exc:
            return "error", self._error(exc, local_id)
        return "ok", bytes(out)

    # -- commands ------------------------------------------------------------------------

    async def exec_start(
        self,
        local_id: str,
        run_id: str,
        argv: tuple[str, ...],
        cwd: str,
        env: dict[str, str],
        stdin: bytes | None,
        timeout: float | None,
    ) -> Any:
        """Start a command; answer with its first poll (a short command's whole outcome,
        output and exit status, in one round trip)."""
        if (refused := self._refused(local_id, run_id)) is not None:
            return refused
        try:
            handle = await self._handle(local_id)
        except SandboxError as exc:
            return "error", self._error(exc, local_id)

        async def command(run: Run) -> None:
            run.status = await handle.exec(
                argv, cwd=cwd, env=env, stdin=stdin, on_output=run.output, timeout=timeout
            )

        self._start(run_id, local_id, command, cancelled="command killed on the node")
        return "ok", await self.exec_poll(run_id)

    def _refused(self, local_id: str, run_id: str) -> Any:
        """A start's answer when it cannot start (None when it can): the driver gave up
        before the call arrived, or the node is lost."""
        if run_id in self._killed:
            return "ok", ([], None, ("died", {"id": local_id, "reason": "cancelled"}))
        return ("error", self._died(local_id)) if self._node_lost() else None

    def _start(
        self,
        run_id: str,
        local_id: str,
        work: Callable[[Run], Awaitable[None]],
        *,
        cancelled: str,
    ) -> None:
        """Run ``work`` as ``run_id`` in a task of the node; its sandbox error, or its
        cancellation (``cancelled`` says why, unless the node is lost), is the run's."""
        run = self._runs[run_id] = Run()

        async def task() -> None:
            try:
                await work(run)
            except SandboxError as exc:
                run.error = self._error(exc, local_id)
            except asyncio.CancelledError:
                run.error = (
                    self._died(local_id)
                    if self._node_lost()
                    else ("died", {"id": local_id, "reason": cancelled})
                )
                raise
            finally:
                run.changed.set()
                run.answer.set()

        run.task = asyncio.get_running_loop().create_task(task())
        run.task.add_done_callback(lambda _: None)

    async def exec_poll(self, run_id: str) -> Any:
        """Output so far and, once the command ended, how: ``(chunks, status, error)``.
        Waits up to ``POLL_WAIT`` for something to report."""
        run = self._runs.get(run_id)
        if run is None:
            return [], None, ("died", {"id": "?", "reason": "the command is unknown on the node"})
        await self._wait(run)
        chunks = run.take()
        if not run.ended:
            if self._node_lost():  # its end is on its way (_lose_node kills it)
                return chunks, None, self._died("?")
            return chunks, None, None
        del self._runs[run_id]
        return chunks, run.status, run.error  # the ExitStatus itself, as list() sends infos

    async def exec_kill(self, run_id: str) -> None:
        """Kill the command's process tree (the local backend's cancellation) and wait."""
        run = self._runs.pop(run_id, None)
        if run is None or run.task is None:
            self._killed[run_id] = time.monotonic()  # the start may still be on its way
            return
        run.task.cancel()
        try:
            await run.task
        except asyncio.CancelledError:
            pass
        except Exception:  # noqa: BLE001, S110 - it ended some other way: it is gone all the same
            pass

    # -- the code interpreter: runs here, next to the sandbox -------------------------------

    async def _interpreter(self, local_id: str, workdir: str, env: dict[str, str]) -> Any:
        interpreter = self._interpreters.get(local_id)
        if interpreter is None:
            handle = await self._handle(local_id)
            backend = await self._open()
            if not backend.capabilities.interactive:
                raise InvalidArgument(f"the node's {self._kind!r} backend cannot run code")
            assert self._services is not None
            timeouts: Timeouts = backend.timeouts
            interpreter = self._interpreters[local_id] = SandboxInterpreter(
                handle,
                services=self._services,
                workdir=workdir,
                env=env,
                cleanup=timeouts.cleanup,
                start_timeout=timeouts.operation,
            )
        return interpreter

    async def code_start(
        self, local_id: str, run_id: str, request: CodeRequest, workdir: str, env: dict[str, str]
    ) -> Any:
        """Start a ``run_code`` call; answer with its first poll (a short call's whole
        execution, in one round trip), as :meth:`exec_start` does."""
        if (refused := self._refused(local_id, run_id)) is not None:
            return refused
        try:
            interpreter = await self._interpreter(local_id, workdir, env)
        except SandboxError as exc:
            return "error", self._error(exc, local_id)

        async def call(run: Run) -> None:
            run.execution = await interpreter.run_code(request, on_event=run.event)

        self._start(run_id, local_id, call, cancelled="the call was cancelled")
        return "ok", await self.code_poll(run_id)

    async def code_poll(self, run_id: str) -> Any:
        """Events so far and, once the call ended, its ``(events, execution, error)``."""
        run = self._runs.get(run_id)
        if run is None:
            return [], None, ("died", {"id": "?", "reason": "the call is unknown on the node"})
        await self._wait(run)
        events = run.take()
        if not run.ended:
            if self._node_lost():  # its end is on its way (_lose_node kills it)
                return events, None, self._died("?")
            return events, None, None
        del self._runs[run_id]
        return events, run.execution, run.error

    async def code_contexts(
        self, local_id: str, workdir: str, env: dict[str, str], op: str, *args: Any
    ) -> Any:
        """A context operation: ``create`` (cwd, language), ``list``, ``restart`` and
        ``remove`` (context id)."""
        if self._node_lost():
            return "error", self._died(local_id)
        try:
            interpreter = await self._interpreter(local_id, workdir, env)
            if op == "create":
                cwd, language = args
                context: CodeContext = await interpreter.create_code_context(
                    cwd=cwd, language=language
                )
                return "ok", context
            if op == "list":
                return "ok", await interpreter.list_code_contexts()
            if op == "restart":
                await interpreter.restart_code_context(args[0])
            elif op == "remove":
                await interpreter.remove_code_context(args[0])
            else:
                raise InvalidArgument(f"no context operation {op!r}")
        except SandboxError as exc:
            return "error", self._error(exc, local_id)
        return "ok", None

    async def _wait(self, run: Run) -> None:
        run.polled = time.monotonic()
        if not run.chunks and not run.ended:
            with anyio.move_on_after(POLL_WAIT):
                await run.changed.wait()
        if run.chunks and not run.answer.is_set():
            # Output, and the command still runs: give it a moment to end, so that a short
            # command's output and exit status go back in one answer.
            with anyio.move_on_after(LINGER):
                await run.answer.wait()

    async def reap_orphans(self) -> int:
        """Kill commands nobody polled for ``ORPHAN_AFTER`` seconds; forget old tokens."""
        now = time.monotonic()
        for table in (self._killed, self._abandoned):
            for key, when in list(table.items()):
                if now - when > ORPHAN_AFTER:
                    del table[key]
        for token, (_, when) in list(self._created.items()):
            if now - when > ORPHAN_AFTER:
                del self._created[token]
        for link_id, link in list(self._links.items()):
            if now - link.seen > ORPHAN_AFTER and not link.running:
                del self._links[link_id]  # its driver is gone: nobody takes its answers
        stale = [rid for rid, run in self._runs.items() if now - run.polled > ORPHAN_AFTER]
        for rid in stale:
            await self.exec_kill(rid)
        return len(stale)

    async def shutdown(self) -> None:
        """Stop commands and close the local backend (sandboxes stay; see ``sweep``)."""
        for rid in list(self._runs):
            await self.exec_kill(rid)
        for local_id in list(self._interpreters):
            await self._interpreters.pop(local_id).aclose()
        if self._serving is not None:
            self._serving.cancel()
        if self._sweeper is not None:
            self._sweeper.cancel()
        if self._backend is not None:
            await self._backend.aclose()
            self._backend = None
