"""One Docker sandbox: its container, and the path its commands and files take.

There are two paths (httpcore's model: one small module each, chosen once):
``_fast_path.py`` (the resident executor: no daemon work per command) and
``_api_path.py`` (an Engine API exec per command, the archive endpoint for files). The
backend picks one when it creates or attaches the sandbox; the fast path hands over to the
Engine API path for good if its executor fails (:meth:`Path.serving`).
"""

from __future__ import annotations

import contextlib
import json
import math
import time
import uuid
from abc import ABCMeta, abstractmethod
from collections import defaultdict
from collections.abc import AsyncIterable, AsyncIterator, Mapping
from contextlib import AbstractAsyncContextManager
from typing import Any

import anyio
import anyio.lowlevel
from anyio import TypedAttributeSet, typed_attribute

from asyncsandbox import (
    BackendUnavailable,
    InvalidArgument,
    SandboxDied,
    SandboxError,
    SandboxInfo,
    SandboxNotFound,
    SandboxOOMKilled,
    SandboxStatus,
)
from asyncsandbox.abc import ExitStatus, InteractiveProcess, OutputCallback, SandboxHandle
from asyncsandbox.log import get_logger

from ._engine import Engine
from ._store import SNAPSHOT_LABEL, SNAPSHOT_OWNER_LABEL, Store, snapshot_ref

log = get_logger("asyncsandbox.docker")

OOM_EVENT_GRACE = 0.5
_STATES = {
    "created": SandboxStatus.CREATING,
    "running": SandboxStatus.RUNNING,
    "restarting": SandboxStatus.RUNNING,
    "paused": SandboxStatus.STOPPED,
    "exited": SandboxStatus.STOPPED,
    "removing": SandboxStatus.REMOVING,
    "dead": SandboxStatus.DEAD,
}
OWNED_MODE = "755"
"""The mode of a recyclable container's workdir and home (tmpfs mounts of the sandbox
user's) when it is created, and after each reset."""

# Run as the sandbox user: its every other process killed (until none is left), then the
# writable places (the arguments after the first, /dev/shm, /dev/mqueue) and its IPC
# objects emptied, the workdir's and the home's mode (the first argument) and extended
# attributes set back; exits non-zero, saying what is left, unless all of it is clean.
# Only shell builtins while processes may remain (a fork would be one more process to
# find); after that, a reset starts two processes (find, python3) unless the episode left
# what cannot be deleted as it is (then chmod, and find again) or IPC objects (then
# ipcrm): each process started costs more CPU than all the builtins (a reset per episode
# started about 22 when each place had its own chmod, find and ls).
_RESET = r"""
for attempt in 1 2 3 4 5 6 7 8 9 10 11 12 13 14 15 16 17 18 19 20; do
    kill -9 -1 2>/dev/null
    left=0
    for p in /proc/[0-9]*; do
        [ "${p#/proc/}" = "$$" ] && continue
        [ -O "$p" ] && left=$((left + 1))
    done
    [ "$left" = 0 ] && break
done
[ "$left" = 0 ] || { echo "$left processes survived"; exit 1; }
owned_mode=$1
shift
RESTORE='
import os, sys
mode = int(sys.argv[1], 8)
for place in sys.argv[2:]:
    try:
        for name in os.listxattr(place):
            os.removexattr(place, name)
        os.chmod(place, mode)
    except OSError as exc:
        print(place, "keeps its attributes or mode:", exc)
        sys.exit(1)
'
workdir=$3 home=$4
n=$#
for dir in "$@" /dev/shm /dev/mqueue; do
    [ -d "$dir" ] && set -- "$@" "$dir"
done
shift "$n"
# One process for the usual episode: the places emptied at once. What the episode made
# unreadable or unwritable (the places themselves included) is opened up and emptied again.
open=1
for dir in "$@"; do
    [ -r "$dir" ] && [ -w "$dir" ] && [ -x "$dir" ] || open=0
done
if [ "$#" -gt 0 ] && { [ "$open" = 0 ] || ! find "$@" -mindepth 1 -delete 2>/dev/null; }; then
    chmod -R u+rwX "$@" 2>/dev/null
    find "$@" -mindepth 1 -delete 2>/dev/null
fi
status=0
for dir in "$@"; do
    if ! { [ -r "$dir" ] && [ -x "$dir" ]; }; then
        echo "$dir is not readable"; status=1; continue
    fi
    for entry in "$dir"/* "$dir"/.[!.]* "$dir"/..?*; do
        if [ -e "$entry" ] || [ -L "$entry" ]; then
            echo "$dir is not empty"; status=1; break
        fi
    done
done
# System V IPC objects: a line each after the header of /proc/sysvipc/* (ipcs without it).
ipc_left() {
    for table in msg sem shm; do
        if ! [ -r "/proc/sysvipc/$table" ]; then
            [ -n "$(ipcs -q -m -s 2>/dev/null | grep '^0x')" ]
            return
        fi
        { read -r _ && read -r _; } < "/proc/sysvipc/$table" && return 0
    done
    return 1
}
if ipc_left; then
    ipcrm --all 2>/dev/null
    ! ipc_left || { echo "IPC objects remain"; status=1; }
fi
# The workdir and the home are the user's (the rest are root's): their mode back to a
# fresh sandbox's, and their extended attributes (POSIX ACLs included) gone, whatever the
# episode set (python3 is in every image: the agent is python3).
python3 -I -S -c "$RESTORE" "$owned_mode" "$workdir" "$home" || status=1
exit $status
"""


