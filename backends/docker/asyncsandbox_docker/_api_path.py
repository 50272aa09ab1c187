"""The Engine API path: every command a ``docker exec`` of the agent's shepherd (``_agent.py
run``), every file operation a call to the container's archive endpoint. Slower than the
fast path (three daemon round trips per command) but needs nothing running in the
container: sandboxes that were attached, or whose executor failed, take it.
"""

from __future__ import annotations

import base64
import io
import json
import posixpath
import tarfile
import uuid
from collections.abc import AsyncIterable, AsyncIterator, Mapping
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from importlib.resources import files
from typing import Any

import anyio

from asyncsandbox import (
    FileErrorReason,
    InvalidArgument,
    LaunchError,
    SandboxDied,
    SandboxError,
    SandboxFileError,
)
from asyncsandbox.abc import ExitStatus, InteractiveProcess, OutputCallback
from asyncsandbox.log import get_logger

from . import _tar
from ._engine import Body
from ._sandbox import Container, Path

log = get_logger("asyncsandbox.docker")

AGENT = files(__package__).joinpath("_agent.py").read_text()
CHUNK = 256 * 1024
MODE_DIR = 1 << 31  # Go's os.ModeDir, as in X-Docker-Container-Path-Stat
MODE_SYMLINK = 1 << 27
# The shepherd (``_agent.py run``): where it records a command it could not start, and the
# exit status that says to look there.
RUN_DIR = "/run/asyncsandbox"
LAUNCH_FAILED = 125
MAX_FAILURE_ARCHIVE = 64 * 1024


