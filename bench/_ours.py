"""The runtime measured: a Session on each backend (:class:`Asyncsandbox` and its
variants)."""

from __future__ import annotations

import inspect
import os
import shutil
from collections.abc import Callable, Mapping
from contextlib import AsyncExitStack
from dataclasses import dataclass, field
from typing import Any, Self

import anyio
import anyio.to_thread

from . import _daemon
from ._system import FILE_NAME, Config, System, Unavailable, docker_leftovers

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
        if not self._warm_pool or self.config.count_fill:
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
