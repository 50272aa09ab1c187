"""One measurement process: a system, a workload, its points (``python -m bench._worker
SPEC``). The orchestrator runs each in its own process group, so it can kill it whole
(docker CLI and bwrap children included) when the daemon wedges or a budget runs out."""

from __future__ import annotations

import json
import logging
import sys
import traceback
from pathlib import Path
from typing import Any

import anyio
import structlog

from ._system import Config, Unavailable
from ._systems import make
from ._workloads import WORKLOADS, Progress, overhead_point


async def _run(spec: dict[str, Any], progress: Progress) -> None:
    system = make(spec["system"], Config(**spec["config"]))
    async with system:
        progress.event("ready", notes=system.notes)
        await WORKLOADS[spec["workload"]](system, spec["setup"], spec["points"], progress)
        progress.event("notes", notes=system.notes)


def main(argv: list[str]) -> int:
    spec = json.loads(Path(argv[1]).read_text())
    # The bench is an application: it may configure structlog. Warnings and errors of the
    # runtime go to this process's log; per-call debug events would cost measurable time.
    structlog.configure(
        wrapper_class=structlog.make_filtering_bound_logger(logging.WARNING),
        logger_factory=structlog.PrintLoggerFactory(sys.stderr),
    )
    progress = Progress(Path(spec["progress"]), Path(spec["raw_dir"]))
    try:
        if spec["workload"] == "overhead":
            for index, point in enumerate(spec["points"]):
                progress.start(index)
                result, samples = anyio.run(overhead_point, point, backend=point["library"])
                progress.done(index, result, samples)
        else:
            anyio.run(_run, spec, progress)
    except Unavailable as exc:
        progress.event("unavailable", reason=str(exc))
        return 3
    except BaseException as exc:  # noqa: BLE001 - reported to the orchestrator, then exit 1
        progress.event("crash", error=repr(exc)[:1000], traceback=traceback.format_exc()[-4000:])
        return 1
    progress.event("exit")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv))
