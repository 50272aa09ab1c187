"""The systems measured, behind one small interface so every workload is defined once.

A system creates sandboxes, runs a command in one, writes and reads back a file, and
removes it. Every Docker baseline creates the same container (the image's ``sleep`` under
Docker's init, no network, 1 GiB memory, 512 pids, all capabilities dropped,
``no-new-privileges``, no logging driver) labelled ``asyncsandbox.bench=<run id>``, and
puts a deadline on every call it makes. The baselines run commands as root in ``/``; the
runtime runs them as an unprivileged user under its shepherd (process-tree kill, bounded
output): that extra work is part of what is measured.
"""

from __future__ import annotations

import functools
import importlib
import inspect
import io
import os
import shutil
import tarfile
import uuid
from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping
from contextlib import AsyncExitStack
from dataclasses import dataclass, field
from types import TracebackType
from typing import Any, Literal, Self, TypeVar

import anyio
import anyio.to_thread

from . import _daemon

T = TypeVar("T")

PYTHON = ("python3", "-c", "print(sum(range(1000)))")
TRUE = ("/bin/true",)
COMMANDS: dict[str, tuple[tuple[str, ...], bytes]] = {
    "python": (PYTHON, b"499500\n"),
    "true": (TRUE, b""),
}
"""The workloads' commands and their expected stdout."""

FILE_NAME = "data.bin"
BASELINE_DIR = "/tmp"
MEMORY = 1024 * 1024 * 1024
PIDS = 512
LIFETIME = "3600"  # seconds; the containers end themselves if everything else fails

Kind = Literal["docker", "process", "host", "ray"]
ALL_WORKLOADS = frozenset({"exec", "lifecycle", "rollout", "scale"})
SANDBOX_WORKLOADS = frozenset({"lifecycle", "rollout", "scale"})


class Unavailable(Exception):
    """The system cannot run here (a missing feature, tool or package); the reason says."""


@dataclass(frozen=True)
class Config:
    """What a system needs to know about the run."""

    run_id: str
    image: str
    op_deadline: float
    """Seconds any single operation may take before it counts as failed."""
    width: int = 32
    """Thread-pool width (docker-py): the workload's concurrency."""
    process_root: str = "/var/lib/asyncsandbox/bench"
    unbounded_live: bool = False
    """asyncsandbox: lift ``Limits.max_live`` (the scale workload goes past its 512)."""
    pool_size: int = 16
    ray_address: str | None = None
    """A running Ray cluster for ``asyncsandbox-ray`` (None: it starts one of its own)."""


class System(ABC):
    """One way of running sandboxes. Handles are opaque to the workloads."""

    name: str

    def __init__(self, name: str, config: Config) -> None:
        self.name = name
        self.config = config
        self.notes: list[str] = []

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc_val: BaseException | None,
        exc_tb: TracebackType | None,
    ) -> None:
        await self.aclose()

    async def aclose(self) -> None:  # noqa: B027 - optional hook
        pass

    async def ready(self) -> None:  # noqa: B027 - optional hook
        """Wait until the system is ready to be measured (a warm pool filled)."""

    @abstractmethod
    async def create(self) -> Any: ...

    @abstractmethod
    async def remove(self, handle: Any) -> None: ...

    @abstractmethod
    async def exec(self, handle: Any, argv: tuple[str, ...]) -> tuple[int, bytes]:
        """(exit status, stdout)."""

    @abstractmethod
    async def write_file(self, handle: Any, data: bytes) -> None: ...

    @abstractmethod
    async def read_file(self, handle: Any) -> bytes: ...

    def leftovers(self) -> int | None:
        """Sandboxes of this run that still exist (None: not countable here)."""
        return None

    async def count_leftovers(self) -> int | None:
        """Sandboxes of this run that exist but that nothing holds any more."""
        return await anyio.to_thread.run_sync(self.leftovers)

    def stats(self) -> dict[str, int]:
        """System-specific counters worth keeping with each point (warm pool hits)."""
        return {}


# -- helpers --------------------------------------------------------------------------


