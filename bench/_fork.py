"""Fork: N episodes from one prepared sandbox, against N sandboxes each running the setup.

The setup is a task's: a repository of about 2,000 source files checked out into the
workdir and byte-compiled, and about 50 MB of installed packages unpacked into the home
(both taken from this checkout's virtual environment, uploaded as tar archives). Measured
in one run, on one backend:

* ``setup``: N fresh sandboxes started at once, each uploading and unpacking both archives
  and compiling the repository (what every episode does today);
* ``fork``: one sandbox prepared once (not counted), then ``sandbox.fork(N)``;
* ``recycle``: with ``WarmPool(recycle=True)``, N episodes of start + one command + stop,
  three rounds (the first round creates, the next two reuse reset sandboxes), against the
  same episodes without recycling.

Every forked sandbox is checked to hold the same files as its parent.
"""

from __future__ import annotations

import argparse
import io
import json
import sys
import tarfile
import time
from pathlib import Path
from typing import Any

import anyio

from asyncsandbox import Sandbox, Session, WarmPool

RESULTS = Path(__file__).parent / "results"
SITE = Path(sys.prefix) / "lib" / f"python{sys.version_info[0]}.{sys.version_info[1]}"
SETUP = (
    "set -e; mkdir -p /workspace/repo ~/.local/lib/python3/site-packages; "
    "tar xf /tmp/repo.tar -C /workspace/repo; "
    "tar xf /tmp/packages.tar -C ~/.local/lib/python3/site-packages; "
    "rm /tmp/repo.tar /tmp/packages.tar; "
    "python3 -m compileall -q /workspace/repo >/dev/null"
)
# Every file's path, size and mode, and every directory and link: equal in a fork.
LISTING = (
    "cd / && find workspace home -mindepth 1 \\( -type f -printf '%y %p %s %m\\n' \\) -o "
    "-printf '%y %p %m %l\\n' | sort | md5sum; find workspace home | wc -l"
)


def archives(files: int, megabytes: int) -> tuple[bytes, bytes, dict[str, int]]:
    """(repository, packages) tar archives from the virtual environment's site-packages."""
    site = SITE / "site-packages"
    sources = sorted(site.rglob("*.py"))[:files]
    repo = _tar((p, p.relative_to(site)) for p in sources)
    budget, chosen = megabytes << 20, []
    for path in sorted(site.rglob("*")):
        if path.is_file() and not path.is_symlink() and path.suffix != ".py":
            size = path.stat().st_size
            if size <= budget:
                chosen.append(path)
                budget -= size
        if budget < 4096:
            break
    packages = _tar((p, p.relative_to(site)) for p in chosen)
    figures = {
        "repo_files": len(sources),
        "repo_bytes": len(repo),
        "package_files": len(chosen),
        "package_bytes": len(packages),
    }
    return repo, packages, figures


def _tar(entries: Any) -> bytes:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as tar:
        for path, name in entries:
            tar.add(path, arcname=str(name), recursive=False)
    return buffer.getvalue()


async def prepare(sandbox: Sandbox, repo: bytes, packages: bytes) -> None:
    await sandbox.write_file("/tmp/repo.tar", repo)
    await sandbox.write_file("/tmp/packages.tar", packages)
    await sandbox.exec(["sh", "-c", SETUP], check=True, timeout=600)


async def measure_setup(session: Session, n: int, repo: bytes, packages: bytes) -> float:
    started = time.perf_counter()
    sandboxes = [session.sandbox() for _ in range(n)]
    try:
        async with anyio.create_task_group() as tg:
            for sandbox in sandboxes:
                tg.start_soon(prepare, sandbox, repo, packages)
        return time.perf_counter() - started
    finally:
        for sandbox in sandboxes:
            await sandbox.stop()


async def measure_fork(
    session: Session, n: int, repo: bytes, packages: bytes
) -> tuple[float, float, bool]:
    async with session.sandbox() as parent:
        started = time.perf_counter()
        await prepare(parent, repo, packages)
        prepared = time.perf_counter() - started
        want = (await parent.exec(["sh", "-c", LISTING])).stdout
        started = time.perf_counter()
        children = await parent.fork(n)
        seconds = time.perf_counter() - started
        try:
            same = all([(await c.exec(["sh", "-c", LISTING])).stdout == want for c in children])
        finally:
            for child in children:
                await child.stop()
    return seconds, prepared, same


