from __future__ import annotations

import base64
import builtins
import contextlib
import io
import json
import posixpath
import re
import tarfile
import time
import uuid
from collections import defaultdict
from collections.abc import AsyncIterable, AsyncIterator, Mapping, Sequence
from contextlib import asynccontextmanager
from importlib.resources import files
from typing import Any, Literal, Self

import aiohttp
import anyio
import anyio.abc
from anyio import TypedAttributeSet, typed_attribute

from asyncsandbox import (
    BackendUnavailable,
    FileErrorReason,
    InvalidArgument,
    LaunchError,
    SandboxDied,
    SandboxError,
    SandboxFileError,
    SandboxInfo,
    SandboxNotFound,
    SandboxOOMKilled,
    SandboxStatus,
)
from asyncsandbox.abc import (
    Backend,
    BackendCapabilities,
    ExitStatus,
    OutputCallback,
    SandboxHandle,
    SandboxSpec,
    ShellFiles,
    ShellProcess,
)
from asyncsandbox.log import get_logger

from . import _tar
from ._engine import Engine
from ._executor import Executor, ShellJob

__all__ = ("DockerAttributes", "DockerBackend")

log = get_logger("asyncsandbox.docker")

AGENT = files(__package__).joinpath("_agent.py").read_text()
OWNER_LABEL = "asyncsandbox.owner"
SANDBOX_UID = 1000
KILL_DEADLINE = 15.0
OOM_EVENT_GRACE = 0.5
FOREVER = "2147483647"  # seconds; `sleep infinity` is not universal
MODE_DIR = 1 << 31  # Go's os.ModeDir, as in X-Docker-Container-Path-Stat
MODE_SYMLINK = 1 << 27
# The Engine API path's shepherd (``_agent.py run``): where it records a command it could not
# start, and the exit status that says to look there.
RUN_DIR = "/run/asyncsandbox"
LAUNCH_FAILED = 125
MAX_FAILURE_ARCHIVE = 64 * 1024
_STATES = {
    "created": SandboxStatus.CREATING,
    "running": SandboxStatus.RUNNING,
    "restarting": SandboxStatus.RUNNING,
    "paused": SandboxStatus.STOPPED,
    "exited": SandboxStatus.STOPPED,
    "removing": SandboxStatus.REMOVING,
    "dead": SandboxStatus.DEAD,
}
# Root in "root" mode keeps Docker's usual powers minus those a sandbox has no use for.
_ROOT_CAPS = ["CHOWN", "DAC_OVERRIDE", "FOWNER", "FSETID", "KILL", "SETGID", "SETUID", "SETPCAP"]
# Otherwise root (the agent, the idle main process) needs only to manage the user's processes.
_AGENT_CAPS = ["CHOWN", "DAC_OVERRIDE", "FOWNER", "KILL", "SETGID", "SETUID"]


_TMPFS = "rw,exec,nosuid,nodev"
# Run as the sandbox user: its every other process killed (until none is left), then the
# writable places (the arguments, /dev/shm, /dev/mqueue) and its IPC objects emptied;
# exits non-zero, saying what is left, unless all of it is clean. Only shell builtins
# while processes may remain (a fork would be one more process to find).
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
status=0
for dir in "$@" /dev/shm /dev/mqueue; do
    [ -d "$dir" ] || continue
    chmod -R u+rwX "$dir" 2>/dev/null
    find "$dir" -mindepth 1 -delete 2>/dev/null
    [ -z "$(ls -A "$dir")" ] || { echo "$dir is not empty"; status=1; }