def info(
    name: str, state: str, labels: dict[str, str], image: str, created: float | None
) -> SandboxInfo:
    return SandboxInfo(
        id=name,
        status=_STATES.get(state, SandboxStatus.DEAD),
        labels=labels,
        image=image,
        created_at=created,
        backend="docker",
    )


class DockerAttributes(TypedAttributeSet):
    """Typed attributes of Docker sandboxes (``sandbox.extra(DockerAttributes.container_id)``)."""

    container_id: str = typed_attribute()
    image: str = typed_attribute()


class OomKills:
    """OOM kills per container, counted from the daemon's events (an exec's status alone
    cannot tell an OOM kill from a ``kill -9``)."""

    def __init__(self) -> None:
        self._counts: dict[str, int] = defaultdict(int)
        self._seen = anyio.Event()

    def record(self, name: str) -> None:
        self._counts[name] += 1
        self._seen.set()
        self._seen = anyio.Event()

    def count(self, name: str) -> int:
        return self._counts[name]

    async def since(self, name: str, before: int) -> bool:
        """Whether ``name`` was OOM-killed since its count was ``before`` (the event may
        come a little after the exec's status)."""
        with anyio.move_on_after(OOM_EVENT_GRACE):
            while self._counts[name] <= before:
                await self._seen.wait()
        return self._counts[name] > before


class Container:
    """What both paths know of one container, and why it died when a call failed."""

    def __init__(
        self,
        engine: Engine,
        name: str,
        image: str,
        labels: Mapping[str, str],
        *,
        uid: int,
        gid: int,
        ooms: OomKills,
    ) -> None:
        self.engine = engine
        self.name = name
        self.image = image
        self.uid = uid
        """The sandbox user's uid and gid, or -1 for root."""
        self.gid = gid
        self.ooms = ooms
        self.lost: SandboxDied | None = None
        """Set once the container stopped answering (another call would hang too)."""
        self._expires = float(labels.get("asyncsandbox.expires") or "inf")

    def check(self) -> None:
        if self.lost is not None:
            raise self.lost

    async def died(
        self, error: SandboxError, *, stopping: bool = False, ooms_before: int | None = None
    ) -> SandboxError:
        """Turn "not running" into why: killed for memory, lifetime over, removed.
        ``stopping``: the executor exited, so the container stops; a container Docker
        still shows running (gVisor's sandbox, killed for memory, outlived the executor's
        end under load) is waited for, at most ``timeouts.cleanup``. ``ooms_before``: this
        container's OOM kills counted (:class:`OomKills`) before the failed call; a
        container killed (137) with Docker's OOM event since is killed for memory even where
        its ``OOMKilled`` flag is not set yet (the event and the exit come apart)."""
        if isinstance(error, SandboxNotFound):
            return SandboxDied(self.name, "removed")
        if isinstance(error, SandboxDied) and error.reason.startswith("lost"):
            return error
        if not isinstance(error, SandboxDied | BackendUnavailable) or self.engine.wedged:
            return error
        try:
            state = await self._state()
            if state.get("Running") and stopping:
                # Bounded here (a slow stop is no sign of a wedged daemon), not by the call.
                with anyio.move_on_after(self.engine.timeouts.cleanup):
                    await self.engine.call(
                        "POST",
                        f"containers/{self.name}/wait",
                        params={"condition": "not-running"},
                        sandbox_id=self.name,
                        deadline=math.inf,
                    )
                state = await self._state()
        except SandboxNotFound:
            return SandboxDied(self.name, "removed")
        except SandboxError:
            return error
        if state.get("Running"):
            return error  # the sandbox lives: the error was the connection's
        if state.get("OOMKilled") or (
            ooms_before is not None
            and state.get("ExitCode") == 137
            and await self.ooms.since(self.name, ooms_before)
        ):
            return SandboxOOMKilled(self.name, "the container exceeded its memory limit")
        if time.time() >= self._expires - 1:
            return SandboxDied(self.name, "max lifetime exceeded")
        return SandboxDied(
            self.name,
            f"the container stopped ({state.get('Status')}, exit status {state.get('ExitCode')})",
        )

    async def _state(self) -> dict[str, Any]:
        data = await self.engine.call("GET", f"containers/{self.name}/json", sandbox_id=self.name)
        state: dict[str, Any] = data.get("State", {})
        return state


