"""Rollouts/s through the Ray backend against the process backend directly: the cost of
the hop to a node's actor, and how the sandboxes spread over the nodes.

A rollout: create a sandbox, write a 4 KiB file, run ``python3 -c ...`` twice, read the
file back, remove the sandbox. Needs a running Ray cluster (``--address``); see
``backends/ray/README.md`` for the local one this was measured on.

    uv run python bench/ray_rollouts.py --address 127.0.0.2:PORT --rollouts 200 --concurrency 16
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from collections import Counter
from typing import Any

import anyio
from asyncsandbox_ray import RayAttributes

from asyncsandbox import Session

PROGRAM = "print(sum(range(1000)))"


async def run(
    backend: str, options: dict[str, Any], rollouts: int, concurrency: int
) -> dict[str, Any]:
    latencies: list[float] = []
    nodes: Counter[str] = Counter()
    errors: Counter[str] = Counter()
    limiter = anyio.CapacityLimiter(concurrency)
    payload = b"x" * 4096

    async with Session(backend, backend_options=options) as session:

        async def rollout() -> None:
            async with limiter:
                started = time.perf_counter()
                try:
                    async with session.sandbox() as sb:
                        await sb.write_file("data.bin", payload)
                        for _ in range(2):
                            result = await sb.exec(["python3", "-c", PROGRAM])
                            assert result.stdout == b"499500\n", result
                        assert await sb.read_file("data.bin") == payload
                        if backend == "ray":
                            nodes[sb.extra(RayAttributes.node_id)[:8]] += 1
                except Exception as exc:  # noqa: BLE001 - counted by type
                    errors[type(exc).__name__] += 1
                    return
                latencies.append(time.perf_counter() - started)

        started = time.perf_counter()
        async with anyio.create_task_group() as tg:
            for _ in range(rollouts):
                tg.start_soon(rollout)
        elapsed = time.perf_counter() - started
        left = len(await session.list())
    latencies.sort()
    return {
        "backend": backend,
        "rollouts": rollouts,
        "concurrency": concurrency,
        "seconds": round(elapsed, 2),
        "rollouts_per_s": round(len(latencies) / elapsed, 1),
        "p50_ms": round(1000 * statistics.median(latencies), 1) if latencies else None,
        "p99_ms": round(1000 * latencies[int(0.99 * (len(latencies) - 1))], 1)
        if latencies
        else None,
        "errors": dict(errors),
        "left_over": left,
        "per_node": dict(nodes),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--address", required=True, help="the Ray cluster (host:port)")
    parser.add_argument("--node-ip", default="127.0.0.2", help="this driver's node address")
    parser.add_argument("--rollouts", type=int, default=200)
    parser.add_argument("--concurrency", type=int, default=16)
    args = parser.parse_args()
    ray_options = {"address": args.address, "init_options": {"_node_ip_address": args.node_ip}}
    for backend, options in (("process", {}), ("ray", ray_options)):
        figures = anyio.run(run, backend, options, args.rollouts, args.concurrency)
        print(json.dumps(figures))


if __name__ == "__main__":
    main()
