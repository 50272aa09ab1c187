"""Running a program on test cases in a sandbox: the host side of the runner
(:mod:`._runner`), and what is done for the cases it does not answer for.

Every case runs under a runner, which holds the case's main process at its exit until
everything else of the case is dead (the exit barrier): one runner for all the cases,
``parallel`` at a time. A case can kill its runner (same user); the cases that runner did
not answer for then run again, each under a runner of its own, and a case whose own
runner dies unanswered failed by its own doing (``RUNNER_KILLED``). Only a sandbox without
``python3``, where no runner can run, has its cases run one plain command each (with the
weaker end of a plain exec; logged once as ``judge.runner.unavailable``).
"""

from __future__ import annotations

import errno
import functools
import importlib.util
import json
import marshal
from collections.abc import Awaitable, Callable, Sequence
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import anyio

from .._errors import ExecTimeout, FileErrorReason, SandboxFileError
from .._log import get_logger
from .._models import ExecResult, OutputChunk
from ._runner import BOOT, SHIPPED, UNLAUNCHABLE, UNWRITABLE

__all__ = ("RUNNER_KILLED", "CannotRun", "CaseRun", "Source", "Stream", "Target", "run_cases")

_SHIPPED = [(path, Path(__file__).parents[2].joinpath(path).read_text()) for _, path in SHIPPED]
DIGEST = 4096
RUNNER_KILLED = 137
"""The exit status of a case whose own runner was killed while it ran (by the case: the
runner is out of everything else's reach)."""
_log = get_logger("asyncsandbox.judge")
_warned: set[str] = set()


class Stream(Protocol):
    """What the runner's command gives (:class:`asyncsandbox.ExecStream`)."""

    def __aiter__(self) -> Any: ...

    async def wait(self) -> ExecResult: ...


class Target(Protocol):
    """What running cases needs of a sandbox (:class:`asyncsandbox.Sandbox` has it)."""

    def exec_stream(
        self,
        argv: tuple[str, ...],
        *,
        cwd: str | None = ...,
        stdin: bytes | str | None = ...,
        timeout: float | None = ...,
        max_output_bytes: int | None = ...,
    ) -> AbstractAsyncContextManager[Any]: ...

    async def exec(
        self,
        argv: tuple[str, ...],
        *,
        cwd: str | None = ...,
        stdin: bytes | str | None = ...,
        timeout: float | None = ...,
        max_output_bytes: int | None = ...,
    ) -> ExecResult: ...

    async def write_file(self, path: str, data: bytes | str) -> Any: ...


@dataclass(frozen=True)
class CaseRun:
    """One case to run: its index in the judgement, its input and its limits."""

    index: int
    stdin: bytes
    time_limit: float
    memory_mb: int | None


Answer = Callable[[int, ExecResult], Awaitable[bool]]
"""Receives each case's result as it comes; returns False to stop (the rest are not run)."""


class CannotRun(Exception):
    """The sandbox has no command to run the cases with (found before any case ran, so
    it is never the program's doing)."""


@dataclass(frozen=True)
class Source:
    """A program's source, to be written to ``name`` in the cases' directory before they
    run (by the runner itself: one command fewer a judgement)."""

    name: str
    data: bytes