class Path(metaclass=ABCMeta):
    """How a sandbox's commands and file operations reach its container (the handle's
    methods of the same names, after its checks)."""

    def serving(self) -> Path:
        """The path that serves now: this one, or the one it handed over to for good."""
        return self

    @abstractmethod
    async def exec(
        self,
        argv: tuple[str, ...],
        *,
        cwd: str,
        env: Mapping[str, str],
        stdin: bytes | None,
        on_output: OutputCallback,
    ) -> ExitStatus: ...

    @abstractmethod
    def interact(
        self,
        argv: tuple[str, ...],
        *,
        cwd: str,
        env: Mapping[str, str],
        stdin: bool = True,
    ) -> AbstractAsyncContextManager[InteractiveProcess]: ...

    @abstractmethod
    async def read_file(self, path: str, *, max_bytes: int) -> bytes: ...

    @abstractmethod
    async def write_file(self, path: str, data: bytes, *, mode: int) -> None: ...

    @abstractmethod
    async def put_archive(self, path: str, archive: AsyncIterable[bytes]) -> None: ...

    @abstractmethod
    def get_archive(self, path: str) -> AbstractAsyncContextManager[AsyncIterator[bytes]]: ...

    async def aclose(self) -> None:  # noqa: B027 - a hook: only the fast path holds anything
        """Stop serving: the sandbox is being removed."""


