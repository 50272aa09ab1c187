"""Load test of the remote backend on loopback: many clients, many rollouts, no errors,
no leftovers.

A rollout is what an RL reward function does: create a sandbox, write a program into
it, run it with a timeout, check its output, remove the sandbox. Each client is its own
``Session(RemoteBackend(...))`` (its own connection pool), as separate trainer processes
would be; all of them share one tenant on one server (``asyncsandbox serve`` on the
process backend, started here as a subprocess unless ``--url`` is given).

    uv run python bench/remote_load.py                    # 50 clients, 2,000 rollouts
    uv run python bench/remote_load.py --clients 10 --rollouts 100 --out -

Writes its figures (rollouts/s, latency percentiles, errors, leftovers, machine) as JSON
to ``bench/results/remote_load.json`` (``--out -``: stdout only).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import anyio
from asyncsandbox_remote import RemoteBackend

from asyncsandbox import SandboxDefaults, Session

RESULTS = Path(__file__).resolve().parent / "results" / "remote_load.json"
PROGRAM = "import sys\nn = int(sys.argv[1])\nprint(sum(i * i for i in range(n)))\n"


@dataclass
class LoadResult:
    """What a load run measured."""

    clients: int
    rollouts: int
    completed: int
    seconds: float
    latencies: list[float]
    errors: Counter[str]
    leftovers: list[str]

    def summary(self) -> dict[str, Any]:
        lat = sorted(self.latencies)

        def pct(p: float) -> float | None:
            if not lat:
                return None
            return round(lat[min(len(lat) - 1, round(p / 100 * (len(lat) - 1)))] * 1000, 1)

        return {
            "clients": self.clients,
            "rollouts": self.rollouts,
            "completed": self.completed,
            "seconds": round(self.seconds, 2),
            "rollouts_per_second": round(self.completed / self.seconds, 2) if self.seconds else 0,
            "latency_ms": {
                "p50": pct(50),
                "p95": pct(95),
                "p99": pct(99),
                "max": round(lat[-1] * 1000, 1) if lat else None,
                "mean": round(sum(lat) / len(lat) * 1000, 1) if lat else None,
            },
            "errors": sum(self.errors.values()),
            "errors_by_type": dict(self.errors),
            "leftovers": len(self.leftovers),
        }


async def run_load(
    base_url: str, api_key: str, *, clients: int, rollouts: int, timeout: float = 60.0
) -> LoadResult:
    """Run ``rollouts`` rollouts spread over ``clients`` concurrent clients; then list what
    is left with the run's tag (should be nothing)."""
    tag = f"load-{uuid.uuid4().hex[:8]}"
    latencies: list[float] = []
    errors: Counter[str] = Counter()
    remaining = rollouts

    async def rollout(session: Session, n: int) -> None:
        started = time.perf_counter()
        try:
            async with session.sandbox() as sandbox:
                await sandbox.write_file("solution.py", PROGRAM)
                result = await sandbox.exec(["python3", "solution.py", str(n)], timeout=timeout)
            if (
                result.returncode != 0
                or result.stdout != f"{sum(i * i for i in range(n))}\n".encode()
            ):
                errors[f"wrong result: {result.returncode} {result.stderr[-200:]!r}"] += 1
                return
        except Exception as exc:  # noqa: BLE001 - counted: the run reports every failure
            errors[type(exc).__name__ + ": " + str(exc)[:200]] += 1
            return
        latencies.append(time.perf_counter() - started)

    async def client(index: int) -> None:
        nonlocal remaining
        backend = RemoteBackend(base_url, api_key)
        async with Session(backend, defaults=SandboxDefaults(tags=(tag,)), sweep=False) as s:
            while remaining > 0:
                remaining -= 1
                await rollout(s, 1000 + remaining % 97)

    started = time.perf_counter()
    async with anyio.create_task_group() as tg:
        for i in range(clients):
            tg.start_soon(client, i)
    seconds = time.perf_counter() - started
    async with Session(RemoteBackend(base_url, api_key), sweep=False) as session:
        leftovers = [info.id for info in await session.list(tags=[tag])]
    return LoadResult(
        clients=clients,
        rollouts=rollouts,
        completed=len(latencies),
        seconds=seconds,
        latencies=latencies,
        errors=errors,
        leftovers=leftovers,
    )


