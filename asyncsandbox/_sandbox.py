"""Sandbox: one isolated environment that persists across the commands of an episode."""

from __future__ import annotations

import functools
import math
from collections.abc import AsyncIterable, AsyncIterator, Mapping
from contextlib import asynccontextmanager, suppress
from os import PathLike
from pathlib import Path
from types import TracebackType
from typing import Any, Self, TypeVar, final

import anyio
from anyio import TypedAttributeLookupError

from . import _archive, _streams, _validate as check
from ._commands import ExecArgs, code_context_id, code_language, code_request, exec_result, short
from ._config import SandboxDefaults
from ._errors import (
    ExecFailed,
    ExecTimeout,
    InvalidArgument,
    SandboxClosed,
    SandboxError,
)
from ._interpreter._models import (
    CodeContext,
    CodeEventCallback,
    CodeRequest,
    Execution,
    ExecutionError,
    OutputMessage,
    Result,
)
from ._lifecycle import Lifecycle, SandboxOwner, SandboxState
from ._models import ExecResult, SandboxInfo, Snapshot, Stream
from ._output import BoundedBuffer
from ._streams import CodeStream, ExecStream, OutputHandler
from ._util import single_error
from .abc import ExitStatus, OutputCallback, SandboxHandle

__all__ = ("Sandbox", "SandboxOwner", "SandboxState")

T = TypeVar("T")
T_Attr = TypeVar("T_Attr")

DEFAULT_READ_LIMIT = 100 * 1024 * 1024