def _name(run_id: str) -> str:
    return f"asb-bench-{run_id}-{uuid.uuid4().hex[:10]}"


def single_file_tar(name: str, data: bytes) -> bytes:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as tar:
        info = tarfile.TarInfo(name)
        info.size = len(data)
        info.mode = 0o644
        tar.addfile(info, io.BytesIO(data))
    return buffer.getvalue()


def first_file(archive: bytes | tarfile.TarFile) -> bytes:
    if isinstance(archive, bytes):
        with tarfile.open(fileobj=io.BytesIO(archive)) as tar:
            return first_file(tar)
    for member in archive:
        if member.isfile():
            extracted = archive.extractfile(member)
            if extracted is not None:
                return extracted.read()
    raise ValueError("the archive holds no regular file")


def docker_leftovers(run_id: str) -> int | None:
    try:
        return len(_daemon.containers_of(run_id, deadline=30.0))
    except (_daemon.DaemonTimeout, _daemon.DaemonError):
        return None


class CommandFailed(Exception):
    """A baseline's call answered with an error."""


# -- asyncsandbox ---------------------------------------------------------------------


@dataclass(frozen=True)
class Variant:
    """An asyncsandbox configuration. ``requires`` names features the code must have (see
    :func:`features`); a variant whose features are missing is skipped with a note, and
    starts being measured as soon as they exist."""

    backend_options: Mapping[str, Any] = field(default_factory=dict)
    warm_pool: bool = False
    recycle: bool = False
    requires: tuple[str, ...] = ()
    description: str = ""


DOCKER_VARIANTS: dict[str, Variant] = {
    "asyncsandbox-docker": Variant(
        description="Session(DockerBackend(default_image=IMAGE)), default Limits "
        "(lifecycle 8, execs 256, live 512) and default backend options"
    ),
    "asyncsandbox-docker-api": Variant(
        backend_options={"fast_path": False},
        requires=("fast_path",),
        description="as asyncsandbox-docker with DockerBackend(fast_path=False): every exec "
        "and file transfer through the Engine API",
    ),
    "asyncsandbox-docker-fast": Variant(
        backend_options={"fast_path": True},
        requires=("fast_path",),
        description="as asyncsandbox-docker with DockerBackend(fast_path=True): execs "
        "through the in-sandbox executor",
    ),
    "asyncsandbox-docker-pool": Variant(
        warm_pool=True,
        requires=("warm_pool",),
        description="as asyncsandbox-docker with Session(warm_pool=WarmPool(size=N, "
        "max_age=600)): acquisition is a hand-over from pre-started sandboxes",
    ),
    "asyncsandbox-docker-runsc": Variant(
        backend_options={"runtime": "runsc"},
        requires=("runtime",),
        description="as asyncsandbox-docker with DockerBackend(runtime='runsc'): each "
        "container in gVisor (the daemon configured with the runsc runtime)",
    ),
    "asyncsandbox-docker-recycle": Variant(
        backend_options={"recyclable": True},
        warm_pool=True,
        recycle=True,
        requires=("warm_pool", "recycle"),
        description="as asyncsandbox-docker-pool with WarmPool(recycle=True) and "
        "DockerBackend(recyclable=True): a stopped sandbox is reset and handed to the next "
        "rollout instead of being removed and replaced",
    ),
}


def features() -> set[str]:
    """What the installed runtime offers, of what the variants may require."""
    import asyncsandbox

    found: set[str] = set()
    try:
        from asyncsandbox_docker import DockerBackend
    except ImportError:
        return found
    found.add("docker")
    parameters = inspect.signature(DockerBackend).parameters
    if "runtime" in parameters:
        found.add("runtime")
    if "fast_path" in parameters:
        found.add("fast_path")
        if parameters["fast_path"].default is True:
            found.add("fast_path_default")
    if (
        hasattr(asyncsandbox, "WarmPool")
        and "warm_pool" in inspect.signature(asyncsandbox.Session).parameters
    ):
        found.add("warm_pool")
        if "recycle" in getattr(asyncsandbox.WarmPool, "__struct_fields__", ()):
            found.add("recycle")
    return found


