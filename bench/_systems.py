"""The systems measured, by name: the runtime's (:mod:`._ours`) and the baselines
(:mod:`._peers`), all behind one interface (:mod:`._system`)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from ._ours import (
    DOCKER_VARIANTS,
    AsyncsandboxDocker,
    AsyncsandboxProcess,
    AsyncsandboxProcessBwrap,
    AsyncsandboxProcessFast,
    AsyncsandboxProcessGVisor,
    AsyncsandboxProcessNative,
    AsyncsandboxRay,
    Variant,
)
from ._peers import BwrapSpawn, DockerCli, DockerPy, HostSpawn, RawAiodocker
from ._system import ALL_WORKLOADS, Config, Kind, System

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
