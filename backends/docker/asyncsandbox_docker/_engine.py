"""The Docker Engine API, through aiodocker, with a deadline on every call and errors
translated to asyncsandbox's tree at this boundary (no aiodocker or aiohttp exception
leaves this module).

Docker 20.10 (Debian's) can wedge: calls on some containers, then ``info`` itself, stop
answering while ``/_ping`` still does (moby/moby#46661). So every call is bounded, and a
call that runs out of time is diagnosed with an ``info`` probe: if the daemon answers, only
that container is lost (:class:`SandboxDied`); if not, the daemon is (:class:`BackendUnavailable`).

The streams the Engine hands out (a hijacked exec or attach connection, an answer's body)
are objects of this module, whose every method translates errors the same way: callers
see asyncsandbox's errors only, whether a request failed or a transfer broke later.
aiodocker's private API is used in one place, :data:`PRIVATE_API` (each use says why), which
a test checks against the installed aiodocker.
"""

from __future__ import annotations

import io
import json
import os
from collections.abc import AsyncIterable, AsyncIterator, Iterator, Mapping
from contextlib import asynccontextmanager, contextmanager
from typing import Any

import aiodocker
import aiohttp
import anyio
from aiodocker.execs import Exec
from aiodocker.stream import Stream
from yarl import URL

from asyncsandbox import (
    BackendUnavailable,
    FileErrorReason,
    InvalidArgument,
    SandboxDied,
    SandboxError,
    SandboxFileError,
    SandboxNotFound,
    Timeouts,
)

INFO_DEADLINE = 10.0
START_HINT = (
    "Start the Docker daemon (`sudo systemctl start docker`, or `dockerd`), or point "
    "DOCKER_HOST (or DockerBackend(url=...)) at one that runs"
)

# Daemon answers that mean "busy, try again" rather than "no".
_OVERLOADED = ("too many open files", "resource temporarily unavailable", "try again later")