class Asyncsandbox(System):
    """A Session on a backend; sandboxes are ``session.sandbox()``, started and stopped."""

    def __init__(
        self,
        name: str,
        config: Config,
        make_backend: Callable[[], Any],
        *,
        session_options: Mapping[str, Any] | None = None,
        backend_options: Mapping[str, Any] | None = None,
        workdir_file: str = FILE_NAME,
    ) -> None:
        super().__init__(name, config)
        self._make_backend = make_backend
        self._backend_options = dict(backend_options or {})
        self._session_options = dict(session_options or {})
        self._file = workdir_file
        self._stack = AsyncExitStack()
        self.session: Any = None

    async def __aenter__(self) -> Self:
        import asyncsandbox

        limits = asyncsandbox.Limits(max_live=None) if self.config.unbounded_live else None
        if limits is not None:
            self.notes.append("Limits(max_live=None) (the scale workload); other limits default")
        session = asyncsandbox.Session(
            self._make_backend(),
            backend_options=self._backend_options or None,
            limits=limits,
            defaults=asyncsandbox.SandboxDefaults(
                tags=(f"{_daemon.TAG_PREFIX}{self.config.run_id}",)
            ),
            report_to=[],
            **self._session_options,
        )
        self.session = await self._stack.enter_async_context(session)
        return self

    async def aclose(self) -> None:
        await self._stack.aclose()

    async def count_leftovers(self) -> int | None:
        # Sandboxes the session still holds (a warm pool's ready ones) are not leftovers.
        held = self.session.statistics().live.active
        found = await anyio.to_thread.run_sync(self.leftovers)
        return None if found is None else max(0, found - held)

    def stats(self) -> dict[str, int]:
        stats = self.session.statistics()
        return {
            name: int(getattr(stats, name))
            for name in ("pool_ready", "pool_hits")
            if hasattr(stats, name)
        }

    async def create(self) -> Any:
        sandbox = self.session.sandbox()
        await sandbox.start()
        return sandbox

    async def remove(self, handle: Any) -> None:
        await handle.stop()

    async def exec(self, handle: Any, argv: tuple[str, ...]) -> tuple[int, bytes]:
        result = await handle.exec(list(argv), timeout=60)
        return int(result.returncode), bytes(result.stdout)

    async def write_file(self, handle: Any, data: bytes) -> None:
        await handle.write_file(self._file, data)

    async def read_file(self, handle: Any) -> bytes:
        return bytes(await handle.read_file(self._file))


class AsyncsandboxDocker(Asyncsandbox):
    def __init__(self, name: str, config: Config, variant: Variant) -> None:
        missing = set(variant.requires) - features()
        if missing:
            raise Unavailable(
                f"the runtime has no {', '.join(sorted(missing))} yet "
                f"({variant.description or name})"
            )
        from asyncsandbox_docker import DockerBackend

        def backend() -> Any:
            return DockerBackend(
                default_image=config.image, pull="never", **variant.backend_options
            )

        options: dict[str, Any] = {}
        if variant.warm_pool:
            import asyncsandbox

            warm_pool = getattr(asyncsandbox, "WarmPool")  # noqa: B009 - not in every version
            try:
                extra = {"recycle": True} if variant.recycle else {}
                options["warm_pool"] = warm_pool(size=config.pool_size, max_age=600.0, **extra)
            except TypeError as exc:
                raise Unavailable(f"WarmPool(size=, max_age=) did not construct: {exc}") from exc
        super().__init__(name, config, backend, session_options=options)
        self._warm_pool = variant.warm_pool

    async def ready(self) -> None:
        if not self._warm_pool:
            return
        # The pool API is young: look for a fill level in the statistics, else give the
        # pool the time its creates need at the lifecycle limit (~8 per second here).
        deadline = anyio.current_time() + max(30.0, self.config.pool_size * 1.0)
        while anyio.current_time() < deadline:
            level = _pool_level(self.session)
            if level is None:
                await anyio.sleep(2.0 + self.config.pool_size / 4)
                self.notes.append("warm pool: fill level not visible; waited a fixed time")
                return
            if level >= self.config.pool_size:
                return
            await anyio.sleep(0.2)
        self.notes.append("warm pool: not full when measurement began")

    def leftovers(self) -> int | None:
        return docker_leftovers(self.config.run_id)


