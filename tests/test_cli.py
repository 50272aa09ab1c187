"""The asyncsandbox command line, run as a user would run it."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path


def cli(*args: str, root: Path, stdin: bytes | None = None) -> subprocess.CompletedProcess[bytes]:
    env = {**os.environ, "ASYNCSANDBOX_PROCESS_ROOT": str(root)}
    return subprocess.run(
        [sys.executable, "-m", "asyncsandbox", *args],
        input=stdin,
        capture_output=True,
        timeout=120,
        env=env,
        check=False,
    )


def test_demo_runs_the_main_job(process_root: Path) -> None:
    done = cli("demo", root=process_root)
    out = done.stdout.decode()
    assert done.returncode == 0, out + done.stderr.decode()
    assert "Problem 3 (syntax-error): reward=0.0 [FAIL] OK" in out
    assert "Problem 5 (infinite-loop): reward=0.0 [TIMEOUT] OK" in out
    assert "Total reward: 3.0/6" in out
    assert "6 started, 6 removed" in out
    # Results are printed as they complete: the quick failures before the slow passes.
    progress = [line for line in out.splitlines() if line.strip().startswith("[")]
    assert "syntax-error" in progress[0] or "string-ops" in progress[0]
    assert "infinite-loop" in progress[-1]


def test_exec_passes_status_output_and_stdin(process_root: Path) -> None:
    done = cli(
        "exec",
        "--stdin",
        "--",
        "sh",
        "-c",
        "cat; echo err >&2; exit 3",
        root=process_root,
        stdin=b"in\n",
    )
    assert done.returncode == 3
    assert done.stdout == b"in\n"
    assert done.stderr == b"err\n"
    timed = cli("exec", "--timeout", "0.5", "--", "sleep", "30", root=process_root)
    assert timed.returncode == 137
    assert b"timed out" in timed.stderr


def test_ls_rm_and_gc(process_root: Path) -> None:
    script = (
        "import anyio, asyncsandbox\n"
        "async def main():\n"
        "    async with asyncsandbox.Session(sweep=False) as s:\n"
        "        for tag in ('cli-a', 'cli-a', 'cli-b'):\n"
        "            sb = await s.sandbox(tags=[tag]).start()\n"
        "            s._sandboxes.discard(sb)  # leave it behind on purpose\n"
        "anyio.run(main)\n"
    )
    env = {**os.environ, "ASYNCSANDBOX_PROCESS_ROOT": str(process_root)}
    subprocess.run([sys.executable, "-c", script], check=True, env=env, timeout=60)
    listed = json.loads(cli("ls", "--json", root=process_root).stdout)
    assert sorted(tag for info in listed for tag in info["tags"]) == ["cli-a", "cli-a", "cli-b"]
    # Their owner has exited: they are not running, whatever the backend says.
    assert {info["status"] for info in listed} == {"dead"}
    table = cli("ls", root=process_root).stdout.decode()
    assert "running" not in table
    assert table.count("(owner process is gone: `asyncsandbox gc` removes it)") == 3
    assert cli("ls", "--status", "running", root=process_root).stdout == b"no sandboxes\n"
    assert cli("ls", "--tag", "cli-a", root=process_root).stdout.decode().count("cli-a") == 2
    removed = cli("rm", "--tag", "cli-a", root=process_root)
    assert removed.returncode == 0
    assert removed.stdout.decode().count("removed ") == 2
    missing = cli("rm", "p-000000000000", root=process_root)
    assert missing.returncode == 1
    assert b"not found: p-000000000000" in missing.stderr
    refused = cli("rm", root=process_root)
    assert refused.returncode != 0
    # The owner process has exited: gc finds the last one.
    dry = cli("gc", "--dry-run", root=process_root)
    assert b"would remove" in dry.stdout
    assert b"owner process is gone" in dry.stdout
    assert b"removed" in cli("gc", root=process_root).stdout
    assert cli("ls", root=process_root).stdout == b"no sandboxes\n"


def test_errors_are_reported_not_raised(process_root: Path) -> None:
    done = cli("ls", "--backend", "nope", root=process_root)
    assert done.returncode == 2
    assert b"BackendNotFound" in done.stderr
    assert b"Traceback" not in done.stderr
