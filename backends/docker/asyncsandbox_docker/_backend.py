"""The Docker backend: containers' lifecycle, images and snapshots. What runs in a sandbox
is the handle's (``_sandbox.py``), by the path chosen here when it is created or attached."""

from __future__ import annotations

import builtins
import json
import uuid
from collections import defaultdict
from collections.abc import Mapping
from typing import Any, Literal, Self

import anyio
import anyio.abc

from asyncsandbox import (
    BackendUnavailable,
    InvalidArgument,
    SandboxError,
    SandboxInfo,
    SandboxNotFound,
    SnapshotInfo,
)
from asyncsandbox.abc import Backend, BackendCapabilities, SandboxHandle, SandboxSpec
from asyncsandbox.log import get_logger

from . import _tar
from ._api_path import ApiPath
from ._engine import Engine
from ._executor import PROGRAM, Executor
from ._fast_path import FastPath
from ._sandbox import OWNED_MODE, Container, DockerAttributes, DockerSandbox, OomKills, Path, info
from ._store import SNAPSHOT_LABEL, Store

__all__ = ("DockerAttributes", "DockerBackend")

log = get_logger("asyncsandbox.docker")

OWNER_LABEL = "asyncsandbox.owner"
SANDBOX_UID = 1000
FOREVER = "2147483647"  # seconds; `sleep infinity` is not universal
# Root in "root" mode keeps Docker's usual powers minus those a sandbox has no use for.
_ROOT_CAPS = ["CHOWN", "DAC_OVERRIDE", "FOWNER", "FSETID", "KILL", "SETGID", "SETUID", "SETPCAP"]
# Otherwise root (the agent, the idle main process) needs only to manage the user's processes.
_AGENT_CAPS = ["CHOWN", "DAC_OVERRIDE", "FOWNER", "KILL", "SETGID", "SETUID"]


# The host pids cgroup's bound on a gVisor sandbox whose user asked for ``pids``: gVisor's
# own threads at rest, and per task of its (measured with runsc 20221219, ptrace: an idle
# container 69, 64 sleeping processes or threads 368-380).
_GVISOR_PIDS_BASE = 256
_GVISOR_PIDS_PER_TASK = 8