class Engine:
    """A connection pool to one Docker daemon."""

    def __init__(self, url: str | None, *, max_connections: int) -> None:
        # DOCKER_HOST wins over a docker context, as for the docker CLI (aiodocker would
        # read a context first).
        self._url = url if url is not None else (os.environ.get("DOCKER_HOST") or None)
        self.timeouts = Timeouts()
        """The backend's deadlines (set by :meth:`open`): ``operation`` bounds each call
        (a container whose calls exceed it is reported lost), ``cleanup`` each kill."""
        self._max_connections = max_connections
        self._docker: aiodocker.Docker | None = None
        self.wedged = False
        """Whether ``info`` went unanswered and no call was answered since (asking the
        daemon why a sandbox died is then pointless)."""

    @property
    def docker(self) -> aiodocker.Docker:
        if self._docker is None:
            raise BackendUnavailable("the docker backend is not open (use it through a Session)")
        return self._docker

    @property
    def host(self) -> str:
        """The daemon's address, as aiodocker composes URLs with it."""
        return self.docker.docker_host

    async def open(self, timeouts: Timeouts) -> dict[str, Any]:
        """Connect and check that the daemon answers ``info``; return that answer. Calls
        are bounded by ``timeouts`` from now on."""
        self.timeouts = timeouts
        try:
            docker = await _bounded_client(self._url, self._max_connections)
        except (ValueError, OSError, AssertionError, aiodocker.DockerError) as exc:
            # With no DOCKER_HOST and no socket where it looks, aiodocker fails an assert
            # (AssertionError; ValueError under python -O); a broken docker context is a
            # DockerError.
            raise BackendUnavailable(_no_engine(self._url, exc), retryable=False) from exc
        self._docker = docker
        try:
            return await self.info()
        except BaseException:
            with anyio.CancelScope(shield=True):
                await self.close()
            raise

    async def close(self) -> None:
        docker, self._docker = self._docker, None
        if docker is not None:
            await docker.close()
            # A connector given to aiodocker stays its giver's to close (aiodocker >= 0.25;
            # older ones closed it already, and closing twice is harmless).
            await docker.connector.close()

    async def info(self, deadline: float = INFO_DEADLINE) -> dict[str, Any]:
        """``GET /info``: the health check that notices a wedged daemon (``/_ping`` does not)."""
        with anyio.move_on_after(deadline):
            with _mapped("info"):
                result = dict(await self.docker.system.info())
            self.wedged = False
            return result
        self.wedged = True
        raise BackendUnavailable(
            f"the Docker daemon ({self.host}) did not answer `info` within "
            f"{deadline:g}s: it is overloaded or wedged (Docker 20.10: moby/moby#46661; "
            "restart it)",
            retryable=False,
        )

    async def diagnose(
        self, what: str, sandbox_id: str | None, seconds: float | None = None
    ) -> SandboxError:
        """A call ran out of time (``seconds``; default: ``timeouts.operation``): is the
        container lost, or the whole daemon?"""
        try:
            await self.info(deadline=5.0)
        except BackendUnavailable as exc:
            return exc
        seconds = self.timeouts.operation if seconds is None else seconds
        within = "in time" if seconds is None else f"within {seconds:g}s"
        if sandbox_id is None:
            return BackendUnavailable(f"Docker did not answer {what} {within}")
        return SandboxDied(sandbox_id, f"lost: Docker did not answer {what} {within}")

    async def call(
        self,
        method: str,
        path: str,
        *,
        params: Mapping[str, Any] | None = None,
        body: Any = None,
        sandbox_id: str | None = None,
        file_path: str | None = None,
        deadline: float | None = None,
    ) -> Any:
        """One JSON call, bounded by ``deadline`` (default: ``timeouts.operation``)."""
        limit = self.timeouts.operation if deadline is None else deadline
        with anyio.move_on_after(limit):
            with _mapped(f"{method} {path}", sandbox_id, file_path):
                result = await _query_json(self.docker, method, path, _params(params), body)
            self.wedged = False
            return result
        raise await self.diagnose(f"{method} {path}", sandbox_id, limit)

    @asynccontextmanager
    async def raw(
        self,
        method: str,
        path: str,
        *,
        params: Mapping[str, Any] | None = None,
        body: AsyncIterable[bytes] | bytes | None = None,
        sandbox_id: str | None = None,
        file_path: str | None = None,
        headers: Mapping[str, str] | None = None,
    ) -> AsyncIterator[Body]:
        """A streaming call: the deadline covers the answer's headers, not the transfer."""
        what = f"{method} {path}"
        with (
            anyio.move_on_after(self.timeouts.operation) as scope,
            _mapped(what, sandbox_id, file_path),
        ):
            response = await _do_query(
                self.docker,
                method,
                path,
                _params(params),
                body,
                dict(headers or {"Content-Type": "application/x-tar"}),
            )
        if scope.cancelled_caught:
            raise await self.diagnose(what, sandbox_id)
        try:
            yield Body(response, what)
        finally:
            response.close()

    async def put_archive(
        self, container: str, path: str, body: bytes | AsyncIterable[bytes]
    ) -> None:
        """Unpack a tar archive into directory ``path`` of ``container``."""
        if isinstance(body, bytes):
            body = io.BytesIO(body)  # type: ignore[assignment]  # aiohttp streams file objects
        async with self.raw(
            "PUT",
            f"containers/{container}/archive",
            params={"path": path, "noOverwriteDirNonDir": True},
            body=body,
            sandbox_id=container,
            file_path=path,
        ):
            pass

    async def head(
        self, path: str, *, params: Mapping[str, Any], sandbox_id: str, file_path: str
    ) -> Mapping[str, str]:
        """A ``HEAD`` call's answer headers (through aiohttp: aiodocker's requests read an
        error's body, which a ``HEAD`` answer does not have)."""
        docker = self.docker
        with anyio.move_on_after(self.timeouts.operation):
            with _mapped(f"HEAD {path}", sandbox_id, file_path):
                if docker.api_version == "auto":  # resolved by the first versioned call
                    await docker.version()
                url = URL(f"{docker.docker_host}/{docker.api_version}/{path}")
                async with docker.session.head(url, params=_params(params)) as response:
                    status, headers = response.status, dict(response.headers)
            if status == 404:
                text = headers.get("X-Docker-Error", "")  # absent on 20.10
                if not await self._container_exists(sandbox_id):
                    raise SandboxNotFound(sandbox_id, f"container {sandbox_id!r} not found")
                raise SandboxFileError(FileErrorReason.NOT_FOUND, file_path, text or None)
            if status >= 400:
                raise BackendUnavailable(f"Docker failed HEAD {path} ({status})")
            self.wedged = False
            return headers
        raise await self.diagnose(f"HEAD {path}", sandbox_id)

    async def _container_exists(self, sandbox_id: str) -> bool:
        try:
            await self.call("GET", f"containers/{sandbox_id}/json", sandbox_id=sandbox_id)
        except SandboxNotFound:
            return False
        return True

    def attach_stream(self, container: str) -> Hijacked:
        """The stdio of a container (``POST /containers/{id}/attach``), not yet connected."""

        # Not `containers.container(id).attach()`: it inspects the container first (one
        # more daemon call per sandbox created), to learn whether it has a TTY; ours never.
        async def setup() -> tuple[URL, bytes | None, bool]:
            query = {"stream": "1", "stdin": "1", "stdout": "1", "stderr": "1", "logs": "0"}
            return URL(f"containers/{container}/attach").with_query(query), None, False

        return Hijacked(self, Stream(self.docker, setup, None), f"attach {container}", container)

    def exec_stream(self, exec_id: str, sandbox_id: str) -> Hijacked:
        """The stdio of a created exec (``POST /exec/{id}/start``), not yet connected."""
        # tty given: aiodocker would otherwise inspect the exec first (one more round trip).
        stream = Exec(self.docker, exec_id, tty=False).start(timeout=None, detach=False)
        return Hijacked(self, stream, "the exec stream", sandbox_id)