async def run_cases(
    sandbox: Target,
    argv: tuple[str, ...],
    *,
    fork: bool,
    cwd: str | None,
    source: Source | None,
    cases: Sequence[CaseRun],
    parallel: int,
    output_limit: int,
    answer: Answer,
) -> None:
    """Run ``argv`` on every case in ``sandbox`` (in ``cwd``, created if missing, where
    ``source`` is written first): ``fork`` runs a Python program (``argv`` is the
    interpreter and the program's path) in forks of one interpreter that compiled it;
    else each case executes ``argv``. ``answer`` gets each result as the case ends, in
    the order they end. Raises :class:`SandboxFileError` if the source cannot be written,
    :class:`CannotRun` if ``argv``'s command is not in the sandbox (checked before any
    case runs: once one ran, a failure to run is the program's doing).

    Cancellation: the running cases are killed.
    """
    runner = _Runner(sandbox, argv, fork, cwd, source, output_limit, answer)
    left = await runner.run(cases, parallel)
    if left is None:
        return  # answer() said stop
    if runner.unavailable:
        if source is not None:
            await sandbox.write_file(_path(cwd, source.name), source.data)
        await _check_runnable(sandbox, argv, cwd, left)
        await _each_by_itself(sandbox, argv, cwd, left, parallel, output_limit, answer)
        return
    if left:
        _log.warning("judge.runner_gave_up", cases=len(left), reason=runner.why)
    # Each in a runner of its own: a case that kills its runner ends only itself.
    pending = iter(left)
    async with anyio.create_task_group() as tg:

        async def worker() -> None:
            for case in pending:
                alone = _Runner(sandbox, argv, fork, cwd, source, output_limit, answer)
                rest = await alone.run([case], 1)
                if rest is None:
                    tg.cancel_scope.cancel()
                    return
                if rest and not await answer(case.index, alone.killed(case)):
                    tg.cancel_scope.cancel()
                    return

        for _ in range(min(parallel, len(left))):
            tg.start_soon(worker)


@functools.cache
def _boot() -> tuple[str, ...]:
    """The runner's command line after the interpreter (see :data:`._runner.BOOT`)."""
    return ("-c", BOOT, importlib.util.MAGIC_NUMBER.hex())


@functools.cache
def _code() -> bytes:
    """The start of the runner's stdin: the runner and what it needs, compiled here and as
    sources (see :data:`._runner.BOOT`)."""
    codes = tuple(compile(text, path, "exec", dont_inherit=True) for path, text in _SHIPPED)
    compiled = marshal.dumps(codes)
    sources = "\0".join(text for _, text in _SHIPPED).encode()
    return b"%d %d\n" % (len(compiled), len(sources)) + compiled + sources


class _Malformed(Exception):
    pass