_TMPFS = "rw,exec,nosuid,nodev"


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
    :param call_deadline: removed: every Engine API call is bounded by the Session's
        ``Timeouts.operation`` (a container whose calls exceed it is reported lost,
        :class:`SandboxDied`, and left to the sweep); kills by ``Timeouts.cleanup``.
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
    :param runtime: the OCI runtime of the containers (Docker's ``--runtime``), default the
        daemon's. ``"runsc"`` runs each sandbox in gVisor (a user-space kernel between it and
        the host's), once the daemon is configured for it (``/etc/docker/daemon.json``:
        ``{"runtimes": {"runsc": {"path": "/usr/bin/runsc", "runtimeArgs":
        ["--network=none"]}}}``, then ``kill -HUP`` the daemon); a daemon without the
        runtime is refused when the backend opens, saying how to configure it. With
        ``runsc``, sandboxes have no network (``network="host"`` is refused),
        ``memory_mb`` bounds the whole gVisor sandbox, its kernel included (a sandbox over
        it ends whole: :class:`~asyncsandbox.SandboxOOMKilled`), and ``pids`` is enforced
        by gVisor's kernel as each uid's ``RLIMIT_NPROC`` (threads count, as in a pids
        cgroup), the host's cgroup holding gVisor's own threads under a bound scaled to it.

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
        call_deadline: float | None = None,
        max_connections: int = 4096,
        fast_path: bool = True,
        recyclable: bool = False,
        runtime: str | None = None,
    ) -> None:
        if call_deadline is not None:
            raise InvalidArgument(
                "DockerBackend(call_deadline=...) is gone: each Engine API call is bounded by "
                "the Session's Timeouts.operation: Session(..., "
                f"timeouts=Timeouts(operation={call_deadline!r}))"
            )
        if user not in ("sandbox", "root"):
            raise InvalidArgument(f"user must be 'sandbox' or 'root', got {user!r}")
        if pull not in ("missing", "never"):
            raise InvalidArgument(f"pull must be 'missing' or 'never', got {pull!r}")
        if runtime == "":
            raise InvalidArgument(f"runtime must be a runtime's name, got {runtime!r}")
        if recyclable and user != "sandbox":
            raise InvalidArgument(
                "recyclable=True needs user='sandbox': a reset kills every process of the "
                "sandbox user, which root processes would survive"
            )
        self.default_image = default_image
        self.fast_path = fast_path
        self.recyclable = recyclable
        self.runtime = runtime
        self.user = user
        self.pull = pull
        self.engine = Engine(url, max_connections=max_connections)
        self.store = Store(self.engine)
        self._image_locks: dict[str, anyio.Lock] = defaultdict(anyio.Lock)
        self._ooms = OomKills()
        self._task_group: anyio.abc.TaskGroup | None = None
        gvisor = runtime == "runsc"
        self._caps = BackendCapabilities(
            async_libraries=frozenset({"asyncio"}),
            isolation="Docker containers (namespaces, cgroups, no capabilities beyond process management)"
            + (
                "; in gVisor (runtime runsc: a user-space kernel between the container and "
                "the host's; limits bound the whole gVisor sandbox, its kernel included)"
                if gvisor
                else f"; runtime {runtime}"
                if runtime
                else ""
            ),
            enforced_limits=frozenset({"cpus", "memory_mb", "pids"}),
            # runsc's own network stack is not used: its runtime runs with --network=none.
            network_modes=frozenset({"none"} if gvisor else {"none", "host"}),
            reports_signal=fast_path,
            snapshots=True,
            reset=recyclable,
            interactive=fast_path,
        )

    @property
    def capabilities(self) -> BackendCapabilities:
        return self._caps

    @property
    def uid(self) -> int:
        return SANDBOX_UID if self.user == "sandbox" else -1

    async def __aenter__(self) -> Self:
        info = await self.engine.open(self.timeouts)
        if self.runtime is not None and self.runtime not in (info.get("Runtimes") or {}):
            await self.engine.close()
            raise BackendUnavailable(_runtime_missing(self.runtime, info), retryable=False)
        log.debug(
            "docker.connected",
            version=info.get("ServerVersion"),
            host=self.engine.host,
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
                async with self.engine.raw("GET", "events", params={"filters": filters}) as body:
                    async for line in body.lines():
                        if not line.strip():
                            continue
                        event = json.loads(line)
                        name = event.get("Actor", {}).get("Attributes", {}).get("name")
                        if name:
                            self._ooms.record(name)
            except (SandboxError, ValueError) as exc:
                log.debug("docker.events.reconnect", error=repr(exc))
            await anyio.sleep(1.0)

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
            ) as body:
                async for line in body.lines():
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
            image = await self.store.snapshot_image(spec.snapshot)
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
        if self.runtime is not None:
            host_config["Runtime"] = self.runtime
        if self.runtime == "runsc" and self.user == "sandbox":
            # gVisor has no child subreaper: the agent gives each command a PID namespace
            # instead (_agent.own_pid_namespace), which needs CAP_SYS_ADMIN: gVisor's
            # kernel's there, not the host's. Commands, as the sandbox user, hold none.
            host_config["CapAdd"] = [*_AGENT_CAPS, "SYS_ADMIN"]
        if self.recyclable:
            host_config["ReadonlyRootfs"] = True
            owned = f"{_TMPFS},uid={SANDBOX_UID},gid={SANDBOX_UID},mode={OWNED_MODE}"
            host_config["Tmpfs"] = {
                "/tmp": f"{_TMPFS},mode=1777",
                "/var/tmp": f"{_TMPFS},mode=1777",
                "/run": "rw,nosuid,nodev,mode=755",  # the executor's
                spec.workdir: owned,
                home: owned,
            }
        if resources.memory_mb is not None:
            host_config["Memory"] = host_config["MemorySwap"] = resources.memory_mb * 1024 * 1024
        if resources.pids is not None and self.runtime == "runsc":
            # The host's pids cgroup counts gVisor's own threads (its kernel's, its file
            # server's and, on the ptrace platform, a stub per task: ~70 for an idle
            # sandbox, ~5 more per task), so it cannot hold the user's bound: a sandbox
            # reaching it ends whole (runsc cannot make a thread). gVisor's kernel enforces
            # the bound instead, as RLIMIT_NPROC (per uid, threads included: a fork or a
            # thread past it fails with EAGAIN, as past pids.max); the cgroup keeps a bound
            # on the whole gVisor sandbox, scaled to it.
            host_config["Ulimits"] = [
                {"Name": "nproc", "Soft": resources.pids, "Hard": resources.pids}
            ]
            host_config["PidsLimit"] = _GVISOR_PIDS_BASE + _GVISOR_PIDS_PER_TASK * resources.pids
        elif resources.pids is not None:
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
                PROGRAM,
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
            # Network mode "none" has no network either way; disabled as well, Docker runs no
            # network hook for the container (its own binary, started for each container:
            # ~90 ms of CPU, a third of a sandbox's). Its hosts file then stays empty: the
            # fast path's executor names localhost in it (a recyclable sandbox's root is
            # read-only, and the API path has no executor: they keep Docker's hook).
            "NetworkDisabled": spec.network == "none" and fast and not self.recyclable,
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
                await self.engine.put_archive(name, "/", dirs)
            await self.engine.call("POST", f"containers/{name}/start", sandbox_id=name)
            if executor is not None and not await executor.wait_ready():
                raise _executor_error(image, await self._executor_failure(name, executor))
        except BaseException:
            # Shielded: a failed or cancelled create must not leave a container behind.
            with anyio.CancelScope(shield=True):
                if executor is not None:
                    await executor.aclose()
                await self.store.force_remove(name)
            raise
        container = self._container(name, image, spec.labels)
        # The path is chosen once, here (the fast path hands over to the API path for good
        # if its executor fails later).
        path: Path = ApiPath(container) if executor is None else FastPath(container, executor)
        return DockerSandbox(
            self.store,
            container,
            path,
            recyclable=self.recyclable,
            snapshot=spec.snapshot,
            workdir=spec.workdir,
        )

    def _container(self, name: str, image: str, labels: Mapping[str, str]) -> Container:
        gid = SANDBOX_UID if self.uid >= 0 else -1
        return Container(self.engine, name, image, labels, uid=self.uid, gid=gid, ooms=self._ooms)

    # -- snapshots: images committed from containers ---------------------------------------

    async def list_snapshots(self) -> builtins.list[SnapshotInfo]:
        return await self.store.list_snapshots()

    async def delete_snapshot(self, snapshot_id: str) -> None:
        await self.store.delete_snapshot(snapshot_id)

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

    async def attach(self, sandbox_id: str) -> SandboxHandle:
        data = await self.engine.call("GET", f"containers/{sandbox_id}/json", sandbox_id=sandbox_id)
        labels = data.get("Config", {}).get("Labels") or {}
        if OWNER_LABEL not in labels:
            raise SandboxNotFound(sandbox_id, f"{sandbox_id!r} is not an asyncsandbox container")
        container = self._container(data["Name"].lstrip("/"), data["Config"]["Image"], labels)
        return DockerSandbox(self.store, container, ApiPath(container), recyclable=self.recyclable)

    async def list(self, *, labels: Mapping[str, str]) -> builtins.list[SandboxInfo]:
        selectors = [OWNER_LABEL] + [f"{k}={v}" if v else k for k, v in labels.items()]
        containers = await self.engine.call(
            "GET", "containers/json", params={"all": True, "filters": {"label": selectors}}
        )
        return [
            info(c["Names"][0].lstrip("/"), c["State"], c["Labels"], c["Image"], c["Created"])
            for c in containers
        ]


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


def _runtime_missing(runtime: str, info: Mapping[str, Any]) -> str:
    """Why the daemon cannot run ``runtime``, and how to configure it."""
    known = ", ".join(sorted(info.get("Runtimes") or {})) or "none"
    message = f"the Docker daemon has no runtime {runtime!r} (it has: {known})"
    if runtime == "runsc":
        message += (
            ". To use gVisor: install runsc (Debian/Ubuntu: apt-get install runsc), add it to "
            "/etc/docker/daemon.json as "
            '{"runtimes": {"runsc": {"path": "/usr/bin/runsc", "runtimeArgs": '
            '["--network=none"]}}} (gVisor\'s own network stack is not used: sandboxes have '
            "no network), then make the daemon reload its configuration (kill -HUP the "
            "dockerd process, or restart it)"
        )
    else:
        message += (
            '; add it under "runtimes" in /etc/docker/daemon.json and reload the daemon '
            "(kill -HUP the dockerd process)"
        )
    return message