done
ipcrm --all 2>/dev/null
[ -z "$(ipcs -q -m -s 2>/dev/null | grep '^0x')" ] || { echo "IPC objects remain"; status=1; }
exit $status
"""
SNAPSHOT_REPOSITORY = "asyncsandbox-snapshot"
SNAPSHOT_LABEL = "asyncsandbox.snapshot"
DELETED = "deleted-"  # the tag of a snapshot deleted while sandboxes used it


def _snapshot_ref(snapshot_id: str) -> str:
    if not re.fullmatch(r"s-[0-9a-f]{12}", snapshot_id):
        raise InvalidArgument(f"{snapshot_id!r} is not a Docker backend snapshot id")
    return f"{SNAPSHOT_REPOSITORY}:{snapshot_id}"


class DockerAttributes(TypedAttributeSet):
    """Typed attributes of Docker sandboxes (``sandbox.extra(DockerAttributes.container_id)``)."""

    container_id: str = typed_attribute()
    image: str = typed_attribute()


class DockerBackend(Backend):
    """Sandboxes are Docker containers, driven through the Engine API (aiodocker).

    Each container runs an idle ``sleep`` under Docker's init (so zombies are reaped) that
    ends the container when its ``max_lifetime`` is over, even if its owner died. No
    network by default, memory/pids/CPU limits, all capabilities dropped but those needed
    to manage the user's processes, ``no-new-privileges``, no logging driver. Commands run
    as an unprivileged user (uid 1000, ``HOME=/home/sandbox``) under a small shepherd
    (``python3`` must exist in the image) that kills their whole process tree on timeout,
    cancellation and exit.

    :param url: the daemon (default: ``DOCKER_HOST``, else the local socket).
    :param default_image: the image when ``SandboxDefaults.image`` is None.
    :param user: ``"sandbox"`` (uid 1000) or ``"root"`` for images that expect root.
    :param pull: ``"missing"`` pulls images not present locally; ``"never"`` refuses.
    :param call_deadline: seconds any single Engine API call may take; a container whose
        calls exceed it is reported lost (:class:`SandboxDied`) and left to the sweep.
    :param max_connections: size of the connection pool to the daemon (each sandbox's
        executor holds one connection).
    :param fast_path: run commands and file operations through a resident executor in each
        sandbox (one ``docker exec`` per sandbox, then no daemon work per command); when
        off, or when the executor cannot run, every command is an Engine API exec.
    :param recyclable: containers that can be reset for another episode (recycling, see
        ``WarmPool(recycle=True)``): the image's filesystem is read-only and every place
        the sandbox user can write is a tmpfs (the workdir, the home, ``/tmp``,
        ``/var/tmp``, ``/dev/shm``), whose content counts toward ``memory_mb``. With
        ``user="sandbox"`` only.

    Runs on asyncio only (aiodocker is asyncio-based).
    """

    name = "docker"

    def __init__(
        self,
        *,
        url: str | None = None,
        default_image: str = "python:3.12-slim",
        user: Literal["sandbox", "root"] = "sandbox",
        pull: Literal["missing", "never"] = "missing",
        call_deadline: float = 30.0,
        max_connections: int = 4096,
        fast_path: bool = True,
        recyclable: bool = False,
    ) -> None:
        if user not in ("sandbox", "root"):
            raise InvalidArgument(f"user must be 'sandbox' or 'root', got {user!r}")
        if pull not in ("missing", "never"):
            raise InvalidArgument(f"pull must be 'missing' or 'never', got {pull!r}")
        if recyclable and user != "sandbox":
            raise InvalidArgument(
                "recyclable=True needs user='sandbox': a reset kills every process of the "
                "sandbox user, which root processes would survive"
            )
        self.default_image = default_image
        self.fast_path = fast_path
        self.recyclable = recyclable
        self.user = user
        self.pull = pull
        self.engine = Engine(url, call_deadline=call_deadline, max_connections=max_connections)
        self._image_locks: dict[str, anyio.Lock] = defaultdict(anyio.Lock)
        self._ooms: dict[str, int] = defaultdict(int)
        self._oom_seen = anyio.Event()
        self._task_group: anyio.abc.TaskGroup | None = None
        self._caps = BackendCapabilities(
            async_libraries=frozenset({"asyncio"}),
            isolation="Docker containers (namespaces, cgroups, no capabilities beyond process management)",
            enforced_limits=frozenset({"cpus", "memory_mb", "pids"}),
            network_modes=frozenset({"none", "host"}),
            reports_signal=fast_path,
            snapshots=True,
            reset=recyclable,
        )

    @property
    def capabilities(self) -> BackendCapabilities:
        return self._caps

    @property
    def uid(self) -> int:
        return SANDBOX_UID if self.user == "sandbox" else -1

    async def __aenter__(self) -> Self:
        info = await self.engine.open()
        log.debug(
            "docker.connected",
            version=info.get("ServerVersion"),
            host=self.engine.docker.docker_host,
        )
        task_group = anyio.create_task_group()
        await task_group.__aenter__()
        self._task_group = task_group
        task_group.start_soon(self._watch_events)
        return self

    async def aclose(self) -> None:
        task_group, self._task_group = self._task_group, None
        if task_group is not None:
            task_group.cancel_scope.cancel()
            await task_group.__aexit__(None, None, None)
        with anyio.CancelScope(shield=True):
            await self.engine.close()

    async def _watch_events(self) -> None:
        """Count OOM kills per container (the exec status alone cannot tell them apart)."""
        filters = {"type": ["container"], "event": ["oom"], "label": [OWNER_LABEL]}
        while True:
            try:
                async with self.engine.raw(
                    "GET", "events", params={"filters": filters}
                ) as response:
                    async for line in response.content:
                        if not line.strip():
                            continue
                        event = json.loads(line)
                        name = event.get("Actor", {}).get("Attributes", {}).get("name")
                        if name:
                            self._ooms[name] += 1
                            self._oom_seen.set()
                            self._oom_seen = anyio.Event()
            except (SandboxError, aiohttp.ClientError, OSError, ValueError) as exc:
                log.debug("docker.events.reconnect", error=repr(exc))
            await anyio.sleep(1.0)

    async def _oom_after(self, name: str, before: int) -> bool:
        with anyio.move_on_after(OOM_EVENT_GRACE):
            while self._ooms[name] <= before:
                await self._oom_seen.wait()
        return self._ooms[name] > before

    async def _ensure_image(self, image: str) -> None:
        async with self._image_locks[image]:
            try:
                await self.engine.call("GET", f"images/{image}/json")
                return
            except SandboxError as exc:
                if "no such image" not in str(exc).lower():
                    raise
            if self.pull == "never":
                raise InvalidArgument(f"image {image!r} is not present locally and pull='never'")
            await self._pull(image)

    async def _pull(self, image: str) -> None:
        name, _, tag = (
            image.rpartition(":") if ":" in image.rsplit("/", 1)[-1] else (image, "", "latest")
        )
        log.info("docker.image.pull", image=image)
        try:
            async with self.engine.raw(
                "POST",
                "images/create",
                params={"fromImage": name, "tag": tag},
                headers={"Content-Type": "application/json"},
            ) as response:
                async for line in response.content:
                    if not line.strip():
                        continue
                    event = json.loads(line)
                    if "error" in event:
                        raise _pull_error(image, str(event["error"]))
                    log.debug(
                        "docker.image.pull.progress",
                        image=image,
                        status=event.get("status"),
                        progress=event.get("progress"),
                    )
        except SandboxError as exc:
            if isinstance(exc, InvalidArgument):
                raise
            raise _pull_error(image, str(exc)) from exc
        log.info("docker.image.pulled", image=image)

    async def create(self, spec: SandboxSpec) -> SandboxHandle:
        if spec.snapshot is not None:
            image = await self._snapshot_image(spec.snapshot)
        else:
            image = spec.image or self.default_image
            await self._ensure_image(image)
        name = "asyncsandbox-" + uuid.uuid4().hex[:12]
        lifetime = FOREVER if spec.max_lifetime is None else str(max(1, round(spec.max_lifetime)))
        home = "/home/sandbox" if self.user == "sandbox" else "/root"
        resources = spec.resources
        host_config: dict[str, Any] = {
            "Init": True,
            "NetworkMode": "none" if spec.network == "none" else "host",
            "CapDrop": ["ALL"],
            "CapAdd": _AGENT_CAPS if self.user == "sandbox" else _ROOT_CAPS,
            "SecurityOpt": ["no-new-privileges"],
            "LogConfig": {"Type": "none", "Config": {}},
        }
        if self.recyclable:
            host_config["ReadonlyRootfs"] = True
            owned = f"{_TMPFS},uid={SANDBOX_UID},gid={SANDBOX_UID},mode=755"
            host_config["Tmpfs"] = {
                "/tmp": f"{_TMPFS},mode=1777",
                "/var/tmp": f"{_TMPFS},mode=1777",
                "/run": "rw,nosuid,nodev,mode=755",  # the executor's
                spec.workdir: owned,
                home: owned,
            }
        if resources.memory_mb is not None:
            host_config["Memory"] = host_config["MemorySwap"] = resources.memory_mb * 1024 * 1024
        if resources.pids is not None:
            host_config["PidsLimit"] = resources.pids
        if resources.cpus is not None:
            host_config["NanoCpus"] = int(resources.cpus * 1e9)
        gid = SANDBOX_UID if self.uid >= 0 else -1
        fast = self.fast_path and self._task_group is not None
        if fast:
            # The executor is the main process: it ends the container at its max lifetime,
            # or when our attached stdin closes (StdinOnce), i.e. when its owner died.
            seconds = str(1e9 if spec.max_lifetime is None else spec.max_lifetime)
            entrypoint = ["python3"]
            command = [
                "-I",
                "-S",
                "-u",
                "-c",
                AGENT,
                "serve",
                str(self.uid),
                str(gid),
                spec.workdir,
                home,
                seconds,
            ]
        else:
            entrypoint, command = ["sleep"], [lifetime]
        config = {
            "Image": image,
            "Entrypoint": entrypoint,
            "Cmd": command,
            "Env": [f"HOME={home}", "LANG=C.UTF-8", *(f"{k}={v}" for k, v in spec.env.items())],
            "WorkingDir": spec.workdir,
            "User": "0:0",  # the main process; commands run as the sandbox user
            "Labels": dict(spec.labels)
            | ({SNAPSHOT_LABEL: spec.snapshot} if spec.snapshot is not None else {}),
            "StopTimeout": 1,
            "OpenStdin": fast,
            "StdinOnce": fast,
            "AttachStdin": fast,
            "AttachStdout": fast,
            "AttachStderr": fast,
            "HostConfig": host_config,
        }
        executor = Executor(self.engine, name) if fast else None
        try:
            # Shielded (bounded by the call deadline): a create cancelled in flight may still
            # happen in the daemon after our cleanup looked for it. Wait for the answer.
            with anyio.CancelScope(shield=True):
                await self.engine.call(
                    "POST", "containers/create", params={"name": name}, body=config
                )
            await anyio.lowlevel.checkpoint()  # a cancellation that came meanwhile lands here
            if executor is not None:
                assert self._task_group is not None
                await self._task_group.start(executor.run, name=f"executor {name}")
            elif self.user == "sandbox" and not self.recyclable:
                # Before start: the first command must find its workdir and home writable.
                dirs = _tar.directories(
                    [spec.workdir.lstrip("/"), home.lstrip("/")], uid=SANDBOX_UID, gid=SANDBOX_UID
                )
                await self._put(name, "/", dirs)
            await self.engine.call("POST", f"containers/{name}/start", sandbox_id=name)
            if executor is not None and not await executor.wait_ready():
                raise _executor_error(image, await self._executor_failure(name, executor))
        except BaseException:
            # Shielded: a failed or cancelled create must not leave a container behind.
            with anyio.CancelScope(shield=True):
                if executor is not None:
                    await executor.aclose()
                await self._force_remove(name)
            raise
        return DockerSandbox(
            self, name, image, spec.labels, executor, snapshot=spec.snapshot, workdir=spec.workdir
        )

    # -- snapshots: images committed from containers ---------------------------------------

    async def _snapshot_image(self, snapshot_id: str) -> str:
        image = _snapshot_ref(snapshot_id)
        try:
            await self.engine.call("GET", f"images/{image}/json")
        except SandboxError as exc:
            if "no such image" in str(exc).lower():
                raise InvalidArgument(
                    f"no snapshot {snapshot_id!r} in this Docker engine (it was deleted, or "
                    "taken by another backend)"
                ) from None
            raise
        return image

    async def delete_snapshot(self, snapshot_id: str) -> None:
        image = _snapshot_ref(snapshot_id)
        try:
            await self.engine.call("DELETE", f"images/{image}")
            return
        except SandboxError as exc:
            message = str(exc).lower()
            if "no such image" in message:
                return
            if "(409)" not in message:
                raise
        # Containers started from it still run: it goes once the last one does. Until
        # then it is renamed, so that no new sandbox starts from it.
        name, _, tag = image.partition(":")
        await self.engine.call(
            "POST", f"images/{image}/tag", params={"repo": name, "tag": DELETED + tag}
        )
        await self.engine.call("DELETE", f"images/{image}")

    async def _forget_deleted_snapshot(self, snapshot_id: str) -> None:
        """After a sandbox of ``snapshot_id`` went: delete the snapshot's image if it was
        deleted while in use and nothing uses it any more."""
        name, _, tag = _snapshot_ref(snapshot_id).partition(":")
        with contextlib.suppress(SandboxError):  # still in use, or never deleted
            await self.engine.call("DELETE", f"images/{name}:{DELETED}{tag}")

    async def _executor_failure(self, name: str, executor: Executor) -> str | None:
        """Why the executor of container ``name`` did not start. Its stderr says why, but
        Docker 20.10's attach may lose the last output of a container that exits at once:
        then Docker's init's exit status (127: it found no ``python3`` to run) says it."""
        failure = executor.failure
        if failure not in (None, "the executor exited"):
            return failure
        try:
            state = (await self.engine.call("GET", f"containers/{name}/json"))["State"]
        except (SandboxError, KeyError):
            return failure
        if not state.get("Running") and state.get("ExitCode") == 127:
            return "exec python3 failed: not found (the container's init exited 127)"
        return failure

    async def _put(self, name: str, path: str, body: bytes | AsyncIterable[bytes]) -> None:
        if isinstance(body, bytes):
            body = io.BytesIO(body)  # type: ignore[assignment]  # aiohttp streams file objects
        async with self.engine.raw(
            "PUT",
            f"containers/{name}/archive",
            params={"path": path, "noOverwriteDirNonDir": True},
            body=body,
            sandbox_id=name,
            file_path=path,
        ):
            pass

    async def _force_remove(self, name: str) -> bool:
        """Remove a container, whatever its state; False if that could not be confirmed."""
        try:
            await self.engine.call(
                "DELETE", f"containers/{name}", params={"force": True, "v": True}, sandbox_id=name
            )
        except SandboxNotFound:
            pass
        except SandboxError as exc:
            if "already in progress" in str(exc):
                return True
            log.warning("docker.remove.failed", sandbox_id=name, error=str(exc))
            return False
        return True

    async def attach(self, sandbox_id: str) -> SandboxHandle:
        data = await self.engine.call("GET", f"containers/{sandbox_id}/json", sandbox_id=sandbox_id)
        labels = data.get("Config", {}).get("Labels") or {}
        if OWNER_LABEL not in labels:
            raise SandboxNotFound(sandbox_id, f"{sandbox_id!r} is not an asyncsandbox container")
        return DockerSandbox(self, data["Name"].lstrip("/"), data["Config"]["Image"], labels)

    async def list(self, *, labels: Mapping[str, str]) -> builtins.list[SandboxInfo]:
        selectors = [OWNER_LABEL] + [f"{k}={v}" if v else k for k, v in labels.items()]
        containers = await self.engine.call(
            "GET", "containers/json", params={"all": True, "filters": {"label": selectors}}
        )
        return [
            _info(c["Names"][0].lstrip("/"), c["State"], c["Labels"], c["Image"], c["Created"])
            for c in containers
        ]


def _info(
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


def _executor_error(image: str, failure: str | None) -> SandboxError:
    text = failure or "no answer"
    if "python3" in text and ("No such file" in text or "not found" in text):
        return InvalidArgument(
            f"image {image!r} has no python3, which the docker backend needs in the image "
            f"(to control process trees): {text}"
        )
    return BackendUnavailable(f"the sandbox's executor did not start: {text}", retryable=False)


def _pull_error(image: str, message: str) -> SandboxError:
    lowered = message.lower()
    if any(
        s in lowered
        for s in ("not found", "manifest unknown", "denied", "does not exist", "invalid reference")
    ):
        return InvalidArgument(f"image {image!r} cannot be had: {message}")
    return BackendUnavailable(f"pulling image {image!r} failed: {message}", retryable=True)


class DockerSandbox(ShellFiles, SandboxHandle):
    def __init__(
        self,
        backend: DockerBackend,
        name: str,
        image: str,
        labels: Mapping[str, str],
        executor: Executor | None = None,
        *,
        snapshot: str | None = None,
        workdir: str = "/workspace",
    ) -> None:
        self._snapshot = snapshot  # started from it
        self._workdir = workdir
        self._executor = executor
        self._has_tar: bool | None = None
        self._backend = backend
        self._engine = backend.engine
        self._name = name
        self._image = image
        self._expires = float(labels.get("asyncsandbox.expires") or "inf")
        self._lost: SandboxDied | None = None

    @property
    def id(self) -> str:
        return self._name

    @property
    def extra_attributes(self) -> Mapping[Any, Any]:
        return {
            DockerAttributes.container_id: lambda: self._name,
            DockerAttributes.image: lambda: self._image,
        }

    def _check(self) -> None:
        if self._lost is not None:
            raise self._lost

    async def _died(self, error: SandboxError) -> SandboxError:
        """Turn "not running" into why: killed for memory, lifetime over, removed."""
        if isinstance(error, SandboxNotFound):
            return SandboxDied(self._name, "removed")
        if isinstance(error, SandboxDied) and error.reason.startswith("lost"):
            return error
        if not isinstance(error, SandboxDied | BackendUnavailable) or self._engine.wedged:
            return error
        try:
            data = await self._engine.call(
                "GET", f"containers/{self._name}/json", sandbox_id=self._name
            )
        except SandboxNotFound:
            return SandboxDied(self._name, "removed")
        except SandboxError:
            return error
        state = data.get("State", {})
        if state.get("Running"):
            return error  # the sandbox lives: the error was the connection's
        if state.get("OOMKilled"):
            return SandboxOOMKilled(self._name, "the container exceeded its memory limit")
        if time.time() >= self._expires - 1:
            return SandboxDied(self._name, "max lifetime exceeded")
        return SandboxDied(
            self._name,
            f"the container stopped ({state.get('Status')}, exit status {state.get('ExitCode')})",
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
                "POST", f"containers/{self._name}/exec", body=body, sandbox_id=self._name
            )
        except SandboxError as exc:
            raise await self._died(exc) from exc
        return str(created["Id"])

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
        self._check()
        if await self._fast():
            assert self._executor is not None
            oom_before = self._backend._ooms[self._name]
            try:
                status, oom = await self._executor.exec(
                    argv, cwd=cwd, env=env, stdin=stdin, on_output=on_output
                )
            except SandboxDied as exc:
                self._lost = exc
                raise
            except BackendUnavailable as exc:
                # Shielded (each call it makes has a deadline): the exec may be cancelled
                # (its timeout), and a cancelled diagnosis would let the cancellation pass
                # this failure off as a timeout, the command's own outcome.
                with anyio.CancelScope(shield=True):
                    died = await self._died(exc)
                raise died from exc
            if status.signal == 9 and not oom:  # the executor could not read the cgroup
                oom = await self._backend._oom_after(self._name, oom_before)
            return ExitStatus(returncode=status.returncode, signal=status.signal, oom_killed=oom)
        return await self._api_exec(argv, cwd=cwd, env=env, stdin=stdin, on_output=on_output)

    async def _fast(self) -> bool:
        """Whether the executor serves this sandbox (waiting for it to be ready)."""
        return self._executor is not None and await self._executor.wait_ready()

    @asynccontextmanager
    async def shell(
        self, script: str, args: Sequence[str], *, stdin: bool
    ) -> AsyncIterator[ShellProcess]:
        assert self._executor is not None
        argv = ("/bin/sh", "-c", script, "sh", *args)
        try:
            async with self._executor.open(argv, cwd="/", env={"LC_ALL": "C"}, stdin=stdin) as job:
                yield ShellJob(job)
        except BackendUnavailable as exc:
            raise await self._died(exc) from exc

    async def _tar_ok(self) -> bool:
        """Whether the image has ``tar`` (directory transfers through the executor need it)."""
        if self._has_tar is None:
            async with self.shell("command -v tar >/dev/null", (), stdin=False) as script:
                returncode, _ = await script.wait()
            self._has_tar = returncode == 0
        return self._has_tar

    async def _api_exec(
        self,
        argv: tuple[str, ...],
        *,
        cwd: str,
        env: Mapping[str, str],
        stdin: bytes | None,
        on_output: OutputCallback,
    ) -> ExitStatus:
        backend = self._backend
        token = uuid.uuid4().hex
        data = stdin or b""
        gid = SANDBOX_UID if backend.uid >= 0 else -1
        cmd = [
            "python3",
            "-I",
            "-S",
            "-c",
            AGENT,
            "run",
            token,
            str(backend.uid),
            str(gid),
            str(len(data)),
            cwd,
            "--",
            *argv,
        ]
        exec_id = await self._new_exec(cmd, env, stdin=bool(data))
        oom_before = backend._ooms[self._name]
        first: bytes | None = None
        stream = self._engine.exec_stream(exec_id)
        try:
            try:
                with anyio.fail_after(self._engine.call_deadline):
                    await stream._init()  # POST /exec/{id}/start, hijacking the connection
                if data:
                    for offset in range(0, len(data), 1 << 16):
                        await stream.write_in(data[offset : offset + (1 << 16)])
                while (message := await stream.read_out()) is not None:
                    if first is None:
                        first = message.data
                    await on_output("stdout" if message.stream == 1 else "stderr", message.data)
            except TimeoutError:
                raise await self._engine._diagnose("exec start", self._name) from None
            except (aiohttp.ClientError, OSError, RuntimeError) as exc:
                raise BackendUnavailable(f"the exec stream broke: {exc}", retryable=False) from exc
        except BaseException as exc:
            # Shielded and bounded: the command's whole tree must die before we re-raise.
            with anyio.CancelScope(shield=True):
                await stream.close()
                killed = await self._kill(token)
            if not killed:
                self._lost = SandboxDied(self._name, "lost: a command could not be killed")
                log.warning("docker.sandbox.lost", sandbox_id=self._name, reason="kill failed")
                if isinstance(exc, anyio.get_cancelled_exc_class()):
                    # Not the cancellation: it would pass the command off as killed (and its
                    # timeout as its own outcome), while it may still run.
                    raise self._lost from None
            raise
        finally:
            with anyio.CancelScope(shield=True):
                await stream.close()
        try:
            result = await self._engine.call("GET", f"exec/{exec_id}/json", sandbox_id=self._name)
        except SandboxError as exc:
            raise await self._died(exc) from exc
        code = result.get("ExitCode")
        if code is None or result.get("Running"):
            raise await self._died(SandboxDied(self._name, "the command's exit status was lost"))
        if not result.get("Pid"):
            # Docker could not start our shepherd at all: no process ever ran, so the output
            # is Docker's own (a command printing the same text cannot get here).
            said = (first or b"").decode(errors="replace").strip()
            if '"python3": executable file not found' in said:
                raise InvalidArgument(
                    f"image {self._image!r} has no python3, which the docker backend needs in "
                    "the image to control process trees"
                )
            probe = SandboxDied(self._name, said)
            died = await self._died(probe)
            if died is not probe:
                raise died  # it could not start because the container is gone
            raise LaunchError(f"sandbox {self._name}: Docker could not start the command: {said}")
        if code == LAUNCH_FAILED:
            failure = await self._launch_failure(token)
            if failure is not None:
                raise failure
        oom = code == 137 and await backend._oom_after(self._name, oom_before)
        if code >= 128 and not oom:
            # Killed by a signal: maybe with its whole container (`docker kill`, a daemon
            # restart). That is the sandbox's death, not the command's outcome.
            probe = SandboxDied(self._name, "the container stopped while the command ran")
            died = await self._died(probe)
            if died is not probe:
                raise died
        return ExitStatus(returncode=int(code), oom_killed=oom)

    async def _launch_failure(self, token: str) -> LaunchError | None:
        """Why the shepherd run under ``token`` could not start its command, if it could not
        (it exited LAUNCH_FAILED and wrote ``RUN_DIR/TOKEN.failed``; a command exiting with
        that status is not one). Only root writes there: the record is read from the
        container's filesystem by the daemon, and trusted only if root owns it."""
        path = f"{RUN_DIR}/{token}.failed"
        try:
            async with self._engine.raw(
                "GET",
                f"containers/{self._name}/archive",
                params={"path": path},
                sandbox_id=self._name,
                file_path=path,
            ) as response:
                archive = await response.content.read(MAX_FAILURE_ARCHIVE)
        except SandboxFileError:
            return None  # no record: the command's own exit status
        except SandboxError as exc:
            raise await self._died(exc) from exc
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
            f"sandbox {self._name}: the command could not be started: {message}",
            retryable=record[:1] == b"1",
        )

    async def _kill(self, token: str) -> bool:
        """Kill the command run under ``token`` (and its whole tree). True once confirmed."""
        with anyio.move_on_after(KILL_DEADLINE):
            try:
                exec_id = await self._new_exec(
                    ["python3", "-I", "-S", "-c", AGENT, "kill", token], {}, stdin=False
                )
                stream = self._engine.exec_stream(exec_id)
                try:
                    while await stream.read_out() is not None:
                        pass
                finally:
                    await stream.close()
                result = await self._engine.call(
                    "GET", f"exec/{exec_id}/json", sandbox_id=self._name
                )
                if result.get("ExitCode") != 0:
                    log.warning(
                        "docker.kill.failed",
                        sandbox_id=self._name,
                        exit_code=result.get("ExitCode"),
                    )
                return bool(result.get("ExitCode") == 0)
            except SandboxDied:
                return True  # the container is gone, and every process with it
            except (SandboxError, aiohttp.ClientError, OSError, RuntimeError) as exc:
                log.warning("docker.kill.failed", sandbox_id=self._name, error=repr(exc))
                return False
        return False

    async def _stat(self, path: str) -> tuple[str, dict[str, Any]]:
        """(resolved path, stat) of ``path``, following a final symlink."""
        for _ in range(10):
            headers = await self._engine.head(
                f"containers/{self._name}/archive",
                params={"path": path},
                sandbox_id=self._name,
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

    async def _file_call(self, coro: Any) -> Any:
        try:
            return await coro
        except SandboxError as exc:
            if isinstance(exc, SandboxFileError | InvalidArgument):
                raise
            raise await self._died(exc) from exc

    async def read_file(self, path: str, *, max_bytes: int) -> bytes:
        self._check()
        if await self._fast():
            return await ShellFiles.read_file(self, path, max_bytes=max_bytes)
        target, stat = await self._file_call(self._stat(path))
        if int(stat.get("mode", 0)) & MODE_DIR:
            raise SandboxFileError(FileErrorReason.IS_A_DIRECTORY, path)
        if int(stat.get("size", 0)) > max_bytes:
            raise SandboxFileError(
                FileErrorReason.TOO_LARGE, path, f"{stat.get('size')} > {max_bytes} bytes"
            )
        async with self._engine.raw(
            "GET",
            f"containers/{self._name}/archive",
            params={"path": target},
            sandbox_id=self._name,
            file_path=path,
        ) as response:
            try:
                content = await _tar.read_single(
                    response.content.iter_chunked(256 * 1024), max_bytes
                )
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
            uid = max(self._backend.uid, 0)
            names = [posixpath.relpath(p, current) for p in reversed(missing)]
            await self._backend._put(self._name, current, _tar.directories(names, uid=uid, gid=uid))

    async def write_file(self, path: str, data: bytes, *, mode: int) -> None:
        self._check()
        if await self._fast():
            return await ShellFiles.write_file(self, path, data, mode=mode)
        parent, name = posixpath.split(path)
        uid = max(self._backend.uid, 0)

        def archive() -> AsyncIterator[bytes]:
            return _tar.single_file(name, data, mode=mode, uid=uid, gid=uid)

        try:
            await self._file_call(self._backend._put(self._name, parent, archive()))
        except SandboxFileError as exc:
            if exc.reason != FileErrorReason.NOT_FOUND:
                raise
            await self._file_call(self._mkdirs(parent))
            await self._file_call(self._backend._put(self._name, parent, archive()))

    async def put_archive(self, path: str, archive: AsyncIterable[bytes]) -> None:
        self._check()
        if await self._fast() and await self._tar_ok():
            return await ShellFiles.put_archive(self, path, archive)
        await self._file_call(self._mkdirs(path))
        uid = max(self._backend.uid, 0)
        await self._file_call(
            self._backend._put(self._name, path, _tar.owned_by(archive, uid, uid))
        )

    @asynccontextmanager
    async def get_archive(self, path: str) -> AsyncIterator[AsyncIterator[bytes]]:
        self._check()
        if await self._fast() and await self._tar_ok():
            async with ShellFiles.get_archive(self, path) as chunks:
                yield chunks
            return
        target, _ = await self._file_call(self._stat(path))
        async with self._engine.raw(
            "GET",
            f"containers/{self._name}/archive",
            params={"path": target},
            sandbox_id=self._name,
            file_path=path,
        ) as response:
            yield response.content.iter_chunked(256 * 1024)

    async def inspect(self) -> SandboxInfo:
        data = await self._engine.call(
            "GET", f"containers/{self._name}/json", sandbox_id=self._name
        )
        config = data.get("Config", {})
        return _info(
            self._name,
            data["State"]["Status"],
            config.get("Labels") or {},
            config.get("Image", ""),
            None,
        )

    async def remove(self) -> None:
        if self._executor is not None:
            await self._executor.aclose()
        if self._lost is not None:
            # It stopped answering: another call would hang too. The sweep will retry.
            log.warning(
                "docker.sandbox.left_for_sweep", sandbox_id=self._name, reason=self._lost.reason
            )
            return
        if not await self._backend._force_remove(self._name):
            raise BackendUnavailable(f"could not remove container {self._name}", retryable=True)
        if self._snapshot is not None:
            await self._backend._forget_deleted_snapshot(self._snapshot)

    async def reset(self) -> None:
        """Kill every process of the sandbox user and empty every tmpfs it can write to
        (``recyclable`` containers: nothing else is writable), through the sandbox's own
        command path; raise unless the script confirms that nothing is left."""
        if not self._backend.recyclable:
            raise InvalidArgument("only recyclable Docker sandboxes can be reset")
        home = "/home/sandbox"
        output = bytearray()

        async def collect(stream: str, data: bytes) -> None:
            output.extend(data)

        status = await self.exec(
            ("/bin/sh", "-c", _RESET, "reset", "/tmp", "/var/tmp", self._workdir, home),
            cwd="/",
            env={"LC_ALL": "C"},
            stdin=None,
            on_output=collect,
        )
        if status.returncode != 0:
            said = output.decode(errors="replace").strip()[-2000:]
            raise BackendUnavailable(f"sandbox {self._name} could not be reset: {said}")

    async def snapshot(self) -> str:
        """A ``docker commit`` of the container (paused meanwhile) to an image of our own
        repository; the image's configuration is the original image's environment only, so
        that a sandbox started from it gets its own settings (as a fresh one would)."""
        self._check()
        snapshot_id = "s-" + uuid.uuid4().hex[:12]
        name, _, tag = _snapshot_ref(snapshot_id).partition(":")
        try:
            container = await self._engine.call(
                "GET", f"containers/{self._name}/json", sandbox_id=self._name
            )
            base = await self._engine.call("GET", f"images/{container['Image']}/json")
            env = (base.get("Config") or {}).get("Env") or []
        except SandboxError as error:
            raise await self._died(error) from error
        try:
            with anyio.CancelScope(shield=True):  # a commit in flight happens anyway
                await self._engine.call(
                    "POST",
                    "commit",
                    params={"container": self._name, "repo": name, "tag": tag, "pause": True},
                    body={"Env": env, "Labels": {SNAPSHOT_LABEL: snapshot_id}},
                    sandbox_id=self._name,
                    deadline=self._backend.timeouts.create,
                )
            await anyio.lowlevel.checkpoint()
        except BaseException:
            with anyio.CancelScope(shield=True), contextlib.suppress(SandboxError):
                await self._backend.delete_snapshot(snapshot_id)
            raise
        return snapshot_id