class _Runner:
    """One runner's command, and what it said."""

    def __init__(
        self,
        sandbox: Target,
        argv: tuple[str, ...],
        fork: bool,
        cwd: str | None,
        source: Source | None,
        output_limit: int,
        answer: Answer,
    ) -> None:
        self.sandbox = sandbox
        self.argv = argv
        self.fork = fork
        self.cwd = cwd
        self.source = source
        self.output_limit = output_limit
        self.answer = answer
        self.why = "it ended without answering for every case"
        self.unavailable = False  # no runner can run in this sandbox
        self.ran: ExecResult | None = None  # the runner's own result, once it ended

    async def run(self, cases: Sequence[CaseRun], parallel: int) -> list[CaseRun] | None:
        """Run ``cases``; return those it did not answer for (None once ``answer`` said
        stop: leaving the runner's block kills it)."""
        source = self.source
        header: dict[str, Any] = {
            "mode": "fork" if self.fork else "exec",
            "directory": self.cwd or "",
            "file": None if source is None else source.name,
            "source": 0 if source is None else len(source.data),
            "parallel": parallel,
            "output_limit": self.output_limit,
            "cases": [
                {
                    "time_limit": case.time_limit,
                    "memory_kb": None if case.memory_mb is None else case.memory_mb * 1024,
                    "stdin": len(case.stdin),
                }
                for case in cases
            ],
        }
        if self.fork:
            header["program"] = self.argv[1]
        else:
            header["argv"] = list(self.argv)
        encoded = marshal.dumps(header, 2)  # version 2: read alike by every Python 3
        request = b"".join((
            _code(),
            b"%d\n" % len(encoded),
            encoded,
            b"" if source is None else source.data,
            *(c.stdin for c in cases),
        ))  # fmt: skip
        frames = _Frames(self.argv, len(cases))
        answered: set[int] = set()
        interpreter = self.argv[0] if self.fork else "python3"
        try:
            async with self.sandbox.exec_stream(
                (interpreter, *_boot()),
                stdin=request,
                timeout=sum(case.time_limit for case in cases) + 30,  # all at their limits
                max_output_bytes=DIGEST,
            ) as stream:
                chunk: OutputChunk
                async for chunk in stream:
                    if chunk.stream != "stdout":
                        continue  # the runner's own complaints: in its result's stderr
                    for position, result in frames.feed(chunk.data):
                        if position in answered:
                            raise _Malformed(f"case {position} answered twice")
                        answered.add(position)
                        if not await self.answer(cases[position].index, result):
                            return None
                self.ran = ran = await stream.wait()
                if ran.returncode == UNWRITABLE and not frames.started and source is not None:
                    raise _unwritable(_path(self.cwd, source.name), ran.stderr)
                if ran.returncode == UNLAUNCHABLE and not frames.started:
                    raise CannotRun(ran.stderr.decode(errors="replace").strip()[-400:])
                if not frames.ended:
                    self.why = f"exit status {ran.returncode}: {ran.stderr[-400:].decode(errors='replace')}"
                    if ran.returncode in (126, 127) and not frames.started:
                        self.unavailable = True
                        self._warn("judge.runner.unavailable", self.why)
                elif not frames.barrier:
                    self._warn("judge.barrier.unavailable", "the sandbox's kernel has none")
        except ExecTimeout:
            self.why = "it ran past the sum of the time limits"
        except _Malformed as exc:  # nothing it said can be trusted: every case again
            self.why = f"its answers stopped making sense ({exc})"
            answered.clear()
        return [case for position, case in enumerate(cases) if position not in answered]

    def killed(self, case: CaseRun) -> ExecResult:
        """The result of ``case``, alone under a runner that died without answering."""
        ran = self.ran
        return ExecResult(
            argv=self.argv,
            returncode=RUNNER_KILLED,
            stderr=b"the judge's runner was killed while this case ran",
            oom_killed=ran is not None and ran.oom_killed,
        )

    @staticmethod
    def _warn(event: str, reason: str) -> None:
        if event not in _warned:
            _warned.add(event)
            _log.warning(
                event,
                reason=reason,
                hint="a program's leftovers may then answer after it ended; judge where "
                "python3 and seccomp user notifications (Linux 5.5+) are available",
            )


async def _check_runnable(
    sandbox: Target, argv: tuple[str, ...], cwd: str | None, cases: Sequence[CaseRun]
) -> None:
    """What the runner checks before any case runs (see :data:`._runner.UNLAUNCHABLE`),
    for the path without one: ``argv``'s command is there, the memory limit can be set."""
    found = await sandbox.exec(
        ("/bin/sh", "-c", 'command -v "$1" >/dev/null', "sh", argv[0]), cwd=cwd
    )
    if found.returncode != 0:
        raise CannotRun(f"{argv[0]}: not found or not executable")
    limits = [case.memory_mb for case in cases if case.memory_mb is not None]
    if limits:
        kb = str(max(limits) * 1024)
        limited = await sandbox.exec(("/bin/sh", "-c", 'ulimit -v "$1"', "sh", kb), cwd=cwd)
        if limited.returncode != 0:
            raise CannotRun(f"cannot limit memory to {kb} KiB: {limited.stderr[-200:]!r}")


async def _each_by_itself(
    sandbox: Target,
    argv: tuple[str, ...],
    cwd: str | None,
    cases: Sequence[CaseRun],
    parallel: int,
    output_limit: int,
    answer: Answer,
) -> None:
    """One plain command per case (a sandbox without ``python3``)."""
    pending = iter(cases)
    async with anyio.create_task_group() as tg:

        async def worker() -> None:
            for case in pending:
                command = argv
                if case.memory_mb is not None:
                    limit = str(case.memory_mb * 1024)
                    command = ("/bin/sh", "-c", _LIMIT_MEMORY, "sh", limit, *argv)
                try:
                    result = await sandbox.exec(
                        command,
                        cwd=cwd,
                        stdin=case.stdin,
                        timeout=case.time_limit,
                        max_output_bytes=output_limit,
                    )
                except ExecTimeout as exc:
                    result = exc.result
                if not await answer(case.index, result):
                    tg.cancel_scope.cancel()
                    return

        for _ in range(min(parallel, len(cases))):
            tg.start_soon(worker)