class Hijacked:
    """A hijacked connection: the multiplexed stdout and stderr of a process, and its stdin.

    Every method raises asyncsandbox's errors only: a stream that breaks is
    :class:`BackendUnavailable` (not retryable: what was sent may have been acted on).
    """

    def __init__(self, engine: Engine, stream: Stream, what: str, sandbox_id: str) -> None:
        self._engine = engine
        self._stream = stream
        self._what = what
        self._sandbox_id = sandbox_id

    async def connect(self) -> None:
        """Make the call and take over its connection, within the call deadline."""
        with anyio.move_on_after(self._engine.timeouts.operation):
            with _mapped(self._what, self._sandbox_id), _broken(self._what):
                await self._stream.__aenter__()  # `async with stream` connects (and closes)
            return
        raise await self._engine.diagnose(self._what, self._sandbox_id)

    async def read(self) -> tuple[int, bytes] | None:
        """The next ``(stream, data)`` (1: stdout, 2: stderr); None at the end."""
        with _mapped(self._what, self._sandbox_id), _broken(self._what):
            message = await self._stream.read_out()
        return None if message is None else (message.stream, message.data)

    async def write(self, data: bytes) -> None:
        with _broken(self._what):
            await self._stream.write_in(data)

    async def close(self) -> None:
        """Half-close stdin and release the connection (idempotent)."""
        with _broken(self._what):
            await self._stream.close()


class Body:
    """The body of a streamed answer; a transfer that breaks is :class:`BackendUnavailable`
    (not retryable: the call did something)."""

    def __init__(self, response: aiohttp.ClientResponse, what: str) -> None:
        self._content = response.content
        self._what = what

    async def read(self, limit: int) -> bytes:
        """Up to ``limit`` bytes (fewer only at the end)."""
        with _broken(self._what):
            return await self._content.read(limit)

    async def chunks(self, size: int) -> AsyncIterator[bytes]:
        """The rest, in chunks of at most ``size`` bytes."""
        iterator = aiter(self._content.iter_chunked(size))
        while True:
            with _broken(self._what):
                chunk = await anext(iterator, None)
            if chunk is None:
                return
            yield chunk

    async def lines(self) -> AsyncIterator[bytes]:
        """The rest, line by line (a JSON stream: events, pull progress)."""
        while True:
            with _broken(self._what):
                line = await self._content.readline()
            if not line:
                return
            yield line


# -- aiodocker's private API, used here only -----------------------------------------------
#
# aiodocker has a public method per endpoint, but no public request of one's own making.
# The generic JSON call serves every endpoint with one deadline and one translation (the
# per-endpoint methods wrap answers in objects of their own, and some add round trips:
# ``container.attach()`` and ``Exec.start()`` without a tty inspect first). The archive,
# events and pull endpoints are streamed as they come: the public ``get_archive`` holds a
# whole archive in memory, ``put_archive`` labels a tar body JSON, ``events`` runs a task
# of its own, and ``pull`` reports failures in its own way. tests/test_docker_engine.py checks
# that the installed versions still have each of these.

PRIVATE_API: tuple[tuple[type[Any], str, tuple[str, ...]], ...] = (
    # (class, attribute, the keyword arguments we pass)
    (aiodocker.Docker, "_query_json", ("params", "data")),
    (aiodocker.Docker, "_do_query", ("params", "data", "headers", "timeout")),
    # Read by aiohttp's connector (set in its __init__): the pool size of a connector that
    # aiodocker built and we cannot rebuild (TLS or SSH set up from the environment).
    (aiohttp.BaseConnector, "_limit", ()),
)


async def _query_json(
    docker: aiodocker.Docker,
    method: str,
    path: str,
    params: dict[str, Any] | None,
    body: Any,
) -> Any:
    return await docker._query_json(path, method, params=params, data=body)


async def _do_query(
    docker: aiodocker.Docker,
    method: str,
    path: str,
    params: dict[str, Any] | None,
    body: AsyncIterable[bytes] | bytes | None,
    headers: dict[str, str],
) -> aiohttp.ClientResponse:
    # timeout=None: the transfer has no deadline (ours covers the answer's headers).
    return await docker._do_query(
        path, method, params=params, data=body, headers=headers, timeout=None
    )