def _pool_level(session: Any) -> int | None:
    stats = session.statistics()
    if isinstance(getattr(stats, "pool_ready", None), int):
        return int(stats.pool_ready)
    for owner in (stats, session):
        for attribute in ("warm_pool", "pool"):
            pool = getattr(owner, attribute, None)
            if pool is None:
                continue
            if callable(getattr(pool, "statistics", None)):
                pool = pool.statistics()
            for name in ("ready", "idle", "available", "size_ready", "warm"):
                value = getattr(pool, name, None)
                if isinstance(value, int):
                    return value
    return None


class AsyncsandboxProcess(Asyncsandbox):
    options: dict[str, Any] = {}  # noqa: RUF012 - the backend's own choices

    def __init__(self, name: str, config: Config) -> None:
        options: dict[str, Any] = {"root": config.process_root, **self.options}
        super().__init__(name, config, lambda: "process", backend_options=options)

    def leftovers(self) -> int | None:
        return process_leftovers(self.config.process_root)


class AsyncsandboxProcessBwrap(AsyncsandboxProcess):
    options = {"isolation": "bwrap", "fast_path": False}  # noqa: RUF012


class AsyncsandboxProcessNative(AsyncsandboxProcess):
    options = {"isolation": "native", "fast_path": False}  # noqa: RUF012


class AsyncsandboxProcessFast(AsyncsandboxProcess):
    options = {"isolation": "native", "fast_path": True}  # noqa: RUF012


class AsyncsandboxProcessGVisor(AsyncsandboxProcess):
    options = {"isolation": "gvisor"}  # noqa: RUF012

    def __init__(self, name: str, config: Config) -> None:
        if shutil.which("runsc") is None:
            raise Unavailable("gVisor's runsc is not installed (apt-get install runsc)")
        if os.geteuid() != 0:
            raise Unavailable("the gvisor mechanism needs root")
        super().__init__(name, config)


class AsyncsandboxRay(Asyncsandbox):
    """``Session("ray")``: each sandbox on a node of a Ray cluster, through the node's agent
    actor, which runs it with the process backend (as ``asyncsandbox-process`` does, in
    the driver itself). Unless ``--ray-address`` names a cluster, the system starts one of
    its own on this machine for the job (a head and two workers of one CPU each, in the
    worker's process group, so that they die with it) and stops it at the end."""

    def __init__(self, name: str, config: Config) -> None:
        try:
            from asyncsandbox_ray.testing import LocalCluster
        except ImportError as exc:
            raise Unavailable("asyncsandbox-ray is not installed (uv sync)") from exc
        self._cluster: LocalCluster | None = None
        self._nodes: list[str] = []
        super().__init__(name, config, lambda: "ray")

    async def __aenter__(self) -> Self:
        from asyncsandbox_ray.testing import LocalCluster

        if self.config.ray_address is None:
            cluster = LocalCluster(own_groups=False)
            self._cluster = cluster

            def start() -> None:
                cluster.start_node("head", head=True)
                cluster.start_node("w1")
                cluster.start_node("w2")

            await anyio.to_thread.run_sync(start)
            self._backend_options = cluster.backend_options()
            self.notes.append("a local Ray cluster: a head and two workers, one CPU each")
        else:
            self._backend_options = {"address": self.config.ray_address}
        return await super().__aenter__()

    async def ready(self) -> None:
        # The first sandbox of a node starts the node's agent (seconds): not measured.
        import ray

        nodes = await anyio.to_thread.run_sync(ray.nodes)
        self._nodes = [str(n["NodeID"]) for n in nodes if n.get("Alive")]
        sandboxes = [await self.create() for _ in self._nodes]  # placement spreads them
        for sandbox in sandboxes:
            await self.remove(sandbox)

    async def aclose(self) -> None:
        try:
            await super().aclose()
        finally:
            import ray

            await anyio.to_thread.run_sync(ray.shutdown)
            if self._cluster is not None:
                await anyio.to_thread.run_sync(self._cluster.stop)
                for node in self._nodes:  # the nodes' sandbox roots (empty unless leftovers)
                    shutil.rmtree(f"/var/lib/asyncsandbox/ray-{node[:16]}", ignore_errors=True)

    async def count_leftovers(self) -> int | None:
        held = int(self.session.statistics().live.active)
        tag = f"{_daemon.TAG_PREFIX}{self.config.run_id}"
        return max(0, len(await self.session.list(tags=[tag])) - held)