async def measure_episodes(backend: str, options: dict[str, Any], n: int, recycle: bool) -> float:
    pool = WarmPool(size=n, recycle=True) if recycle else None
    async with Session(backend, backend_options=options, warm_pool=pool) as session:

        async def episode() -> None:
            async with session.sandbox() as sandbox:
                await sandbox.exec(["sh", "-c", "echo work > /workspace/out"], check=True)

        started = time.perf_counter()
        for _ in range(3):
            async with anyio.create_task_group() as tg:
                for _ in range(n):
                    tg.start_soon(episode)
        return time.perf_counter() - started


async def run(args: argparse.Namespace) -> dict[str, Any]:
    repo, packages, figures = archives(args.files, args.megabytes)
    options: dict[str, Any] = {"default_image": args.image} if args.backend == "docker" else {}
    async with Session(args.backend, backend_options=options) as session:
        setup = await measure_setup(session, args.n, repo, packages)
        fork, prepared, same = await measure_fork(session, args.n, repo, packages)
    plain = await measure_episodes(args.backend, options, args.n, recycle=False)
    recycled = None
    if args.backend != "docker":  # Docker sandboxes cannot be reset yet
        recycled = await measure_episodes(args.backend, options, args.n, recycle=True)
    return {
        "backend": args.backend,
        "n": args.n,
        **figures,
        "setup_seconds": setup,
        "one_setup_seconds": prepared,
        "fork_seconds": fork,
        "fork_speedup": setup / fork,
        "forks_identical": same,
        "episodes_plain_seconds": plain,
        "episodes_recycled_seconds": recycled,
        "recycle_speedup": None if recycled is None else plain / recycled,
    }


def render(result: dict[str, Any]) -> str:
    r = result
    return "\n".join(
        [
            f"# fork ({r['backend']} backend, N={r['n']})",
            "",
            (
                f"Setup: a repository of {r['repo_files']} files ({r['repo_bytes'] >> 20} MB) "
                f"unpacked and compiled, {r['package_files']} package files "
                f"({r['package_bytes'] >> 20} MB) unpacked."
            ),
            "",
            "| what | seconds | ratio |",
            "|---|---|---|",
            f"| {r['n']} fresh sandboxes, each running the setup | {r['setup_seconds']:.2f} | 1 |",
            f"| one setup (the parent, not counted) | {r['one_setup_seconds']:.2f} | |",
            (
                f"| fork of the prepared sandbox into {r['n']} | {r['fork_seconds']:.2f} | "
                f"{r['fork_speedup']:.1f}x faster |"
            ),
            (
                f"| 3 rounds of {r['n']} episodes, sandboxes created and removed | "
                f"{r['episodes_plain_seconds']:.2f} | 1 |"
            ),
            (
                f"| the same, recycled (WarmPool(recycle=True)) | "
                f"{r['episodes_recycled_seconds']:.2f} | {r['recycle_speedup']:.2f}x faster |"
                if r["recycle_speedup"] is not None
                else "| the same, recycled | (not supported by this backend) | |"
            ),
            "",
            f"Forked sandboxes identical to their parent: {r['forks_identical']}.",
        ]
    )


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m bench fork", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument("--backend", default="process", choices=["process", "docker"])
    parser.add_argument("--image", default="asyncsandbox-test:bookworm-2", help="Docker image")
    parser.add_argument("-n", type=int, default=8, help="sandboxes (default 8)")
    parser.add_argument("--files", type=int, default=2000, help="repository files")
    parser.add_argument("--megabytes", type=int, default=50, help="size of the packages")
    parser.add_argument("--out", type=Path, default=RESULTS, help="results folder")
    args = parser.parse_args(argv)
    result = anyio.run(run, args)
    out = args.out / f"fork-{time.strftime('%Y%m%d-%H%M%S')}"
    out.mkdir(parents=True, exist_ok=True)
    (out / "results.json").write_text(json.dumps(result, indent=1))
    markdown = render(result)
    (out / "results.md").write_text(markdown)
    (args.out / "fork.md").write_text(markdown)
    print(markdown)
    print(out)
    return 0 if result["forks_identical"] else 1
