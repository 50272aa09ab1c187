"""The fast path: commands and file operations through the sandbox's resident executor
(``_executor.py``), with no daemon work per command. Once the executor fails, the sandbox
is served by the Engine API path for the rest of its life."""

from __future__ import annotations

from collections.abc import AsyncIterable, AsyncIterator, Mapping, Sequence
from contextlib import AbstractAsyncContextManager, asynccontextmanager

import anyio
import msgspec

from asyncsandbox import BackendUnavailable, SandboxDied
from asyncsandbox.abc import ExitStatus, InteractiveProcess, OutputCallback, ShellFiles

from ._api_path import ApiPath
from ._executor import Executor, Job, JobProcess, ShellJob
from ._sandbox import Container, Path


class ExecutorFiles(ShellFiles):
    """Interactive processes (the code interpreter's runner) and the file operations (as
    ``sh`` scripts) through the executor."""

    def __init__(self, container: Container, executor: Executor) -> None:
        self._container = container
        self._executor = executor

    @asynccontextmanager
    async def interact(
        self,
        argv: tuple[str, ...],
        *,
        cwd: str,
        env: Mapping[str, str],
        stdin: bool = True,
    ) -> AsyncIterator[InteractiveProcess]:
        async with self._job(argv, cwd=cwd, env=env, stdin=stdin) as job:
            yield JobProcess(job)

    @asynccontextmanager
    async def shell(
        self, script: str, args: Sequence[str], *, stdin: bool
    ) -> AsyncIterator[InteractiveProcess]:
        argv = ("/bin/sh", "-c", script, "sh", *args)
        async with self._job(argv, cwd="/", env={"LC_ALL": "C"}, stdin=stdin) as job:
            yield ShellJob(job)  # with a watchdog: a file operation is never silent for long

    @asynccontextmanager
    async def _job(
        self, argv: Sequence[str], *, cwd: str, env: Mapping[str, str], stdin: bool
    ) -> AsyncIterator[Job]:
        try:
            async with self._executor.open(argv, cwd=cwd, env=env, stdin=stdin) as job:
                yield job
        except BackendUnavailable as exc:
            raise await self._container.died(exc, stopping=self._executor.exited) from exc


class FastPath(Path):
    def __init__(self, container: Container, executor: Executor) -> None:
        self._container = container
        self._executor = executor
        self._files = ExecutorFiles(container, executor)
        self._api = ApiPath(container)  # for good once the executor failed; tar-less images
        self._has_tar: bool | None = None

    def serving(self) -> Path:
        return self if self._executor.usable else self._api

    async def exec(
        self,
        argv: tuple[str, ...],
        *,
        cwd: str,
        env: Mapping[str, str],
        stdin: bytes | None,
        on_output: OutputCallback,
    ) -> ExitStatus:
        container = self._container
        oom_before = container.ooms.count(container.name)
        try:
            status, oom = await self._executor.exec(
                argv, cwd=cwd, env=env, stdin=stdin, on_output=on_output
            )
        except SandboxDied as exc:
            container.lost = exc
            raise
        except BackendUnavailable as exc:
            # Shielded (each call it makes has a deadline): the exec may be cancelled
            # (its timeout), and a cancelled diagnosis would let the cancellation pass
            # this failure off as a timeout, the command's own outcome.
            with anyio.CancelScope(shield=True):
                died = await container.died(
                    exc, stopping=self._executor.exited, ooms_before=oom_before
                )
            raise died from exc
        if status.signal == 9 and not oom:  # the executor could not read the cgroup
            oom = await container.ooms.since(container.name, oom_before)
        return msgspec.structs.replace(status, oom_killed=oom)

    def interact(
        self,
        argv: tuple[str, ...],
        *,
        cwd: str,
        env: Mapping[str, str],
        stdin: bool = True,
    ) -> AbstractAsyncContextManager[InteractiveProcess]:
        return self._files.interact(argv, cwd=cwd, env=env, stdin=stdin)

    async def read_file(self, path: str, *, max_bytes: int) -> bytes:
        return await self._files.read_file(path, max_bytes=max_bytes)

    async def write_file(self, path: str, data: bytes, *, mode: int) -> None:
        await self._files.write_file(path, data, mode=mode)

    async def put_archive(self, path: str, archive: AsyncIterable[bytes]) -> None:
        files = self._files if await self._tar_ok() else self._api
        await files.put_archive(path, archive)

    @asynccontextmanager
    async def get_archive(self, path: str) -> AsyncIterator[AsyncIterator[bytes]]:
        files = self._files if await self._tar_ok() else self._api
        async with files.get_archive(path) as chunks:
            yield chunks

    async def _tar_ok(self) -> bool:
        """Whether the image has ``tar`` (directory transfers through the executor need it)."""
        if self._has_tar is None:
            async with self._files.shell("command -v tar >/dev/null", (), stdin=False) as script:
                returncode, _ = await script.wait()
            self._has_tar = returncode == 0
        return self._has_tar

    async def aclose(self) -> None:
        await self._executor.aclose()
