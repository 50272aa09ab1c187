"""The Docker Engine API, through aiodocker, with a deadline on every call and errors
translated to asyncsandbox's tree at this boundary (no aiodocker or aiohttp exception
leaves this module).

Docker 20.10 (Debian's) can wedge: calls on some containers, then ``info`` itself, stop
answering while ``/_ping`` still does (moby/moby#46661). So every call is bounded, and a
call that runs out of time is diagnosed with an ``info`` probe: if the daemon answers, only
that container is lost (:class:`SandboxDied`); if not, the daemon is (:class:`BackendUnavailable`).
"""

from __future__ import annotations

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

    def __init__(self, url: str | None, *, call_deadline: float, max_connections: int) -> None:
        # DOCKER_HOST wins over a docker context, as for the docker CLI (aiodocker would
        # read a context first).
        self._url = url if url is not None else (os.environ.get("DOCKER_HOST") or None)
        self.call_deadline = call_deadline
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

    async def open(self) -> dict[str, Any]:
        """Connect and check that the daemon answers ``info``; return that answer."""
        try:
            docker = aiodocker.Docker(url=self._url)
        except (ValueError, OSError, AssertionError, aiodocker.DockerError) as exc:
            # With no DOCKER_HOST and no socket where it looks, aiodocker fails an assert
            # (AssertionError; ValueError under python -O); a broken docker context is a
            # DockerError.
            raise BackendUnavailable(_no_engine(self._url, exc), retryable=False) from exc
        # aiodocker's own connector is unbounded; bound the pool (hijacked exec streams count).
        connector = docker.session.connector
        if connector is not None:
            connector._limit = self._max_connections
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

    async def info(self, deadline: float = INFO_DEADLINE) -> dict[str, Any]:
        """``GET /info``: the health check that notices a wedged daemon (``/_ping`` does not)."""
        with anyio.move_on_after(deadline):
            with _mapped("info"):
                result: dict[str, Any] = await self.docker._query_json("info")
            self.wedged = False
            return result
        self.wedged = True
        raise BackendUnavailable(
            f"the Docker daemon ({self.docker.docker_host}) did not answer `info` within "
            f"{deadline:g}s: it is overloaded or wedged (Docker 20.10: moby/moby#46661; "
            "restart it)",
            retryable=False,
        )

    async def _diagnose(self, what: str, sandbox_id: str | None) -> SandboxError:
        """A call ran out of time: is the container lost, or the whole daemon?"""
        try:
            await self.info(deadline=5.0)
        except BackendUnavailable as exc:
            return exc
        seconds = self.call_deadline
        if sandbox_id is None:
            return BackendUnavailable(f"Docker did not answer {what} within {seconds:g}s")
        return SandboxDied(sandbox_id, f"lost: Docker did not answer {what} within {seconds:g}s")

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
        """One JSON call, bounded by ``deadline`` (default: the backend's call deadline)."""
        limit = self.call_deadline if deadline is None else deadline
        with anyio.move_on_after(limit):
            with _mapped(f"{method} {path}", sandbox_id, file_path):
                result = await self.docker._query_json(
                    path, method, params=_params(params), data=body
                )
            self.wedged = False
            return result
        raise await self._diagnose(f"{method} {path}", sandbox_id)

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
    ) -> AsyncIterator[aiohttp.ClientResponse]:
        """A streaming call: the deadline covers the answer's headers, not the transfer."""
        what = f"{method} {path}"
        with anyio.move_on_after(self.call_deadline) as scope, _mapped(what, sandbox_id, file_path):
            response = await self.docker._do_query(
                path,
                method,
                params=_params(params),
                data=body,
                headers=dict(headers or {"Content-Type": "application/x-tar"}),
                timeout=None,
            )
        if scope.cancelled_caught:
            raise await self._diagnose(what, sandbox_id)
        try:
            yield response
        except (aiohttp.ClientError, OSError) as exc:
            # The transfer broke after the answer began: not retryable (it did something).
            raise BackendUnavailable(
                f"Docker connection failed ({what}): {exc}", retryable=False
            ) from exc
        finally:
            response.close()

    async def head(
        self, path: str, *, params: Mapping[str, Any], sandbox_id: str, file_path: str
    ) -> Mapping[str, str]:
        """A ``HEAD`` call's answer headers (aiodocker cannot: it parses error bodies)."""
        docker = self.docker
        with anyio.move_on_after(self.call_deadline):
            with _mapped(f"HEAD {path}", sandbox_id, file_path):
                await docker._check_version()
                url = docker._canonicalize_url(path, versioned_api=True)
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
        raise await self._diagnose(f"HEAD {path}", sandbox_id)

    async def _container_exists(self, sandbox_id: str) -> bool:
        try:
            await self.call("GET", f"containers/{sandbox_id}/json", sandbox_id=sandbox_id)
        except SandboxNotFound:
            return False
        return True

    def attach_stream(self, container: str) -> Stream:
        """The hijacked stdio of a container (``POST /containers/{id}/attach``)."""

        async def setup() -> tuple[URL, bytes | None, bool]:
            query = {"stream": "1", "stdin": "1", "stdout": "1", "stderr": "1", "logs": "0"}
            return URL(f"containers/{container}/attach").with_query(query), None, False

        return Stream(self.docker, setup, None)

    def exec_stream(self, exec_id: str) -> Stream:
        """The hijacked stream of a created exec (``POST /exec/{id}/start``)."""
        return Exec(self.docker, exec_id, tty=False).start(timeout=None)


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
    every request (a streamed answer's transfer is mapped in :meth:`Engine.raw`)."""
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