class ApiPath(Path):
    def __init__(self, container: Container) -> None:
        self._container = container
        self._engine = container.engine

    def _archive(self, target: str, path: str) -> AbstractAsyncContextManager[Body]:
        """The archive endpoint's answer for ``target`` (errors name ``path``)."""
        return self._engine.raw(
            "GET",
            f"containers/{self._container.name}/archive",
            params={"path": target},
            sandbox_id=self._container.name,
            file_path=path,
        )

    async def _new_exec(self, cmd: list[str], env: Mapping[str, str], stdin: bool) -> str:
        body = {
            "Cmd": cmd,
            "User": "0",
            "Env": [f"{k}={v}" for k, v in env.items()],
            "WorkingDir": "/",
            "AttachStdin": stdin,
            "AttachStdout": True,
            "AttachStderr": True,
            "Tty": False,
        }
        try:
            created = await self._engine.call(
                "POST",
                f"containers/{self._container.name}/exec",
                body=body,
                sandbox_id=self._container.name,
            )
        except SandboxError as exc:
            raise await self._container.died(exc) from exc
        return str(created["Id"])

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
        token = uuid.uuid4().hex
        data = stdin or b""
        cmd = [
            "python3",
            "-I",
            "-S",
            "-c",
            AGENT,
            "run",
            token,
            str(container.uid),
            str(container.gid),
            str(len(data)),
            cwd,
            "--",
            *argv,
        ]
        exec_id = await self._new_exec(cmd, env, stdin=bool(data))
        oom_before = container.ooms.count(container.name)
        first: bytes | None = None
        stream = self._engine.exec_stream(exec_id, container.name)
        try:
            await stream.connect()  # POST /exec/{id}/start, hijacking the connection
            if data:
                for offset in range(0, len(data), 1 << 16):
                    await stream.write(data[offset : offset + (1 << 16)])
            while (message := await stream.read()) is not None:
                kind, chunk = message
                if first is None:
                    first = chunk
                await on_output("stdout" if kind == 1 else "stderr", chunk)
        except BaseException as exc:
            # Shielded and bounded: the command's whole tree must die before we re-raise.
            with anyio.CancelScope(shield=True):
                await stream.close()
                killed = await self._kill(token)
            if not killed:
                self._container.lost = SandboxDied(
                    self._container.name, "lost: a command could not be killed"
                )
                log.warning(
                    "docker.sandbox.lost", sandbox_id=self._container.name, reason="kill failed"
                )
                if isinstance(exc, anyio.get_cancelled_exc_class()):
                    # Not the cancellation: it would pass the command off as killed (and its
                    # timeout as its own outcome), while it may still run.
                    raise self._container.lost from None
            raise
        finally:
            with anyio.CancelScope(shield=True):
                await stream.close()
        try:
            result = await self._engine.call(
                "GET", f"exec/{exec_id}/json", sandbox_id=self._container.name
            )
        except SandboxError as exc:
            raise await self._container.died(exc) from exc
        code = result.get("ExitCode")
        if code is None or result.get("Running"):
            raise await self._container.died(
                SandboxDied(self._container.name, "the command's exit status was lost")
            )
        if not result.get("Pid"):
            # Docker could not start our shepherd at all: no process ever ran, so the output
            # is Docker's own (a command printing the same text cannot get here).
            said = (first or b"").decode(errors="replace").strip()
            if '"python3": executable file not found' in said:
                raise InvalidArgument(
                    f"image {self._container.image!r} has no python3, which the docker backend needs in "
                    "the image to control process trees"
                )
            probe = SandboxDied(self._container.name, said)
            died = await self._container.died(probe)
            if died is not probe:
                raise died  # it could not start because the container is gone
            raise LaunchError(
                f"sandbox {self._container.name}: Docker could not start the command: {said}"
            )
        if code == LAUNCH_FAILED:
            failure = await self._launch_failure(token)
            if failure is not None:
                raise failure
        oom = code == 137 and await container.ooms.since(container.name, oom_before)
        if code >= 128 and not oom:
            # Killed by a signal: maybe with its whole container (`docker kill`, a daemon
            # restart). That is the sandbox's death, not the command's outcome.
            probe = SandboxDied(self._container.name, "the container stopped while the command ran")
            died = await self._container.died(probe)
            if died is not probe:
                raise died
        return ExitStatus(returncode=int(code), oom_killed=oom)

    @asynccontextmanager
    async def interact(
        self,
        argv: tuple[str, ...],
        *,
        cwd: str,
        env: Mapping[str, str],
        stdin: bool = True,
    ) -> AsyncIterator[InteractiveProcess]:
        # An Engine API exec's stdin is the hijacked connection, which cannot be closed
        # for writing alone: the stream a process needs is the executor's (the fast path).
        raise LaunchError(
            f"sandbox {self._container.name}: an interactive process (the code interpreter) "
            "needs the sandbox's executor: the Docker backend's fast path, which this sandbox "
            "does not have (fast_path=False, an attached sandbox, or its executor failed)",
            retryable=False,
        )
        yield  # type: ignore[unreachable]  # an async generator that raises on entering

    async def _launch_failure(self, token: str) -> LaunchError | None:
        """Why the shepherd run under ``token`` could not start its command, if it could not
        (it exited LAUNCH_FAILED and wrote ``RUN_DIR/TOKEN.failed``; a command exiting with
        that status is not one). Only root writes there: the record is read from the
        container's filesystem by the daemon, and trusted only if root owns it."""
        path = f"{RUN_DIR}/{token}.failed"
        try:
            async with self._archive(path, path) as body:
                archive = await body.read(MAX_FAILURE_ARCHIVE)
        except SandboxFileError:
            return None  # no record: the command's own exit status
        except SandboxError as exc:
            raise await self._container.died(exc) from exc
        try:
            with tarfile.open(fileobj=io.BytesIO(archive)) as tar:
                member = tar.next()
                data = tar.extractfile(member) if member is not None else None
                if member is None or data is None or member.uid != 0:
                    return None
                record = data.read()
        except tarfile.TarError:
            return None
        message = record[1:].decode(errors="replace")
        return LaunchError(
            f"sandbox {self._container.name}: the command could not be started: {message}",
            retryable=record[:1] == b"1",
        )

    async def _kill(self, token: str) -> bool:
        """Kill the command run under ``token`` (and its whole tree). True once confirmed."""
        with anyio.move_on_after(self._engine.timeouts.cleanup):
            try:
                exec_id = await self._new_exec(
                    ["python3", "-I", "-S", "-c", AGENT, "kill", token], {}, stdin=False
                )
                stream = self._engine.exec_stream(exec_id, self._container.name)
                try:
                    while await stream.read() is not None:
                        pass
                finally:
                    await stream.close()
                result = await self._engine.call(
                    "GET", f"exec/{exec_id}/json", sandbox_id=self._container.name
                )
                if result.get("ExitCode") != 0:
                    log.warning(
                        "docker.kill.failed",
                        sandbox_id=self._container.name,
                        exit_code=result.get("ExitCode"),
                    )
                return bool(result.get("ExitCode") == 0)
            except SandboxDied:
                return True  # the container is gone, and every process with it
            except (SandboxError, RuntimeError) as exc:
                log.warning("docker.kill.failed", sandbox_id=self._container.name, error=repr(exc))
                return False
        return False

    async def _stat(self, path: str) -> tuple[str, dict[str, Any]]:
        """(resolved path, stat) of ``path``, following a final symlink."""
        for _ in range(10):
            headers = await self._engine.head(
                f"containers/{self._container.name}/archive",
                params={"path": path},
                sandbox_id=self._container.name,
                file_path=path,
            )
            header = headers.get("X-Docker-Container-Path-Stat", "")
            stat = json.loads(base64.b64decode(header)) if header else {}
            target = stat.get("linkTarget") or ""
            if not (int(stat.get("mode", 0)) & MODE_SYMLINK) or not target:
                return path, stat
            path = posixpath.normpath(posixpath.join(posixpath.dirname(path), target))
        raise SandboxFileError(
            FileErrorReason.INVALID_PATH, path, "too many levels of symbolic links"
        )

    async def _running(self) -> None:
        """Raise :class:`SandboxDied` unless the container runs. The daemon serves a
        stopped container's files as it serves a running one's, but the sandbox is gone
        (its commands died with it, and every later command raises so): its files say so
        too. One inspect per file operation, on this path only."""
        name = self._container.name
        try:
            data = await self._engine.call("GET", f"containers/{name}/json", sandbox_id=name)
        except SandboxError as exc:
            raise await self._container.died(exc) from exc
        if not data.get("State", {}).get("Running"):
            raise await self._container.died(SandboxDied(name, "the container stopped"))

    async def _file_call(self, coro: Any) -> Any:
        try:
            return await coro
        except SandboxError as exc:
            if isinstance(exc, SandboxFileError | InvalidArgument):
                raise
            raise await self._container.died(exc) from exc

    async def read_file(self, path: str, *, max_bytes: int) -> bytes:
        await self._running()
        target, stat = await self._file_call(self._stat(path))
        if int(stat.get("mode", 0)) & MODE_DIR:
            raise SandboxFileError(FileErrorReason.IS_A_DIRECTORY, path)
        if int(stat.get("size", 0)) > max_bytes:
            raise SandboxFileError(
                FileErrorReason.TOO_LARGE, path, f"{stat.get('size')} > {max_bytes} bytes"
            )
        async with self._archive(target, path) as body:
            try:
                content = await _tar.read_single(body.chunks(CHUNK), max_bytes)
            except OverflowError:  # it grew since the stat
                raise SandboxFileError(
                    FileErrorReason.TOO_LARGE, path, f"more than {max_bytes} bytes"
                ) from None
            except tarfile.TarError as exc:
                raise SandboxFileError(
                    FileErrorReason.OTHER, path, f"bad archive from Docker: {exc}"
                ) from exc
        if content is None:
            raise SandboxFileError(FileErrorReason.OTHER, path, "not a regular file")
        return content

    async def _mkdirs(self, path: str) -> None:
        """Create directory ``path`` and missing parents, owned by the sandbox user."""
        missing: list[str] = []
        current = path
        while current != "/":
            try:
                _, stat = await self._stat(current)
            except SandboxFileError as exc:
                if exc.reason != FileErrorReason.NOT_FOUND:
                    raise
                missing.append(current)
                current = posixpath.dirname(current)
                continue
            if not int(stat.get("mode", 0)) & MODE_DIR:
                raise SandboxFileError(
                    FileErrorReason.NOT_A_DIRECTORY, path, f"{current} is a file"
                )
            break
        if missing:
            uid = max(self._container.uid, 0)
            names = [posixpath.relpath(p, current) for p in reversed(missing)]
            await self._engine.put_archive(
                self._container.name, current, _tar.directories(names, uid=uid, gid=uid)
            )

    async def write_file(self, path: str, data: bytes, *, mode: int) -> None:
        parent, name = posixpath.split(path)
        uid = max(self._container.uid, 0)

        def archive() -> AsyncIterator[bytes]:
            return _tar.single_file(name, data, mode=mode, uid=uid, gid=uid)

        await self._running()
        try:
            await self._file_call(self._engine.put_archive(self._container.name, parent, archive()))
        except SandboxFileError as exc:
            if exc.reason != FileErrorReason.NOT_FOUND:
                raise
            await self._file_call(self._mkdirs(parent))
            await self._file_call(self._engine.put_archive(self._container.name, parent, archive()))

    async def put_archive(self, path: str, archive: AsyncIterable[bytes]) -> None:
        await self._running()
        await self._file_call(self._mkdirs(path))
        uid = max(self._container.uid, 0)
        await self._file_call(
            self._engine.put_archive(self._container.name, path, _tar.owned_by(archive, uid, uid))
        )

    @asynccontextmanager
    async def get_archive(self, path: str) -> AsyncIterator[AsyncIterator[bytes]]:
        await self._running()
        target, _ = await self._file_call(self._stat(path))
        async with self._archive(target, path) as body:
            yield body.chunks(CHUNK)