@final
class Sandbox:
    """An isolated environment; commands and files persist in it until it is stopped.

    Get one from :meth:`Session.sandbox`. Use it as an async context manager (started on
    enter, removed on every exit path), or call :meth:`start` and :meth:`stop` yourself;
    a sandbox that is used before it was started starts itself. Its Session removes it at
    the latest when the session closes.

    All methods are safe to call from many tasks at once (commands run concurrently).
    """

    def __init__(
        self, owner: SandboxOwner, config: SandboxDefaults, attached: SandboxHandle | None = None
    ) -> None:
        self._runtime = owner.runtime
        self._owner = owner
        self.config = config
        """The effective settings of this sandbox (the session defaults plus overrides)."""
        # attached: a running sandbox of another session (Session.attach); it stays its
        # creator's, so our session's close leaves it, but stop() removes it.
        self._life = Lifecycle(owner, config, attached)
        self._execs = 0
        self._stats = dict.fromkeys(
            ("exec_completed_ok", "exec_completed_nonzero", "exec_failures"), 0
        )

    # -- identity and state -------------------------------------------------------------

    @property
    def started_at(self) -> float | None:
        """``time.time()`` when the sandbox became ready."""
        return self._life.started_at

    @property
    def startup_seconds(self) -> float | None:
        """How long creating and starting it took."""
        return self._life.startup_seconds

    @property
    def id(self) -> str | None:
        """The backend's id, once started (kept after it is stopped)."""
        return self._life.id

    @property
    def tags(self) -> tuple[str, ...]:
        return self.config.tags

    @property
    def attached(self) -> bool:
        """Made by another session and attached to (:meth:`Session.attach`): this session's
        close leaves it; :meth:`stop` removes it."""
        return self._life.attached

    @property
    def state(self) -> SandboxState:
        """``new``, ``starting``, ``running``, ``stopping`` or ``closed`` (a str enum)."""
        return self._life.state

    @property
    def exec_count(self) -> int:
        """Commands started in this sandbox so far."""
        return self._execs

    @property
    def exec_stats(self) -> dict[str, int]:
        """Commands of this sandbox: ``exec_count`` (started), ``exec_completed_ok``,
        ``exec_completed_nonzero``, ``exec_failures`` (timeouts and errors). Commands still
        running count in ``exec_count`` only."""
        return {"exec_count": self._execs, **self._stats}

    def extra(self, attribute: T_Attr, default: Any = TypedAttributeLookupError) -> T_Attr:
        """A backend-specific typed attribute of the started sandbox (see ``asyncsandbox.abc``)."""
        handle = self._life.handle
        if handle is None:
            raise SandboxClosed("the sandbox is not started")
        if default is TypedAttributeLookupError:
            return handle.extra(attribute)
        return handle.extra(attribute, default)

    def __repr__(self) -> str:
        return f"<Sandbox {self.id or '(not started)'} {self._life.state}>"

    # -- lifecycle ----------------------------------------------------------------------

    async def start(self) -> Self:
        """Create and start the sandbox, waiting for capacity first; no-op when running.

        Concurrent calls start it once. Raises :class:`SandboxClosed` after :meth:`stop`.

        Cancellation: a cancelled start leaves nothing behind (the backend undoes a half
        created sandbox) and the sandbox can be started again.
        """
        await self._life.start()
        return self

    async def stop(self) -> None:
        """Remove the sandbox: kill its commands, delete its files, release its slot.
        (With a recycling warm pool, a sandbox of the pool's spec is reset and returns to
        the pool instead: to the next episode, it is a fresh sandbox.)

        Idempotent, and it always releases: like ``trio.abc.AsyncResource.aclose``, an
        error means the removal was not graceful, never that the sandbox was kept (the
        backend's own expiry and ``asyncsandbox gc`` are the backstops). Commands still
        running in it raise :class:`SandboxClosed`.

        Cancellation: runs shielded, bounded by ``Timeouts.remove``.
        """
        await self._life.stop()

    aclose = stop

    async def reset(self) -> None:
        """Return the running sandbox to the state it was created in, keeping its id: every
        process killed (its code contexts too), every writable place as it was at
        creation. This is what recycling does between episodes; a server that keeps a
        tenant's sandbox for another episode calls it. Needs ``capabilities.reset``
        (:class:`InvalidArgument` otherwise). If it raises, the sandbox is in no known
        state: stop it (it is never recycled).

        Cancellation: runs shielded, bounded by ``Timeouts.remove``.
        """
        await self._life.reset()

    # -- state --------------------------------------------------------------------------

    async def snapshot(self, *, keep: bool = False) -> Snapshot:
        """Freeze the sandbox's filesystem state (workdir, home, ``/tmp``, what was
        installed; not its processes) into a :class:`Snapshot`, which
        ``session.sandbox(from_snapshot=...)`` starts sandboxes from; this sandbox goes on.
        Unless ``keep``, the snapshot is deleted with the session.

        Take it between commands: commands running meanwhile are paused during the copy
        where the backend can (the process backend as root, with cgroup v2); elsewhere a
        snapshot is refused while commands run (:class:`InvalidArgument`).

        Cancellation: nothing is left of a snapshot that was not returned.
        """
        if not isinstance(keep, bool):
            raise InvalidArgument(f"keep must be a bool, got {keep!r}")
        handle = await self._life.live_handle()
        async with self._runtime.slot(handle.id):
            snapshot_id = await self._life.guard(self._runtime.snapshot(handle, keep=keep))
        return Snapshot(id=snapshot_id, source=handle.id, kept=keep)

    async def fork(self, n: int) -> list[Sandbox]:
        """``n`` new started sandboxes whose filesystem state equals this one's now (its
        running processes are not carried over): a snapshot, ``n`` starts from it at once,
        the snapshot deleted. Stop them as any sandbox (``async with``, :meth:`stop`).

        Cancellation: the sandboxes started so far are removed, and the snapshot too.
        """
        n = check.positive_int("n", n)
        started = anyio.current_time()
        snapshot = await self.snapshot()
        runtime = self._runtime
        children = [
            Sandbox(self._owner, self.config.replace(from_snapshot=snapshot.id)) for _ in range(n)
        ]
        try:
            with single_error():
                async with anyio.create_task_group() as tg:
                    for child in children:
                        tg.start_soon(child.start)
        except BaseException:
            with anyio.CancelScope(shield=True):
                async with anyio.create_task_group() as tg:
                    for child in children:
                        tg.start_soon(_stop_quietly, child)
            raise
        finally:
            with anyio.CancelScope(shield=True), suppress(SandboxError):
                await runtime.delete_snapshot(snapshot.id)
        runtime.metrics.timed("fork", anyio.current_time() - started)
        return children

    async def __aenter__(self) -> Self:
        return await self.start()

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc_val: BaseException | None,
        exc_tb: TracebackType | None,
    ) -> None:
        await self.stop()

    async def info(self) -> SandboxInfo:
        """The backend's current description of this sandbox."""
        handle = await self._life.live_handle()
        runtime = self._runtime
        return await self._life.guard(
            runtime.call("inspect", handle.inspect, timeout=runtime.timeouts.operation)
        )

    # -- commands -----------------------------------------------------------------------

    async def exec(
        self,
        argv: list[str] | tuple[str, ...],
        *,
        cwd: str | None = None,
        env: Mapping[str, str] | None = None,
        stdin: bytes | str | None = None,
        timeout: float | None = None,
        check: bool = False,
        max_output_bytes: int | None = None,
    ) -> ExecResult:
        """Run ``argv`` (a program and its arguments, no shell) and return its result.

        :param cwd: working directory; relative paths are under ``config.workdir``.
        :param env: extra environment variables (on top of the sandbox's ``env``).
        :param stdin: bytes (or str, encoded as UTF-8) fed to the command; ``None``: empty.
        :param timeout: the command's own limit in seconds. When it expires, every process
            the command started is killed and :class:`ExecTimeout` (a ``TimeoutError``) is
            raised with the output so far. ``None``: no limit.
        :param check: raise :class:`ExecFailed` when the exit status is not 0.
        :param max_output_bytes: per stream; longer output keeps its first and last bytes
            (``stdout_truncated``). Default: ``config.max_output_bytes``.

        When the command's main process exits, processes it left running in the
        background are killed: a command owns everything it starts.

        Cancellation: the command is killed (whole process tree) before the cancellation
        propagates.
        """
        args = ExecArgs(self.config, argv, cwd, env, stdin, timeout, check, max_output_bytes)
        return await self._run(args)

    @asynccontextmanager
    async def exec_stream(
        self,
        argv: list[str] | tuple[str, ...],
        *,
        cwd: str | None = None,
        env: Mapping[str, str] | None = None,
        stdin: bytes | str | None = None,
        timeout: float | None = None,
        check: bool = False,
        max_output_bytes: int | None = None,
    ) -> AsyncIterator[ExecStream]:
        """Run ``argv`` and receive its output as it comes::

            async with sandbox.exec_stream(["pytest", "-x"], timeout=600) as run:
                async for chunk in run:
                    print(chunk.stream, chunk.text, end="")
                result = await run.wait()

        Arguments are those of :meth:`exec`. Output is delivered unbounded to the
        iterator (a slow reader slows the command down, never our memory) and bounded in
        the final result. Leaving the block before the command finished kills it.

        Cancellation: as for :meth:`exec`.
        """
        args = ExecArgs(self.config, argv, cwd, env, stdin, timeout, check, max_output_bytes)
        async with _streams.exec_stream(functools.partial(self._run, args)) as stream:
            yield stream

    async def _run(self, args: ExecArgs, forward: OutputCallback | None = None) -> ExecResult:
        """Run a command; its output is bounded in the result (and ``forward``-ed as it
        comes)."""
        buffers = {"stdout": BoundedBuffer(args.limit), "stderr": BoundedBuffer(args.limit)}

        async def on_output(stream: Stream, data: bytes) -> None:
            buffers[stream].write(data)
            if forward is not None:
                await forward(stream, data)

        runtime = self._runtime
        handle = await self._life.live_handle()
        async with runtime.slot(handle.id):
            self._execs += 1
            status: ExitStatus | None = None
            started = anyio.current_time()
            deadline = math.inf if args.timeout is None else started + args.timeout
            try:
                with self._life.stoppable(deadline):
                    status = await self._life.guard(
                        runtime.launch(
                            "exec",
                            lambda: handle.exec(
                                args.argv,
                                cwd=args.cwd,
                                env=args.env,
                                stdin=args.stdin,
                                on_output=on_output,
                                timeout=args.timeout,
                            ),
                        )
                    )
            except SandboxError as exc:
                self._finished(None, exc)
                raise
            duration = anyio.current_time() - started
        # No status means our scope cancelled the call: stop() was called, or the deadline hit.
        timed_out = status is None
        if status is None:
            if self._life.stopped:
                closed = SandboxClosed("the sandbox was stopped while the command ran")
                self._finished(None, closed)
                raise closed
            status = ExitStatus(returncode=137, signal=9)  # the backend SIGKILLed the tree
        result = exec_result(args, status, buffers, duration=duration, timed_out=timed_out)
        if timed_out:
            error = ExecTimeout(
                f"command timed out after {args.timeout}s: {short(args.argv)}", result
            )
            self._finished(result, error)
            raise error
        self._finished(result, None)
        if args.check and result.returncode != 0:
            raise ExecFailed(
                f"command exited with status {result.returncode}: {short(args.argv)}", result
            )
        return result

    # -- code ---------------------------------------------------------------------------

    async def run_code(
        self,
        code: str,
        *,
        context: CodeContext | str | None = None,
        language: str | None = None,
        timeout: float | None = None,
        env: Mapping[str, str] | None = None,
        max_output_bytes: int | None = None,
        on_stdout: OutputHandler[OutputMessage] | None = None,
        on_stderr: OutputHandler[OutputMessage] | None = None,
        on_result: OutputHandler[Result] | None = None,
        on_error: OutputHandler[ExecutionError] | None = None,
    ) -> Execution:
        """Run Python ``code`` in a stateful context, as a notebook cell runs, and return
        what it did (named after E2B's code interpreter)::

            await sandbox.run_code("import math; x = 6 * 7")
            execution = await sandbox.run_code("math.sqrt(x)")
            execution.text  # '6.48074069840786'

        Variables, imports and the working directory persist from one call to the next in
        the same context; ``context=None`` is the sandbox's default one, made on first use
        (:meth:`create_code_context` makes more: each an interpreter of its own). The last
        expression is the main result (``;`` at the end hides it); objects' ``_repr_html_``,
        ``_repr_png_``, ... and ``display(obj)`` become :class:`Result` formats (through
        IPython's formatters when the sandbox has IPython); matplotlib figures (shown, or
        left open at the end) come back as PNG. An exception is :attr:`Execution.error`,
        not raised; the context keeps its state.

        It needs ``python3`` in the sandbox and nothing else: a runner (standard library
        only) is sent in on the first call and runs as the sandbox's user, inside its
        isolation and limits; the code can neither reach nor forge what the runner tells us.

        :param context: a :class:`CodeContext` or its id.
        :param language: ``"python"`` (or ``None``); E2B's other languages are not run.
            Give a context or a language, not both.
        :param timeout: the code's own limit in seconds. Past it, the code is interrupted
            (``KeyboardInterrupt``, as a notebook's interrupt) and :class:`ExecTimeout` is
            raised with the partial execution (``exc.execution``); the context keeps its
            state. Code that ignores the interrupt is killed after a short grace: its
            context restarts (``execution.restarted``). ``None``: no limit.
        :param env: environment variables set (``os.environ``) for this call only.
        :param max_output_bytes: per stream (head and tail kept, as for :meth:`exec`), and
            for the results together. Default: ``config.max_output_bytes``.
        :param on_stdout: called with each :class:`OutputMessage` of stdout as it comes (a
            function or a coroutine function); ``on_stderr`` likewise; ``on_result`` with
            each :class:`Result`, ``on_error`` with the :class:`ExecutionError`.

        An interpreter that dies (``os._exit``, a segfault, the OOM killer) is reported as
        the execution's error (``InterpreterDied``) and the next call gets a fresh one.
        Output of threads the code started in an earlier call never lands in this one.

        Cancellation: the code is interrupted (killed, with its context restarted, if it
        ignores the interrupt) before the cancellation propagates.
        """
        request = code_request(self.config, code, context, language, timeout, env, max_output_bytes)
        callbacks = _streams.Callbacks(on_stdout, on_stderr, on_result, on_error)
        return await self._run_code(request, callbacks)

    @asynccontextmanager
    async def run_code_stream(
        self,
        code: str,
        *,
        context: CodeContext | str | None = None,
        language: str | None = None,
        timeout: float | None = None,
        env: Mapping[str, str] | None = None,
        max_output_bytes: int | None = None,
    ) -> AsyncIterator[CodeStream]:
        """Run code as :meth:`run_code` does and receive what it does as it comes::

            async with sandbox.run_code_stream(code, timeout=600) as run:
                async for event in run:  # OutputMessage, Result or ExecutionError
                    print(event)
                execution = await run.wait()

        Events are delivered unbounded (a slow reader slows the code down, never our
        memory); the execution is bounded. Leaving the block before the code finished
        interrupts it (and kills it if it does not stop).

        Cancellation: as for :meth:`run_code`.
        """
        request = code_request(self.config, code, context, language, timeout, env, max_output_bytes)
        async with _streams.code_stream(functools.partial(self._run_code, request)) as stream:
            yield stream

    async def create_code_context(
        self, *, cwd: str | None = None, language: str | None = None
    ) -> CodeContext:
        """A new code context: an interpreter of its own (variables, imports, working
        directory), starting in ``cwd`` (relative paths are under ``config.workdir``;
        default: the workdir). It lives until :meth:`remove_code_context` or the
        sandbox's end; pass it (or its id) as ``run_code(context=...)``.

        Cancellation: nothing is left of a context that was not returned.
        """
        directory = (
            self.config.workdir
            if cwd is None
            else check.sandbox_path("cwd", cwd, workdir=self.config.workdir)
        )
        language = code_language(language)
        handle = await self._life.live_handle()
        return await self._life.guard(
            self._runtime.code_call(
                handle,
                self.config,
                lambda target: target.create_code_context(cwd=directory, language=language),
            )
        )

    async def list_code_contexts(self) -> list[CodeContext]:
        """The sandbox's code contexts (the default one once it was used).

        Cancellation: nothing to undo (it only reads; starting the interpreter's runner, if
        it has none yet, is not needed and not done).
        """
        handle = await self._life.live_handle()
        return await self._life.guard(
            self._runtime.code_call(handle, self.config, lambda target: target.list_code_contexts())
        )

    async def restart_code_context(self, context: CodeContext | str) -> None:
        """Give a context a fresh interpreter (its id and starting directory stay); a call
        running in it ends with ``restarted`` set.

        Cancellation: the restart completes or the context is left as it was.
        """
        context_id = code_context_id(context)
        handle = await self._life.live_handle()
        await self._life.guard(
            self._runtime.code_call(
                handle, self.config, lambda target: target.restart_code_context(context_id)
            )
        )

    async def remove_code_context(self, context: CodeContext | str) -> None:
        """Kill a context's interpreter and everything it started, and forget it (the
        default one is made afresh by the next ``run_code`` without a context).

        Cancellation: it runs to its end (it only kills).
        """
        context_id = code_context_id(context)
        handle = await self._life.live_handle()
        await self._life.guard(
            self._runtime.code_call(
                handle, self.config, lambda target: target.remove_code_context(context_id)
            )
        )

    async def _run_code(self, request: CodeRequest, on_event: CodeEventCallback) -> Execution:
        handle = await self._life.live_handle()
        with self._life.stoppable():  # stop() ends the call (the code is interrupted)
            return await self._life.guard(
                self._runtime.run_code(handle, self.config, request, on_event)
            )
        raise SandboxClosed("the sandbox was stopped while the code ran")

    # -- files --------------------------------------------------------------------------

    async def read_file(self, path: str, *, max_bytes: int = DEFAULT_READ_LIMIT) -> bytes:
        """The content of the file at ``path`` (relative paths are under ``config.workdir``).

        Raises :class:`SandboxFileError` (``not_found``, ``is_a_directory``, ``permission``,
        ``too_large`` beyond ``max_bytes``). For big files use :meth:`download`.
        """
        target = check.sandbox_path("path", path, workdir=self.config.workdir)
        limit = check.positive_int("max_bytes", max_bytes)
        handle = await self._life.live_handle()
        async with self._runtime.slot(handle.id):
            return await self._life.guard(
                self._runtime.launch("read_file", lambda: handle.read_file(target, max_bytes=limit))
            )

    async def write_file(self, path: str, data: bytes | str, *, mode: int = 0o644) -> None:
        """Create or replace the file at ``path`` with ``data`` (str is encoded as UTF-8).

        Parent directories are created. Raises :class:`SandboxFileError`.
        """
        target = check.sandbox_path("path", path, workdir=self.config.workdir)
        content: object = data.encode() if isinstance(data, str) else data
        if not isinstance(content, bytes | bytearray | memoryview):
            raise InvalidArgument(f"data must be bytes or str, got {type(content).__name__}")
        check.permission_mode("mode", mode)
        handle = await self._life.live_handle()
        payload = bytes(content)
        async with self._runtime.slot(handle.id):
            await self._life.guard(
                self._runtime.launch(
                    "write_file", lambda: handle.write_file(target, payload, mode=mode)
                )
            )

    async def upload(self, local: str | PathLike[str], remote: str) -> None:
        """Copy a local file or directory into the sandbox, streamed as tar.

        A directory's contents land in the directory ``remote`` (created if missing); a file
        is written to the path ``remote``. Symlinks are copied as symlinks, never followed.
        """
        source = _archive.local_source(local)
        target = check.sandbox_path("remote", remote, workdir=self.config.workdir)
        if source.is_dir():
            directory, arcname = target, None
        else:
            if target == "/":
                raise InvalidArgument("remote must name a file when uploading a file")
            directory, _, arcname = target.rpartition("/")
            directory = directory or "/"
        async with _archive.pack(source, arcname=arcname) as chunks:
            await self.put_archive(directory, chunks)

    async def download(
        self, remote: str, local: str | PathLike[str], *, max_bytes: int | None = None
    ) -> None:
        """Copy a file or directory out of the sandbox, streamed as tar.

        A directory's contents land in the local directory ``local`` (created if missing,
        merged if present); a file is written to the path ``local``. The archive is checked
        like untrusted input: nothing is written outside ``local`` (see ``_archive``).
        ``max_bytes`` bounds the size of the transfer.
        """
        source = check.sandbox_path("remote", remote, workdir=self.config.workdir)
        if not isinstance(local, str | PathLike):
            raise InvalidArgument(f"local must be a str or os.PathLike, got {local!r}")
        if max_bytes is not None:
            check.positive_int("max_bytes", max_bytes)
        dest = Path(local)
        async with self.get_archive(source) as chunks:
            await _archive.unpack(chunks, dest, max_bytes=max_bytes, label=source)

    async def put_archive(self, path: str, archive: AsyncIterable[bytes]) -> None:
        """Extract an uncompressed tar stream into the directory ``path`` (created if
        missing), consuming ``archive`` as it comes. Members keep their permission bits;
        the sandbox user owns them. The backend checks the members (no ``..``, no absolute
        names, no devices); :meth:`upload` builds the stream from local files.

        Cancellation: the transfer stops; what was extracted so far stays.
        """
        target = check.sandbox_path("path", path, workdir=self.config.workdir)
        if not isinstance(archive, AsyncIterable):
            raise InvalidArgument(f"archive must be an async iterable of bytes, got {archive!r}")
        handle = await self._life.live_handle()
        async with self._runtime.slot(handle.id):
            await self._life.guard(
                self._runtime.once("put_archive", lambda: handle.put_archive(target, archive))
            )

    @asynccontextmanager
    async def get_archive(self, path: str) -> AsyncIterator[AsyncIterator[bytes]]:
        """Stream the file or directory ``path`` (recursively) as an uncompressed tar,
        whose single top-level member is named after it; symlinks are stored, never
        followed. :meth:`download` unpacks it locally, checked as untrusted input::

            async with sandbox.get_archive("results") as chunks:
                async for chunk in chunks:
                    ...

        Raises :class:`SandboxFileError` (``not_found``, ``permission``) on entering.

        Cancellation: leaving the block stops the transfer.
        """
        source = check.sandbox_path("path", path, workdir=self.config.workdir)
        handle = await self._life.live_handle()
        with self._life.watched():
            async with (
                self._runtime.slot(handle.id),
                self._runtime.stream("get_archive", lambda: handle.get_archive(source)) as chunks,
            ):
                yield chunks

    # -- internals ----------------------------------------------------------------------

    def _finished(self, result: ExecResult | None, error: BaseException | None) -> None:
        """Account for a command's end: in the runtime's metrics and our own stats."""
        self._runtime.exec_finished(self._life.id, result, error)
        if result is None or result.timed_out:
            self._stats["exec_failures"] += 1
        elif result.returncode == 0:
            self._stats["exec_completed_ok"] += 1
        else:
            self._stats["exec_completed_nonzero"] += 1
        if result is not None:
            self._life.log.debug(
                "sandbox.exec.finished",
                argv0=result.argv[0],
                returncode=result.returncode,
                seconds=round(result.duration, 4),
                timed_out=result.timed_out,
            )


async def _stop_quietly(sandbox: Sandbox) -> None:
    with suppress(SandboxError):  # logged by the runtime; the error being raised matters
        await sandbox.stop()