class DockerSandbox(SandboxHandle):
    """:param store: the backend's containers and snapshots.
    :param path: how its commands and files reach the container (chosen by the backend).
    :param recyclable: whether :meth:`reset` may run (see ``DockerBackend(recyclable=)``).
    :param snapshot: the snapshot it was started from."""

    def __init__(
        self,
        store: Store,
        container: Container,
        path: Path,
        *,
        recyclable: bool,
        snapshot: str | None = None,
        workdir: str = "/workspace",
    ) -> None:
        self._store = store
        self._recyclable = recyclable
        self._container = container
        self._path = path
        self._snapshot = snapshot  # started from it
        self._workdir = workdir

    @property
    def id(self) -> str:
        return self._container.name

    @property
    def extra_attributes(self) -> Mapping[Any, Any]:
        return {
            DockerAttributes.container_id: lambda: self._container.name,
            DockerAttributes.image: lambda: self._container.image,
        }

    async def exec(
        self,
        argv: tuple[str, ...],
        *,
        cwd: str,
        env: Mapping[str, str],
        stdin: bytes | None,
        on_output: OutputCallback,
        timeout: float | None = None,  # advisory (see the contract)
    ) -> ExitStatus:
        self._container.check()
        path = self._path.serving()
        return await path.exec(argv, cwd=cwd, env=env, stdin=stdin, on_output=on_output)

    def interact(
        self,
        argv: tuple[str, ...],
        *,
        cwd: str,
        env: Mapping[str, str],
        stdin: bool = True,
    ) -> AbstractAsyncContextManager[InteractiveProcess]:
        self._container.check()
        return self._path.serving().interact(argv, cwd=cwd, env=env, stdin=stdin)

    async def read_file(self, path: str, *, max_bytes: int) -> bytes:
        self._container.check()
        return await self._path.serving().read_file(path, max_bytes=max_bytes)

    async def write_file(self, path: str, data: bytes, *, mode: int) -> None:
        self._container.check()
        await self._path.serving().write_file(path, data, mode=mode)

    async def put_archive(self, path: str, archive: AsyncIterable[bytes]) -> None:
        self._container.check()
        await self._path.serving().put_archive(path, archive)

    @contextlib.asynccontextmanager
    async def get_archive(self, path: str) -> AsyncIterator[AsyncIterator[bytes]]:
        self._container.check()
        async with self._path.serving().get_archive(path) as chunks:
            yield chunks

    async def inspect(self) -> SandboxInfo:
        name = self._container.name
        data = await self._container.engine.call("GET", f"containers/{name}/json", sandbox_id=name)
        config = data.get("Config", {})
        return info(
            name, data["State"]["Status"], config.get("Labels") or {}, config.get("Image", ""), None
        )

    async def remove(self) -> None:
        await self._path.aclose()
        container = self._container
        if container.lost is not None:
            # It stopped answering: another call would hang too. The sweep will retry.
            log.warning(
                "docker.sandbox.left_for_sweep",
                sandbox_id=container.name,
                reason=container.lost.reason,
            )
            return
        if not await self._store.force_remove(container.name):
            raise BackendUnavailable(f"could not remove container {container.name}", retryable=True)
        if self._snapshot is not None:
            await self._store.forget_deleted_snapshot(self._snapshot)

    async def reset(self) -> None:
        """Kill every process of the sandbox user and empty every tmpfs it can write to
        (``recyclable`` containers: nothing else is writable), through the sandbox's own
        command path; raise unless the script confirms that nothing is left."""
        if not self._recyclable:
            raise InvalidArgument("only recyclable Docker sandboxes can be reset")
        home = "/home/sandbox"
        output = bytearray()

        async def collect(stream: str, data: bytes) -> None:
            output.extend(data)

        status = await self.exec(
            ("/bin/sh", "-c", _RESET, "reset", OWNED_MODE, "/tmp", "/var/tmp", self._workdir, home),
            cwd="/",
            env={"LC_ALL": "C"},
            stdin=None,
            on_output=collect,
        )
        if status.returncode != 0:
            said = output.decode(errors="replace").strip()[-2000:]
            raise BackendUnavailable(f"sandbox {self.id} could not be reset: {said}")

    async def snapshot(self, *, labels: Mapping[str, str] | None = None) -> str:
        """A ``docker commit`` of the container (paused meanwhile) to an image of our own
        repository; the image's configuration is the original image's environment only, so
        that a sandbox started from it gets its own settings (as a fresh one would)."""
        self._container.check()
        engine, name = self._container.engine, self._container.name
        snapshot_id = "s-" + uuid.uuid4().hex[:12]
        repository, _, tag = snapshot_ref(snapshot_id).partition(":")
        try:
            container = await engine.call("GET", f"containers/{name}/json", sandbox_id=name)
            base = await engine.call("GET", f"images/{container['Image']}/json")
            env = (base.get("Config") or {}).get("Env") or []
        except SandboxError as error:
            raise await self._container.died(error) from error
        try:
            with anyio.CancelScope(shield=True):  # a commit in flight happens anyway
                await engine.call(
                    "POST",
                    "commit",
                    params={"container": name, "repo": repository, "tag": tag, "pause": True},
                    body={
                        "Env": env,
                        "Labels": {
                            SNAPSHOT_LABEL: snapshot_id,
                            SNAPSHOT_OWNER_LABEL: json.dumps(dict(labels or {})),
                        },
                    },
                    sandbox_id=name,
                    deadline=engine.timeouts.create,
                )
            await anyio.lowlevel.checkpoint()
        except BaseException:
            with anyio.CancelScope(shield=True), contextlib.suppress(SandboxError):
                await self._store.delete_snapshot(snapshot_id)
            raise
        return snapshot_id
