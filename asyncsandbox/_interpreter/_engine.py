"""The host side of the code interpreter: one runner per sandbox, over the handle's
:meth:`~asyncsandbox.abc.SandboxHandle.interact`, and the contexts in it.

The runner (:mod:`._runner` and its modules, sent as ``python3 -c RUNNER``) starts on the
sandbox's first ``run_code`` as one long-running command, and serves every context of the
sandbox until the sandbox stops (or the runner dies: the next call starts a new one, and
the contexts it had come back fresh, saying so). A task of the runtime's holds the runner's
process open and reads its frames, routing each to the call (or request) it answers by its
id; calls write their requests through one lock, each frame whole (shielded: half a frame
would corrupt the channel for every context).

A call's timeout is enforced here: past it the call's kernel is interrupted (SIGINT, as a
notebook interrupts a cell); the runner kills and restarts a kernel that does not stop
within :data:`INTERRUPT_GRACE`, and a runner that does not answer even then is killed
(every context is lost). Cancelling a call does the same before the cancellation goes on;
a context that lost its state meanwhile says so in its next call's execution (the
cancelled call's, which says it first, is never returned).
"""

from __future__ import annotations

import itertools
import json
import math
import struct
import uuid
from collections.abc import AsyncIterator, Mapping
from contextlib import AbstractAsyncContextManager, asynccontextmanager, suppress
from pathlib import Path
from typing import Any, Protocol

import anyio
import anyio.abc
from anyio.streams.memory import MemoryObjectReceiveStream, MemoryObjectSendStream

from .._errors import (
    InfrastructureError,
    InvalidArgument,
    LaunchError,
    SandboxClosed,
    SandboxDied,
    SandboxError,
    SandboxNotFound,
)
from .._models import SandboxInfo, SandboxStatus
from .._shellfiles import InteractiveProcess
from ._assembly import Assembly
from ._models import (
    DEFAULT_CONTEXT,
    LANGUAGE,
    CodeContext,
    CodeEventCallback,
    CodeRequest,
    Execution,
)

SHIPPED = ("common", "charts", "hooks", "kernel", "runner")
"""The runner's modules (``_common.py``...), in the order the sandbox runs them: each gets
the ones before it as globals of those names (``common``, ...), and :mod:`._runner`, the
program, is last."""

_BOOT = """import types
names = {}
for name, path, text in %r:
    module = types.ModuleType(name)
    module.__dict__.update(names)
    exec(compile(text, path, "exec"), module.__dict__)
    names[name] = module
names["runner"].main()
"""


def _program() -> str:
    here = Path(__file__).parent
    parts = [
        (name, f"asyncsandbox/_interpreter/_{name}.py", (here / f"_{name}.py").read_text())
        for name in SHIPPED
    ]
    return _BOOT % (parts,)


RUNNER = _program()
"""``python3 -c RUNNER``: the runner's modules (:data:`SHIPPED`), their sources in it, run
one after the other, each a module of its own that is not in ``sys.modules`` (the code's
own ``import common`` finds its own), then the runner's ``main()``. One argument, sent
once per runner: compiled in the sandbox, by its own Python."""


class InteractiveSandbox(Protocol):
    """What the interpreter uses of its sandbox: the three methods of
    :class:`~asyncsandbox.abc.SandboxHandle` it calls (every handle is one). Spelled here,
    not imported from :mod:`asyncsandbox.abc`, which re-exports this module's
    :class:`Interpreter`: the two would import each other."""

    @property
    def id(self) -> str:
        """See :attr:`asyncsandbox.abc.SandboxHandle.id`."""
        ...

    async def inspect(self) -> SandboxInfo:
        """See :meth:`asyncsandbox.abc.SandboxHandle.inspect`."""
        ...

    def interact(
        self,
        argv: tuple[str, ...],
        *,
        cwd: str,
        env: Mapping[str, str],
        stdin: bool = True,
    ) -> AbstractAsyncContextManager[InteractiveProcess]:
        """See :meth:`asyncsandbox.abc.SandboxHandle.interact`."""
        ...


FRAME = struct.Struct(">II")
MAX_HEADER = 1 << 20
MAX_PAYLOAD = 1 << 30
INTERRUPT_GRACE = 5.0
"""Seconds interrupted code has to stop before its kernel is killed and restarted (code
that stops at the interrupt does so at once; on a loaded machine, a kernel may need
seconds to be scheduled, and killing it loses its state)."""
RUNNER_ANSWER = 5.0
"""Seconds past the grace by which the runner must have answered an interrupt, else it is
taken for dead (a stopped or wedged supervisor) and killed."""
STDERR_SHOWN = 2000