def process_leftovers(root: str) -> int | None:
    from pathlib import Path

    path = Path(root)
    if not path.is_dir():
        return 0
    return sum(1 for entry in path.iterdir() if not entry.name.startswith("."))


# -- raw aiodocker --------------------------------------------------------------------


class RawAiodocker(System):
    """The Engine API through aiodocker with no runtime: the floor of the API path.

    create + start; exec create, start (attached), inspect; archive put and get;
    force-remove. Every call has a deadline; concurrency is only the workload's own."""

    def __init__(self, name: str, config: Config) -> None:
        super().__init__(name, config)
        import aiodocker

        self._aiodocker = aiodocker
        self.docker: Any = None

    async def __aenter__(self) -> Self:
        docker = self._aiodocker.Docker()
        connector = docker.session.connector
        if connector is not None:
            connector._limit = 0  # aiohttp: 0 = no connection limit
        self.docker = docker
        with anyio.fail_after(self.config.op_deadline):
            await docker.system.info()
        return self

    async def aclose(self) -> None:
        if self.docker is not None:
            await self.docker.close()

    def _config(self) -> dict[str, Any]:
        return {
            "Image": self.config.image,
            "Entrypoint": ["sleep"],
            "Cmd": [LIFETIME],
            "Labels": {_daemon.RUN_LABEL: self.config.run_id},
            "HostConfig": {
                "Init": True,
                "NetworkMode": "none",
                "Memory": MEMORY,
                "MemorySwap": MEMORY,
                "PidsLimit": PIDS,
                "CapDrop": ["ALL"],
                "SecurityOpt": ["no-new-privileges"],
                "LogConfig": {"Type": "none", "Config": {}},
            },
        }

    async def create(self) -> Any:
        deadline = self.config.op_deadline
        with anyio.fail_after(deadline):
            container = await self.docker.containers.create(
                self._config(), name=_name(self.config.run_id)
            )
        try:
            with anyio.fail_after(deadline):
                await container.start()
        except BaseException:
            with anyio.CancelScope(shield=True), anyio.move_on_after(deadline):
                await container.delete(force=True, v=True)
            raise
        return container

    async def remove(self, handle: Any) -> None:
        with anyio.fail_after(self.config.op_deadline):
            await handle.delete(force=True, v=True)

    async def exec(self, handle: Any, argv: tuple[str, ...]) -> tuple[int, bytes]:
        out = bytearray()
        with anyio.fail_after(self.config.op_deadline):
            execution = await handle.exec(list(argv), stdout=True, stderr=True)
            async with execution.start(detach=False) as stream:
                while (message := await stream.read_out()) is not None:
                    if message.stream == 1:
                        out += message.data
            details = await execution.inspect()
        return int(details["ExitCode"]), bytes(out)

    async def write_file(self, handle: Any, data: bytes) -> None:
        with anyio.fail_after(self.config.op_deadline):
            await handle.put_archive(BASELINE_DIR, single_file_tar(FILE_NAME, data))

    async def read_file(self, handle: Any) -> bytes:
        with anyio.fail_after(self.config.op_deadline):
            archive = await handle.get_archive(f"{BASELINE_DIR}/{FILE_NAME}")
        return first_file(archive)

    def leftovers(self) -> int | None:
        return docker_leftovers(self.config.run_id)