def machine() -> dict[str, Any]:
    """Where the figures were measured."""
    model = None
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    memory = None
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                memory = round(int(line.split()[1]) / 1024 / 1024, 1)
    except OSError:
        pass
    from importlib.metadata import version

    return {
        "cpus": os.cpu_count(),
        "cpu_model": model,
        "memory_gib": memory,
        "kernel": platform.release(),
        "python": platform.python_version(),
        "packages": {
            name: version(name)
            for name in ("asyncsandbox", "asyncsandbox-remote", "httpx", "starlette", "uvicorn")
        },
    }


class LocalServer:
    """``asyncsandbox serve`` on the process backend, on a free loopback port."""

    def __init__(self, root: Path, api_key: str, *args: str) -> None:
        self.root = root
        self._keys = tempfile.NamedTemporaryFile("w", suffix=".keys", delete=False)  # noqa: SIM115
        self._keys.write(f"load:{api_key}\n")
        self._keys.close()
        self.log = Path(self._keys.name).with_suffix(".log")
        command = [
            sys.executable,
            "-m",
            "asyncsandbox",
            "serve",
            "--listen",
            "127.0.0.1:0",
            "--print-url",
            "--keys",
            self._keys.name,
            "--backend-option",
            f"root={root}",
            *args,
        ]
        with self.log.open("wb") as log:
            self.process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=log)
        assert self.process.stdout is not None
        line = self.process.stdout.readline().decode()
        if not line.startswith(("http://", "https://")):  # --print-url: the URL alone
            self.stop()
            raise RuntimeError(f"the server did not start: {self.log.read_text()[-2000:]}")
        self.url = line.strip()

    def stop(self) -> int:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(60)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        Path(self._keys.name).unlink(missing_ok=True)
        return self.process.returncode

    def sandbox_dirs(self) -> list[str]:
        if not self.root.exists():
            return []
        return sorted(p.name for p in self.root.iterdir() if not p.name.startswith("."))


def default_root() -> Path:
    base = Path("/var/lib/asyncsandbox") if os.geteuid() == 0 else Path.home() / ".cache"
    return base / "asyncsandbox-bench" / uuid.uuid4().hex[:10]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--clients", type=int, default=50)
    parser.add_argument("--rollouts", type=int, default=2000)
    parser.add_argument("--url", help="an existing server (default: start one here)")
    parser.add_argument("--key", help="its API key (default: $ASYNCSANDBOX_API_KEY)")
    parser.add_argument("--out", default=str(RESULTS), help="JSON file, or - for stdout only")
    args = parser.parse_args(argv)

    server: LocalServer | None = None
    root = default_root()
    if args.url:
        url, key = args.url, args.key or os.environ.get("ASYNCSANDBOX_API_KEY", "")
    else:
        key = secrets.token_hex(24)
        root.parent.mkdir(parents=True, exist_ok=True, mode=0o711)
        server = LocalServer(root, key, "--max-live-per-tenant", str(max(64, args.clients * 2)))
        url = server.url
    try:
        result = anyio.run(lambda: run_load(url, key, clients=args.clients, rollouts=args.rollouts))
    finally:
        left_dirs = server.sandbox_dirs() if server else []
        status = server.stop() if server else None
        shutil.rmtree(root, ignore_errors=True)
    report = {
        "benchmark": "remote_load",
        "description": "rollouts (create, write_file, exec python3, remove) through "
        "RemoteBackend -> asyncsandbox serve -> process backend, on loopback",
        "date": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        **result.summary(),
        "leftover_sandbox_dirs_before_shutdown": len(left_dirs),
        "server_exit_status": status,
        "machine": machine(),
    }
    text = json.dumps(report, indent=2)
    print(text)
    if args.out != "-":
        out = Path(args.out)
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(text + "\n")
    ok = report["errors"] == 0 and report["leftovers"] == 0 and not left_dirs
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