def _path(directory: str | None, name: str) -> str:
    return f"{directory}/{name}" if directory else name


_REASONS = {
    errno.ENOENT: FileErrorReason.NOT_FOUND,
    errno.EISDIR: FileErrorReason.IS_A_DIRECTORY,
    errno.ENOTDIR: FileErrorReason.NOT_A_DIRECTORY,
    errno.EACCES: FileErrorReason.PERMISSION,
    errno.EPERM: FileErrorReason.PERMISSION,
    errno.EROFS: FileErrorReason.PERMISSION,
}


def _unwritable(path: str, stderr: bytes) -> SandboxFileError:
    """The runner could not write the program (it said ``ERRNO STRERROR``)."""
    number, _, text = stderr.decode(errors="replace").strip().partition(" ")
    reason = _REASONS.get(int(number) if number.isdigit() else 0, FileErrorReason.OTHER)
    return SandboxFileError(reason, path, text or None)


_LIMIT_MEMORY = 'ulimit -v "$1" || exit 125; shift; exec "$@"'


class _Frames:
    """The runner's answers (see :mod:`._runner`), parsed as its output arrives: a JSON
    line, then as many bytes of output as it says."""

    def __init__(self, argv: tuple[str, ...], cases: int) -> None:
        self._argv = argv  # what each case ran, as its results say
        self._cases = cases
        self._buffer = bytearray()
        self._meta: dict[str, Any] | None = None
        self.started = False  # it said anything at all
        self.ended = False
        self.barrier = True

    def feed(self, data: bytes) -> list[tuple[int, ExecResult]]:
        if self.ended:
            raise _Malformed("output after the end")
        self.started = True
        self._buffer += data
        answers = []
        while not self.ended:
            if self._meta is None:
                line, newline, _ = self._buffer.partition(b"\n")
                if not newline:
                    break
                del self._buffer[: len(line) + 1]
                try:
                    self._meta = json.loads(line)
                except ValueError as exc:
                    raise _Malformed(f"not JSON: {bytes(line[:80])!r}") from exc
                if isinstance(self._meta, dict) and self._meta.get("end") is True:
                    self.ended = True
                    self.barrier = bool(self._meta.get("barrier"))
                    if self._buffer:
                        raise _Malformed("output after the end")
                    break
            meta = self._meta
            try:
                assert isinstance(meta, dict)
                out, err = int(meta["stdout"]), int(meta["stderr"])
                index = int(meta["case"])
            except (AssertionError, KeyError, TypeError, ValueError) as exc:
                raise _Malformed(f"not an answer: {meta!r:.120}") from exc
            if not 0 <= index < self._cases:
                raise _Malformed(f"no case {index}")
            if len(self._buffer) < out + err:
                break
            stdout, stderr = bytes(self._buffer[:out]), bytes(self._buffer[out : out + err])
            del self._buffer[: out + err]
            self._meta = None
            if not meta.get("barrier", True):
                self.barrier = False
            if meta.get("stdout_dropped"):  # written by processes that outlived its end
                _log.info("judge.case.output_dropped", case=index, bytes=meta["stdout_dropped"])
            signum = meta.get("signal")
            answers.append((
                index,
                ExecResult(
                    argv=self._argv,
                    returncode=128 + signum if signum else int(meta["status"]),
                    stdout=stdout,
                    stderr=stderr,
                    duration=float(meta["seconds"]),
                    timed_out=bool(meta["timed_out"]),
                    stdout_truncated=bool(meta["stdout_truncated"]),
                    stderr_truncated=bool(meta["stderr_truncated"]),
                    stdout_size=out,
                    stderr_size=err,
                    signal=signum or None,
                    cpu_time=meta.get("cpu_seconds"),
                ),
            ))  # fmt: skip
        return answers