async def _bounded_client(url: str | None, max_connections: int) -> aiodocker.Docker:
    """An aiodocker client whose pool holds at most ``max_connections`` connections (hijacked
    exec and attach streams count); aiodocker's own connector has aiohttp's default, 100."""
    docker = aiodocker.Docker(url=url)  # finds the daemon as aiodocker does
    connector = docker.connector
    if not isinstance(connector, aiohttp.UnixConnector):
        # Built from the environment's TLS or SSH settings, which only aiodocker knows:
        # bounded in place (PRIVATE_API).
        connector._limit = max_connections
        return docker
    path = connector.path
    await docker.close()
    bounded = aiohttp.UnixConnector(path, limit=max_connections)
    # The host part is a placeholder, as aiodocker's own for Unix sockets.
    return aiodocker.Docker(url="unix://localhost", connector=bounded)


def _params(params: Mapping[str, Any] | None) -> dict[str, Any] | None:
    if params is None:
        return None
    out: dict[str, Any] = {}
    for key, value in params.items():
        if isinstance(value, bool):
            out[key] = "1" if value else "0"
        elif isinstance(value, dict | list):
            out[key] = json.dumps(value)
        else:
            out[key] = value
    return out


@contextmanager
def _mapped(
    what: str,
    sandbox_id: str | None = None,
    file_path: str | None = None,
) -> Iterator[None]:
    """The translation of aiodocker and aiohttp errors into asyncsandbox's tree, around
    every request (a transfer that breaks later: :func:`_broken`)."""
    try:
        yield
    except aiodocker.DockerError as exc:
        raise _translate(exc, what, sandbox_id, file_path) from exc
    except (aiohttp.ClientError, OSError) as exc:
        raise BackendUnavailable(
            f"Docker connection failed ({what}): {exc}", retryable=True
        ) from exc
    except ValueError as exc:  # an answer that is not JSON: no Docker daemon sent it
        raise BackendUnavailable(
            f"an invalid answer to {what} (is it a Docker daemon?): {exc}", retryable=False
        ) from exc


@contextmanager
def _broken(what: str) -> Iterator[None]:
    """The translation of a transfer that broke after the call was answered: not retryable
    (the call did something). aiodocker's streams raise RuntimeError once closed."""
    try:
        yield
    except (aiohttp.ClientError, OSError, RuntimeError) as exc:
        raise BackendUnavailable(
            f"Docker connection failed ({what}): {exc}", retryable=False
        ) from exc


def _no_engine(url: str | None, exc: BaseException) -> str:
    """Why ``aiodocker.Docker(url)`` could not even be made, and what to do."""
    if isinstance(exc, aiodocker.DockerError):
        return f"no Docker engine to connect to: the client configuration is invalid: {exc.message}"
    if url is None:
        return (
            "no Docker engine to connect to: DOCKER_HOST is not set and no socket exists at "
            "/run/docker.sock, /var/run/docker.sock or ~/.docker/run/docker.sock. " + START_HINT
        )
    return f"no Docker engine to connect to: cannot use the address {url!r}: {exc}"


def _translate(
    exc: aiodocker.DockerError,
    what: str,
    sandbox_id: str | None = None,
    file_path: str | None = None,
) -> SandboxError:
    status, message = exc.status, str(exc.message)
    lowered = message.lower()
    if status == 900:  # aiodocker: cannot connect at all
        hint = START_HINT
        if "permission denied" in lowered:
            hint = "Run as root, or add your user to the 'docker' group"
        return BackendUnavailable(
            f"cannot connect to the Docker daemon: {message}. {hint}",
            retryable=True,
        )
    if status == 404 and sandbox_id is not None and "no such container" in lowered:
        return SandboxNotFound(sandbox_id, f"container {sandbox_id!r} not found")
    if file_path is not None:
        if status == 404:
            return SandboxFileError(FileErrorReason.NOT_FOUND, file_path, message)
        for needle, reason in _FILE_REASONS:
            if needle in lowered:
                return SandboxFileError(reason, file_path, message)
    if status == 409 and sandbox_id is not None and "not running" in lowered:
        return SandboxDied(sandbox_id, message)
    if status in (429, 503) or any(text in lowered for text in _OVERLOADED):
        return BackendUnavailable(f"Docker is overloaded ({what}): {message}", retryable=True)
    if status == 400:
        return InvalidArgument(f"Docker refused {what}: {message}")
    return BackendUnavailable(f"Docker failed {what} ({status}): {message}", retryable=False)


# Archive-endpoint answers about the path rather than the container.
_FILE_REASONS = (
    ("no such file", FileErrorReason.NOT_FOUND),
    ("not a directory", FileErrorReason.NOT_A_DIRECTORY),
    ("cannot overwrite directory", FileErrorReason.IS_A_DIRECTORY),
    ("cannot overwrite non-directory", FileErrorReason.NOT_A_DIRECTORY),
    ("is a directory", FileErrorReason.IS_A_DIRECTORY),
    ("permission denied", FileErrorReason.PERMISSION),
    ("read-only file system", FileErrorReason.PERMISSION),
)
