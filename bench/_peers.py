"""The baselines the runtime is measured against: the Engine API through aiodocker, the
docker SDK, the docker CLI, and spawning on the host (bare, and under bubblewrap)."""

from __future__ import annotations

import functools
import importlib
import shutil
from collections.abc import Callable
from typing import Any, Self, TypeVar

import anyio
import anyio.to_thread

from . import _daemon
from ._system import (
    BASELINE_DIR,
    FILE_NAME,
    LIFETIME,
    MEMORY,
    PIDS,
    CommandFailed,
    Config,
    System,
    Unavailable,
    container_name,
    docker_leftovers,
    first_file,
    single_file_tar,
)

T = TypeVar("T")

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
                self._config(), name=container_name(self.config.run_id)
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
            name=container_name(self.config.run_id),
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
        name = container_name(self.config.run_id)
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
