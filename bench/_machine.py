"""The stamp on every result: what machine, engine and software produced it."""

from __future__ import annotations

import hashlib
import os
import platform
import shutil
import subprocess
import sys
from importlib import metadata
from pathlib import Path
from typing import Any

from . import _daemon

REPO = Path(__file__).resolve().parent.parent
PACKAGES = (
    "asyncsandbox",
    "asyncsandbox-docker",
    "anyio",
    "trio",
    "msgspec",
    "structlog",
    "aiodocker",
    "aiohttp",
    "docker",
    "requests",
    "matplotlib",
)


def _run(argv: list[str]) -> str | None:
    if shutil.which(argv[0]) is None:
        return None
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=15, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return (done.stdout or done.stderr).strip() or None


def _cpu_model() -> str | None:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return None


def _os_name() -> str | None:
    try:
        for line in Path("/etc/os-release").read_text().splitlines():
            if line.startswith("PRETTY_NAME="):
                return line.split("=", 1)[1].strip('"')
    except OSError:
        pass
    return None


def source_digest() -> str:
    """sha256 over the runtime's and backends' Python sources (which code was measured;
    the harness does not read version control)."""
    digest = hashlib.sha256()
    for top in ("asyncsandbox", "backends", "integrations", "bench"):
        for path in sorted((REPO / top).rglob("*.py")):
            digest.update(str(path.relative_to(REPO)).encode())
            digest.update(path.read_bytes())
    return digest.hexdigest()[:16]


def packages() -> dict[str, str | None]:
    out: dict[str, str | None] = {}
    for name in PACKAGES:
        try:
            out[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            out[name] = None
    return out


def docker_engine() -> dict[str, Any]:
    try:
        v = _daemon.version()
        i = _daemon.info()
    except (_daemon.DaemonTimeout, _daemon.DaemonError) as exc:
        return {"error": str(exc)}
    components = {c.get("Name"): c.get("Version") for c in v.get("Components", [])}
    return {
        "version": v.get("Version"),
        "api_version": v.get("ApiVersion"),
        "containerd": components.get("containerd"),
        "runc": components.get("runc"),
        "storage_driver": i.get("Driver"),
        "cgroup_driver": i.get("CgroupDriver"),
        "cgroup_version": i.get("CgroupVersion"),
        "command_line": _daemon.dockerd_command(),
        "cli_version": _run(["docker", "version", "--format", "{{.Client.Version}}"]),
    }


def machine() -> dict[str, Any]:
    mem_kib = _daemon.meminfo_kib("MemTotal")
    return {
        "hostname": platform.node(),
        "cores": os.cpu_count(),
        "cpu_model": _cpu_model(),
        "memory_gib": round(mem_kib / 1024 / 1024, 1),
        "kernel": platform.release(),
        "os": _os_name(),
        "python": sys.version.split()[0],
        "python_implementation": platform.python_implementation(),
        "packages": packages(),
        "docker": docker_engine(),
        "bwrap": _run(["bwrap", "--version"]),
        "source_digest": source_digest(),
    }


def short(stamp: dict[str, Any]) -> str:
    """One line for the Markdown header."""
    docker = stamp.get("docker", {})
    pkgs = stamp.get("packages", {})
    engine = docker.get("version") or f"unavailable ({docker.get('error')})"
    return (
        f"{stamp['cores']} cores ({stamp.get('cpu_model')}), {stamp['memory_gib']} GiB, "
        f"Linux {stamp['kernel']} ({stamp.get('os')}), Docker engine {engine} "
        f"(containerd {docker.get('containerd')}, runc {docker.get('runc')}, "
        f"{docker.get('storage_driver')}, cgroup v{docker.get('cgroup_version')}), "
        f"Python {stamp['python']}, asyncsandbox {pkgs.get('asyncsandbox')}, "
        f"aiodocker {pkgs.get('aiodocker')}, docker-py {pkgs.get('docker')}, "
        f"anyio {pkgs.get('anyio')}, trio {pkgs.get('trio')}, {stamp.get('bwrap')}, "
        f"sources {stamp['source_digest']}"
    )