Frame = tuple[dict[str, Any], bytes]


class _RunnerGone(Exception):
    """The runner's channel ended (it died, or was killed)."""


class _Runner:
    """One runner process of a sandbox and the frames to and from it."""

    def __init__(
        self,
        handle: InteractiveSandbox,
        *,
        cwd: str,
        env: Mapping[str, str],
        cleanup: float,
    ) -> None:
        self._handle = handle
        self._cwd = cwd
        self._env = dict(env)
        self._cleanup = cleanup
        self._waiters: dict[int, MemoryObjectSendStream[Frame]] = {}
        self._ids = itertools.count(1)
        self._process: Any = None
        self._write_lock = anyio.Lock()
        self._scope = anyio.CancelScope()
        self._hello = anyio.Event()
        self.ended = anyio.Event()
        self.dead = False
        self.failure: str | None = None
        """Why it ended, once it has."""
        self.live: set[str] = set()
        """Contexts made in this runner and not removed."""

    # -- its process --

    async def serve(self, *, task_status: anyio.abc.TaskStatus[None]) -> None:
        """Hold the runner's process open and route its frames until it ends (a task of
        the runtime's; an error before the process started goes to who started it)."""
        started = False
        try:
            async with self._handle.interact(
                ("python3", "-c", RUNNER), cwd=self._cwd, env=self._env, stdin=True
            ) as process:
                self._process = process
                started = True
                task_status.started()
                with self._scope:
                    try:
                        await self._read(process)
                    except Exception as exc:  # noqa: BLE001 - it ends the runner, said below
                        self.failure = f"its channel broke: {exc}"
                    if self.failure is None:
                        with anyio.move_on_after(self._cleanup):
                            returncode, stderr = await process.wait()
                            self.failure = _ended(returncode, stderr)
        except Exception as exc:
            if not started:
                raise
            self.failure = self.failure or f"{type(exc).__name__}: {exc}"
        finally:
            self.failure = self.failure or "it was stopped"
            self.dead = True
            for channel in self._waiters.values():
                channel.close()
            self._hello.set()
            self.ended.set()

    async def _read(self, process: Any) -> None:
        buffer = bytearray()
        async for chunk in process:
            buffer += chunk
            while len(buffer) >= FRAME.size:
                head, size = FRAME.unpack_from(buffer)
                if head > MAX_HEADER or size > MAX_PAYLOAD:
                    raise InfrastructureError(f"a frame of {head}+{size} bytes")
                end = FRAME.size + head + size
                if len(buffer) < end:
                    break
                header = json.loads(bytes(buffer[FRAME.size : FRAME.size + head]))
                payload = bytes(buffer[FRAME.size + head : end])
                del buffer[:end]
                if not isinstance(header, dict):
                    raise InfrastructureError("a frame whose header is not an object")
                await self._route(header, payload)

    async def _route(self, header: dict[str, Any], payload: bytes) -> None:
        if header.get("type") == "hello":
            self._hello.set()
            return
        channel = self._waiters.get(header.get("id"))  # type: ignore[arg-type]
        if channel is not None:  # else: a call that gave up on its answer
            with suppress(anyio.BrokenResourceError, anyio.ClosedResourceError):
                await channel.send((header, payload))  # backpressure from a slow caller

    async def started(self, deadline: float | None) -> None:
        """Wait for the runner's hello; raise :class:`LaunchError` if it ended first."""
        with anyio.move_on_after(math.inf if deadline is None else deadline) as scope:
            await self._hello.wait()
        if scope.cancelled_caught:
            self.kill()
            raise LaunchError(
                f"the code interpreter did not start within {deadline:g}s", retryable=False
            )
        if self.dead:
            with anyio.CancelScope(shield=True), anyio.move_on_after(self._cleanup):
                await self.ended.wait()
            raise LaunchError(
                f"the sandbox could not start the code interpreter (python3 -c RUNNER): "
                f"{self.failure}",
                retryable=False,
            )

    def kill(self) -> None:
        """End the runner (its process tree is killed as the serving task leaves it)."""
        self._scope.cancel()

    # -- frames --

    async def send(self, header: dict[str, Any], payload: bytes = b"") -> None:
        if self.dead:
            raise _RunnerGone
        head = json.dumps(header).encode()
        data = FRAME.pack(len(head), len(payload)) + head + payload
        async with self._write_lock:
            # Shielded, bounded: a frame cut short would corrupt the channel for every
            # context of the sandbox.
            with anyio.CancelScope(shield=True), anyio.move_on_after(self._cleanup) as scope:
                try:
                    await self._process.send(data)
                except (anyio.BrokenResourceError, anyio.ClosedResourceError, OSError):
                    self.kill()
                    raise _RunnerGone from None
            if scope.cancelled_caught:
                self.failure = "writing to it timed out"
                self.kill()
                raise _RunnerGone

    @asynccontextmanager
    async def exchange(
        self, header: dict[str, Any], payload: bytes = b""
    ) -> AsyncIterator[tuple[int, MemoryObjectReceiveStream[Frame]]]:
        """Send a request and receive the frames that answer it (by its id) in the block."""
        request = next(self._ids)
        send, receive = anyio.create_memory_object_stream[Frame](64)
        self._waiters[request] = send
        try:
            if self.dead:
                send.close()
            else:
                await self.send({**header, "id": request}, payload)
            yield request, receive
        finally:
            del self._waiters[request]
            send.close()
            receive.close()

    async def ask(self, header: dict[str, Any], *, deadline: float) -> dict[str, Any]:
        """A request with one answer (``created``, ``failed``, ...), within ``deadline``
        seconds (else the runner is taken for dead)."""
        async with self.exchange(header) as (_, replies):
            with anyio.move_on_after(deadline):
                try:
                    answer, _ = await replies.receive()
                except (anyio.EndOfStream, anyio.ClosedResourceError):
                    raise _RunnerGone from None
                return answer
        self.failure = "it did not answer in time"
        self.kill()
        raise _RunnerGone