# -- docker-py ------------------------------------------------------------------------


class DockerPy(System):
    """The synchronous ``docker`` SDK, each operation in a worker thread of a pool as wide
    as the workload's concurrency: what most RL stacks do today. The client's ``timeout``
    bounds every call; a call that runs over the operation deadline is abandoned."""

    def __init__(self, name: str, config: Config) -> None:
        super().__init__(name, config)
        try:
            self._docker: Any = importlib.import_module("docker")
        except ImportError as exc:
            raise Unavailable("docker-py is not installed (uv sync --group bench)") from exc
        self.client: Any = None
        self._limiter = anyio.CapacityLimiter(max(1, config.width))

    def set_width(self, width: int) -> None:
        self._limiter.total_tokens = max(1, width)

    async def _thread(self, func: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        return await anyio.to_thread.run_sync(
            functools.partial(func, *args, **kwargs),
            limiter=self._limiter,
            abandon_on_cancel=True,  # a thread cannot be cancelled; its call has a timeout
        )

    async def __aenter__(self) -> Self:
        self.client = await self._thread(
            self._docker.DockerClient,
            base_url=f"unix://{_daemon.SOCKET}",
            timeout=int(self.config.op_deadline),
            max_pool_size=256,
        )
        return self

    async def aclose(self) -> None:
        if self.client is not None:
            self.client.close()

    def _run(self) -> Any:
        return self.client.containers.run(
            self.config.image,
            [LIFETIME],
            entrypoint=["sleep"],
            detach=True,
            name=_name(self.config.run_id),
            labels={_daemon.RUN_LABEL: self.config.run_id},
            init=True,
            network_mode="none",
            mem_limit=MEMORY,
            memswap_limit=MEMORY,
            pids_limit=PIDS,
            cap_drop=["ALL"],
            security_opt=["no-new-privileges"],
            log_config={"type": "none"},
        )

    async def create(self) -> Any:
        return await self._thread(self._run)

    async def remove(self, handle: Any) -> None:
        await self._thread(handle.remove, force=True, v=True)

    async def exec(self, handle: Any, argv: tuple[str, ...]) -> tuple[int, bytes]:
        result = await self._thread(handle.exec_run, list(argv), demux=True)
        stdout = result.output[0] if result.output else None
        return int(result.exit_code), stdout or b""

    async def write_file(self, handle: Any, data: bytes) -> None:
        ok = await self._thread(handle.put_archive, BASELINE_DIR, single_file_tar(FILE_NAME, data))
        if not ok:
            raise CommandFailed("put_archive returned False")

    async def read_file(self, handle: Any) -> bytes:
        def get() -> bytes:
            chunks, _ = handle.get_archive(f"{BASELINE_DIR}/{FILE_NAME}")
            return b"".join(chunks)

        return first_file(await self._thread(get))

    def leftovers(self) -> int | None:
        return docker_leftovers(self.config.run_id)


# -- docker CLI -----------------------------------------------------------------------


class DockerCli(System):
    """The ``docker`` command line, one subprocess per operation (killed at the deadline)."""

    def __init__(self, name: str, config: Config) -> None:
        super().__init__(name, config)
        executable = shutil.which("docker")
        if executable is None:
            raise Unavailable("the docker CLI is not installed")
        self._docker = executable

    async def _docker_cli(self, *args: str, stdin: bytes | None = None) -> bytes:
        with anyio.fail_after(self.config.op_deadline):
            done = await anyio.run_process([self._docker, *args], input=stdin, check=False)
        if done.returncode != 0:
            raise CommandFailed(
                f"docker {args[0]} exited {done.returncode}: "
                f"{done.stderr.decode(errors='replace').strip()[:200]}"
            )
        return done.stdout

    async def create(self) -> Any:
        name = _name(self.config.run_id)
        await self._docker_cli(
            "run", "-d", "--name", name,
            "--label", f"{_daemon.RUN_LABEL}={self.config.run_id}",
            "--init", "--network", "none",
            "--memory", str(MEMORY), "--memory-swap", str(MEMORY),
            "--pids-limit", str(PIDS), "--cap-drop", "ALL",
            "--security-opt", "no-new-privileges", "--log-driver", "none",
            "--entrypoint", "sleep", self.config.image, LIFETIME,
        )  # fmt: skip
        return name

    async def remove(self, handle: Any) -> None:
        await self._docker_cli("rm", "-f", "-v", handle)

    async def exec(self, handle: Any, argv: tuple[str, ...]) -> tuple[int, bytes]:
        with anyio.fail_after(self.config.op_deadline):
            done = await anyio.run_process([self._docker, "exec", handle, *argv], check=False)
        return done.returncode, done.stdout

    async def write_file(self, handle: Any, data: bytes) -> None:
        await self._docker_cli(
            "cp", "-", f"{handle}:{BASELINE_DIR}", stdin=single_file_tar(FILE_NAME, data)
        )

    async def read_file(self, handle: Any) -> bytes:
        return first_file(await self._docker_cli("cp", f"{handle}:{BASELINE_DIR}/{FILE_NAME}", "-"))

    def leftovers(self) -> int | None:
        return docker_leftovers(self.config.run_id)


# -- spawn floors ---------------------------------------------------------------------


SPAWN_ENV = {"PATH": "/usr/sbin:/usr/bin:/sbin:/bin", "LANG": "C.UTF-8"}
"""The system's own ``python3`` (Debian's, as in the image), not a developer's shim."""


class HostSpawn(System):
    """The command spawned directly on the host: the process-creation floor."""

    prefix: tuple[str, ...] = ()

    async def create(self) -> Any:
        return None

    async def remove(self, handle: Any) -> None:
        pass

    async def exec(self, handle: Any, argv: tuple[str, ...]) -> tuple[int, bytes]:
        with anyio.fail_after(self.config.op_deadline):
            done = await anyio.run_process([*self.prefix, *argv], check=False, env=SPAWN_ENV)
        return done.returncode, done.stdout

    async def write_file(self, handle: Any, data: bytes) -> None:
        raise Unavailable("spawn floors run the exec workload only")

    async def read_file(self, handle: Any) -> bytes:
        raise Unavailable("spawn floors run the exec workload only")


BWRAP_ARGS = (
    "--unshare-user", "--unshare-pid", "--unshare-ipc", "--unshare-uts", "--unshare-net",
    "--unshare-cgroup-try", "--die-with-parent", "--new-session",
    "--ro-bind", "/usr", "/usr", "--symlink", "usr/bin", "/bin", "--symlink", "usr/lib", "/lib",
    "--symlink", "usr/lib64", "/lib64", "--symlink", "usr/sbin", "/sbin",
    "--ro-bind", "/etc", "/etc", "--proc", "/proc", "--dev", "/dev", "--tmpfs", "/tmp",
    "--",
)  # fmt: skip
"""Fresh user, PID, IPC, UTS and network namespaces over a read-only ``/usr`` and ``/etc``:
roughly what the process backend builds, without its shell entry and privilege drop."""


class BwrapSpawn(HostSpawn):
    """The command spawned under bubblewrap: the floor of namespace-isolated spawning."""

    def __init__(self, name: str, config: Config) -> None:
        super().__init__(name, config)
        executable = shutil.which("bwrap")
        if executable is None:
            raise Unavailable("bubblewrap is not installed (apt-get install bubblewrap)")
        self.prefix = (executable, *BWRAP_ARGS)


# -- registry -------------------------------------------------------------------------


@dataclass(frozen=True)
class SystemInfo:
    name: str
    kind: Kind
    workloads: frozenset[str]
    description: str
    factory: Callable[[str, Config], System]


def _docker_variant(variant: Variant) -> Callable[[str, Config], System]:
    return lambda name, config: AsyncsandboxDocker(name, config, variant)


SYSTEMS: dict[str, SystemInfo] = {
    **{
        name: SystemInfo(name, "docker", ALL_WORKLOADS, v.description, _docker_variant(v))
        for name, v in DOCKER_VARIANTS.items()
    },
    "asyncsandbox-process": SystemInfo(
        "asyncsandbox-process",
        "process",
        ALL_WORKLOADS,
        "Session(ProcessBackend(root=/var/lib/asyncsandbox/bench-<run>)), default Limits: "
        "the embedded backend (its default mechanism: bubblewrap if installed; cgroups as "
        "root)",
        AsyncsandboxProcess,
    ),
    "asyncsandbox-process-bwrap": SystemInfo(
        "asyncsandbox-process-bwrap",
        "process",
        ALL_WORKLOADS,
        "the process backend, a bubblewrap launch per command (fast_path=False)",
        AsyncsandboxProcessBwrap,
    ),
    "asyncsandbox-process-native": SystemInfo(
        "asyncsandbox-process-native",
        "process",
        ALL_WORKLOADS,
        "the process backend, a native launch per command (fast_path=False; what runs "
        "where bubblewrap is missing and the fast path is off)",
        AsyncsandboxProcessNative,
    ),
    "asyncsandbox-process-fast": SystemInfo(
        "asyncsandbox-process-fast",
        "process",
        ALL_WORKLOADS,
        "the process backend's fast path: each sandbox's resident executor forks the "
        "command (isolation='native', fast_path=True)",
        AsyncsandboxProcessFast,
    ),
    "asyncsandbox-process-gvisor": SystemInfo(
        "asyncsandbox-process-gvisor",
        "process",
        ALL_WORKLOADS,
        "the process backend's gvisor mechanism: each sandbox a gVisor sandbox (runsc), its "
        "resident executor inside (isolation='gvisor')",
        AsyncsandboxProcessGVisor,
    ),
    "asyncsandbox-ray": SystemInfo(
        "asyncsandbox-ray",
        "ray",
        frozenset({"exec", "lifecycle", "rollout"}),
        'Session("ray") on a local Ray cluster (a head and two workers of one CPU each, '
        "started for the job) or --ray-address: each call goes to the sandbox's node agent, "
        "which runs it on the process backend; compare with asyncsandbox-process, the same "
        "backend in the driver",
        AsyncsandboxRay,
    ),
    "raw-aiodocker": SystemInfo(
        "raw-aiodocker",
        "docker",
        ALL_WORKLOADS,
        "the Engine API through aiodocker, no runtime, unbounded (only the workload's own "
        "concurrency): the floor of the API path",
        RawAiodocker,
    ),
    "docker-py": SystemInfo(
        "docker-py",
        "docker",
        ALL_WORKLOADS,
        "the synchronous docker SDK (containers.run/exec_run/put_archive/get_archive/"
        "remove) in a thread pool as wide as the concurrency: common practice",
        DockerPy,
    ),
    "docker-cli": SystemInfo(
        "docker-cli",
        "docker",
        ALL_WORKLOADS,
        "the docker CLI, one subprocess per operation (run -d, exec, cp, rm -f)",
        DockerCli,
    ),
    "host-spawn": SystemInfo(
        "host-spawn",
        "host",
        frozenset({"exec"}),
        "the command spawned on the host (anyio.run_process): the process-creation floor",
        HostSpawn,
    ),
    "bwrap-spawn": SystemInfo(
        "bwrap-spawn",
        "host",
        frozenset({"exec"}),
        "the command spawned under bubblewrap with fresh namespaces: the isolated-spawn floor",
        BwrapSpawn,
    ),
}

DOCKER_SYSTEMS = tuple(name for name, info in SYSTEMS.items() if info.kind == "docker")
FLOORS = {"api": "raw-aiodocker", "spawn": "host-spawn"}
RAY_DIRECT = "asyncsandbox-process"
"""What Ray's hop is measured against: the nodes' backend, run in the driver itself."""
BASELINE = "docker-py"


def make(name: str, config: Config) -> System:
    return SYSTEMS[name].factory(name, config)