def _ended(returncode: int, stderr: bytes) -> str:
    said = stderr.decode(errors="replace").strip()[-STDERR_SHOWN:]
    how = (
        f"killed by signal {returncode - 128}"
        if returncode > 128
        else f"it exited with status {returncode}"
    )
    return f"{how}{': ' + said if said else ''}"


class Interpreter:
    """The code interpreter of one sandbox, over its handle's
    :meth:`~asyncsandbox.abc.SandboxHandle.interact`: a
    :class:`~asyncsandbox.abc.CodeInterpreter` whose runner starts on first use. The
    runtime makes one per sandbox; a backend that serves handles itself (the Ray node
    agent) makes its own, exported as :class:`asyncsandbox.abc.SandboxInterpreter`.

    :param handle: the sandbox (``capabilities.interactive``).
    :param services: a task group that outlives every call: it holds the runner open.
    :param workdir: where the runner (and the default context) starts.
    :param env: the sandbox's environment (``MPLBACKEND`` defaults to ``Agg`` here:
        figures render off-screen, as PNG results).
    :param cleanup: how long shielded cleanup may take (``Timeouts.cleanup``).
    :param start_timeout: how long the runner may take to start, and the runner to answer
        a context's request (``Timeouts.operation``).

    Close it (:meth:`aclose`) before the sandbox is removed or reset.
    """

    def __init__(
        self,
        handle: InteractiveSandbox,
        *,
        services: anyio.abc.TaskGroup,
        workdir: str,
        env: Mapping[str, str],
        cleanup: float,
        start_timeout: float | None,
    ) -> None:
        self._handle = handle
        self._services = services
        self._workdir = workdir
        self._env = dict(env)
        self._env.setdefault("MPLBACKEND", "Agg")
        self._cleanup = cleanup
        self._start_timeout = start_timeout
        self._runner: _Runner | None = None
        self._runner_lock = anyio.Lock()
        self._contexts: dict[str, CodeContext] = {}
        """Every context the caller knows of (made, and not removed)."""
        self._locks: dict[str, anyio.Lock] = {}  # one call at a time per context
        self._unreported: set[str] = set()
        """Contexts whose state was lost under a call whose caller never saw its
        execution (cancelled): their next call says so."""
        self._closed = False

    # -- the contract --

    async def run_code(self, request: CodeRequest, *, on_event: CodeEventCallback) -> Execution:
        async with self._lock(request.context):
            runner = await self._current()
            restarted = await self._ensure(runner, request.context)
            return await self._run(runner, request, on_event, restarted)

    async def create_code_context(self, *, cwd: str, language: str) -> CodeContext:
        if language != LANGUAGE:
            raise InvalidArgument(f"contexts run python, not {language!r}")
        context = CodeContext(id=uuid.uuid4().hex, language=LANGUAGE, cwd=cwd)
        async with self._lock(context.id):
            runner = await self._current()
            await self._create(runner, context)
        self._contexts[context.id] = context
        return context

    async def list_code_contexts(self) -> list[CodeContext]:
        return list(self._contexts.values())

    async def restart_code_context(self, context_id: str) -> None:
        self._known(context_id)
        self._unreported.discard(context_id)  # asked for: the next call is fresh, as it says
        runner = self._runner
        if runner is None or runner.dead or context_id not in runner.live:
            return  # its interpreter is gone already: the next call starts a fresh one
        try:
            answer = await runner.ask(
                {"op": "restart", "context": context_id}, deadline=self._deadline()
            )
        except _RunnerGone:
            return
        if answer.get("type") == "failed":
            raise InvalidArgument(
                f"context {context_id!r} could not restart: {answer.get('error')}"
            )

    async def remove_code_context(self, context_id: str) -> None:
        self._known(context_id)
        runner = self._runner
        try:
            if runner is not None and context_id in runner.live:
                runner.live.discard(context_id)
                await runner.ask({"op": "remove", "context": context_id}, deadline=self._deadline())
        except _RunnerGone:
            pass  # and every context with it
        finally:
            self._contexts.pop(context_id, None)
            self._locks.pop(context_id, None)
            self._unreported.discard(context_id)

    async def aclose(self) -> None:
        """Stop the runner (every context dies with it). Idempotent.

        Cancellation: shielded, bounded by the cleanup deadline.
        """
        self._closed = True
        runner, self._runner = self._runner, None
        if runner is not None:
            runner.kill()
            with anyio.CancelScope(shield=True), anyio.move_on_after(self._cleanup):
                await runner.ended.wait()

    # -- the runner and its contexts --

    def _lock(self, context_id: str) -> anyio.Lock:
        return self._locks.setdefault(context_id, anyio.Lock())

    def _known(self, context_id: str) -> None:
        if context_id not in self._contexts:
            raise InvalidArgument(f"this sandbox has no code context {context_id!r}")

    def _deadline(self) -> float:
        return self._start_timeout or self._cleanup

    async def _current(self) -> _Runner:
        """The sandbox's runner, started now if it has none (or it died)."""
        async with self._runner_lock:
            if self._closed:
                raise SandboxClosed("the sandbox was stopped")
            runner = self._runner
            if runner is not None and not runner.dead:
                return runner
            runner = _Runner(self._handle, cwd=self._workdir, env=self._env, cleanup=self._cleanup)
            await self._services.start(runner.serve)
            await runner.started(self._start_timeout)
            self._runner = runner
            return runner

    async def _ensure(self, runner: _Runner, context_id: str) -> bool:
        """Make the context in the runner if it is not there: the default one on first use,
        one the runner lost (it died) again; return whether its state was lost (since the
        last call whose caller saw it)."""
        if context_id in runner.live:
            if context_id in self._unreported:
                self._unreported.discard(context_id)
                return True
            return False
        self._unreported.discard(context_id)  # said below, by the runner's loss
        known = self._contexts.get(context_id)
        if known is None:
            if context_id != DEFAULT_CONTEXT:
                self._known(context_id)
            known = CodeContext(id=context_id, language=LANGUAGE, cwd=self._workdir)
        await self._create(runner, known)
        lost = context_id in self._contexts
        self._contexts[context_id] = known
        return lost

    async def _create(self, runner: _Runner, context: CodeContext) -> None:
        with anyio.CancelScope(shield=True):  # a context half made would leak: finish it
            try:
                answer = await runner.ask(
                    {"op": "create", "context": context.id, "cwd": context.cwd},
                    deadline=self._deadline(),
                )
            except _RunnerGone:
                raise await self._runner_lost(runner) from None
        if answer.get("type") != "created":
            raise InvalidArgument(
                f"cannot make a code context in {context.cwd}: {answer.get('error')}"
            )
        runner.live.add(context.id)

    async def _runner_lost(self, runner: _Runner) -> SandboxError:
        """The error for a runner that ended under a request: the sandbox's death, if it
        died, else the runner's own."""
        with anyio.CancelScope(shield=True), anyio.move_on_after(self._cleanup):
            await runner.ended.wait()
        died = await self._sandbox_gone()
        if died is not None:
            return died
        return InfrastructureError(
            f"sandbox {self._handle.id}: the code interpreter's runner ended ({runner.failure})"
        )

    async def _sandbox_gone(self) -> SandboxDied | None:
        """The sandbox's death, if the runner ended with it."""
        with anyio.CancelScope(shield=True), anyio.move_on_after(self._cleanup):
            try:
                info = await self._handle.inspect()
            except SandboxNotFound:
                return SandboxDied(self._handle.id, "removed")
            except SandboxError as exc:
                if isinstance(exc, SandboxDied):
                    return exc
                return None
            if info.status not in (SandboxStatus.RUNNING, SandboxStatus.CREATING):
                return SandboxDied(self._handle.id, f"it is {info.status}")
        return None

    # -- a call --

    async def _run(
        self,
        runner: _Runner,
        request: CodeRequest,
        on_event: CodeEventCallback,
        restarted: bool,
    ) -> Execution:
        assembly = Assembly(
            context_id=request.context, limit=request.max_output_bytes, restarted=restarted
        )
        header = {
            "op": "run",
            "context": request.context,
            "env": request.env,
            "limit": request.max_output_bytes,
        }
        code = request.code.encode("utf-8", "surrogatepass")
        deadline = math.inf if request.timeout is None else anyio.current_time() + request.timeout
        async with runner.exchange(header, code) as (call, replies):
            try:
                ended = False
                with anyio.CancelScope(deadline=deadline):
                    await self._consume(runner, replies, assembly, on_event)
                    ended = True
                if not ended:  # its timeout
                    assembly.timed_out = True
                    await self._interrupt(runner, call, replies, assembly, on_event)
            except BaseException:
                # Cancelled (or the caller's callback failed): the code must stop before
                # we go, as at its timeout; shielded, bounded by the grace and the answer.
                if not runner.dead:
                    with anyio.CancelScope(shield=True), suppress(SandboxError):
                        await self._interrupt(runner, call, replies, assembly, None)
                if assembly.restarted:  # and nobody will read the execution that says so
                    self._unreported.add(request.context)
                raise
        return assembly.execution()

    async def _consume(
        self,
        runner: _Runner,
        replies: MemoryObjectReceiveStream[Frame],
        assembly: Assembly,
        on_event: CodeEventCallback | None,
    ) -> bool:
        """Take in the call's frames until its end (True); False if the runner died first
        (the assembly then says so, unless the sandbox itself died: that raises)."""
        async for header, payload in replies:
            kind = header.get("type")
            event: Any = None
            if kind in ("stdout", "stderr"):
                event = assembly.output(kind, payload)
            elif kind == "result":
                event = assembly.result(payload, header.get("dropped"))
            elif kind == "error":
                event = assembly.raised(payload)
            elif kind == "done":
                event = assembly.done(header)
                if event is not None and on_event is not None:
                    await on_event(event)
                return True
            elif kind == "failed":
                raise InfrastructureError(
                    f"sandbox {self._handle.id}: the code interpreter refused the call: "
                    f"{header.get('error')}"
                )
            if event is not None and on_event is not None:
                await on_event(event)
        # The channel ended: the runner died (the code may kill it: same user), or the
        # sandbox did.
        with anyio.CancelScope(shield=True), anyio.move_on_after(self._cleanup):
            await runner.ended.wait()
        died = await self._sandbox_gone()
        if died is not None:
            raise died
        error = assembly.fault(
            "InterpreterDied",
            f"the code interpreter's runner died ({runner.failure}): every context of this "
            "sandbox lost its state",
        )
        if on_event is not None:
            await on_event(error)
        return False

    async def _interrupt(
        self,
        runner: _Runner,
        call: int,
        replies: MemoryObjectReceiveStream[Frame],
        assembly: Assembly,
        on_event: CodeEventCallback | None,
    ) -> None:
        """Interrupt the call and take in the rest of it; kill the runner if it does not
        answer (see the module docstring)."""
        with suppress(_RunnerGone):  # _consume says what happened
            await runner.send({"op": "interrupt", "id": call, "grace": INTERRUPT_GRACE})
        with anyio.move_on_after(INTERRUPT_GRACE + RUNNER_ANSWER):
            await self._consume(runner, replies, assembly, on_event)
            return
        runner.failure = "it did not answer an interrupt"
        runner.kill()
        error = assembly.fault(
            "InterpreterDied",
            "the code interpreter's runner did not answer an interrupt and was killed: every "
            "context of this sandbox lost its state",
        )
        if on_event is not None:
            await on_event(error)
