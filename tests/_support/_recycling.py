"""Recycling: what an episode leaves (it plants state in every writable place it reaches),
what a fresh sandbox looks like, and the checks of a recycling session: a recycled sandbox
is indistinguishable from a fresh one, and episodes hand over no state."""

from __future__ import annotations

import textwrap
from collections.abc import Awaitable, Callable

import anyio

from asyncsandbox import ExecResult, Sandbox, Session

from ._host import processes_gone, unique_marker
from ._waiting import eventually_async


def plant(marker: str) -> str:
    """A script that leaves something in every writable place an episode reaches: files
    (workdir, /tmp, /dev/shm, the home's dotfiles and what `pip install --user` writes),
    processes (a daemon in its own session, a cron-like loop appending to a file whose
    command line carries ``marker``, one ignoring SIGTERM), IPC objects (a System V message
    queue and semaphore, POSIX shared memory), the environment later commands start with (a
    login shell's profile), and the modes and extended attributes of the places it owns (the
    workdir, the home)."""
    return textwrap.dedent(
        r"""
        set -e
        echo planted > /workspace/planted
        mkdir -p /workspace/deep/er && echo x > /workspace/deep/er/file
        echo planted > /tmp/planted
        echo planted > /dev/shm/planted 2>/dev/null || true
        echo 'export PLANTED=1' >> ~/.profile
        echo 'export PLANTED=1' >> ~/.bashrc
        mkdir -p ~/.local/lib/python3/site-packages && echo 'x = 1' > ~/.local/lib/python3/site-packages/planted.py
        setsid sh -c 'while :; do date +%s%N >> /tmp/loop; sleep 0.05; done' MARKER </dev/null >/dev/null 2>&1 &
        (trap '' TERM HUP; exec sleep 1001) </dev/null >/dev/null 2>&1 &
        nohup sleep 1002 </dev/null >/dev/null 2>&1 &
        python3 - <<'PY'
        import os, sys
        try:
            from multiprocessing import shared_memory
            shared_memory.SharedMemory(name="planted", create=True, size=4096).close()
        except Exception as exc:
            print("no posix shm:", exc, file=sys.stderr)
        PY
        if command -v ipcmk >/dev/null; then ipcmk -Q >/dev/null; ipcmk -S 1 >/dev/null; fi
        python3 -c "import os; os.setxattr('/workspace', 'user.planted', b'1')" 2>/dev/null || true
        chmod 700 ~ && chmod 500 /workspace
        echo done
        """
    ).replace("MARKER", f"loop-{marker}")


LOOK = textwrap.dedent(
    r"""
    echo "files: $(find /workspace /tmp ~ -mindepth 1 2>/dev/null | sort | tr '\n' ' ')"
    echo "shm: $(ls -A /dev/shm 2>/dev/null | tr '\n' ' ')"
    echo "processes: $(ps -eo args= 2>/dev/null | grep -c -E 'sleep 100[12]|while [:]' || true)"
    echo "procs-any: $(for p in /proc/[0-9]*; do cat $p/cmdline 2>/dev/null | tr '\0' ' '; echo; done | grep -c -E 'sleep 100[12]|while [:]' || true)"
    if command -v ipcs >/dev/null; then echo "ipc: $(ipcs -q -s | grep -c '^0x' || true)"; fi
    echo "env: PLANTED=${PLANTED:-unset}"
    echo "modes: $(stat -c '%a %u %n' /workspace ~ /tmp 2>&1 | tr '\n' ' ')"
    echo "xattrs: $(python3 -c 'import os; print([sorted(os.listxattr(p)) for p in ("/workspace", os.path.expanduser("~"))])' 2>&1)"
    echo "login env: $(sh -lc 'echo ${PLANTED:-unset}')"
    """
)
"""What a sandbox shows of the places :func:`plant` writes to (the same script on a fresh
sandbox and a reused one)."""


async def look(sandbox: Sandbox) -> str:
    result = await sandbox.exec(["sh", "-c", LOOK])
    assert result.returncode == 0, result.stderr_text
    return result.stdout_text


async def pool_ready(s: Session, n: int, *, within: float = 30) -> None:
    """Wait until the session's warm pool holds ``n`` ready sandboxes."""
    await eventually_async(
        lambda: s.statistics().pool_ready >= n, within=within, what=f"{n} ready in the pool"
    )


async def a_recycled_sandbox_is_fresh(s: Session, *, within: float = 30) -> None:
    """The check of a recycling session (a warm pool of one, ``recycle=True``): an
    episode plants state everywhere; the next episodes get its sandbox back, reset, and it
    looks exactly like a fresh one. The planted loop is gone from the host (it can write
    no more) before the sandbox is looked at: a loop that survived would have written."""
    marker = unique_marker()
    async with s.sandbox() as fresh:
        expected = await look(fresh)
        first_id = fresh.id
        result = await fresh.exec(["sh", "-c", plant(marker)])
        assert result.stdout_text.strip().endswith("done"), result.stderr_text
        # The planted state is there while the episode lasts (so the check below can fail).
        assert await look(fresh) != expected
    # The next episode gets the same sandbox back (reset, in the background), not a new
    # one: it is the pool's one sandbox (its size counts the one out in an episode).
    await pool_ready(s, 1, within=within)
    async with s.sandbox() as reused:
        assert reused.id == first_id, "the released sandbox was not recycled"
        assert await processes_gone(f"loop-{marker}", within=within) == []
        assert await look(reused) == expected
    assert s.metrics()["asyncsandbox/reset_failures"] == 0


async def episodes_leave_nothing(s: Session, *, episodes: int, concurrency: int) -> set[str]:
    """Episodes through a recycling session, ``concurrency`` at a time: each checks that
    its sandbox looks fresh, then plants state everywhere. Return the sandbox ids used."""
    async with s.sandbox() as first:
        fresh = await look(first)
    seen: set[str] = set()
    limiter = anyio.Semaphore(concurrency)

    async def episode() -> None:
        async with limiter, s.sandbox() as sandbox:
            assert sandbox.id is not None
            seen.add(sandbox.id)
            assert await look(sandbox) == fresh, f"{sandbox.id} was handed over dirty"
            result = await sandbox.exec(["sh", "-c", plant(unique_marker())])
            assert result.stdout_text.strip().endswith("done"), result.stderr_text

    async with anyio.create_task_group() as tg:
        for _ in range(episodes):
            tg.start_soon(episode)
    assert s.metrics()["asyncsandbox/reset_failures"] == 0
    return seen


NETWORK_PLANT = textwrap.dedent(
    r"""
    import socket
    udp = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    for _ in range(500):
        udp.sendto(b"planted", ("127.0.0.1", 9))
    # A TCP connection closed by its client first: the client's end stays in TIME_WAIT
    # (a minute) once every process is gone.
    server = socket.create_server(("127.0.0.1", 0))
    client = socket.create_connection(server.getsockname())
    conn, _ = server.accept()
    client.sendall(b"planted")
    conn.recv(7)
    client.close()
    conn.close()
    print("done")
    """
)
"""Traffic on the sandbox's loopback, and what outlives the processes that made it: the
network namespace's counters (``/proc/net/snmp``, ``/proc/net/dev``) and a TCP
connection in TIME_WAIT."""

NETWORK_LOOK = textwrap.dedent(
    r"""
    for f in snmp snmp6 netstat dev; do cat /proc/net/$f 2>&1 | sed "s/^/$f: /"; done
    for f in tcp tcp6 udp udp6 raw unix; do echo "$f: $(cat /proc/net/$f 2>&1 | wc -l) lines"; done
    python3 - <<'PY'
    import socket
    server = socket.create_server(("127.0.0.1", 0))
    client = socket.create_connection(server.getsockname())
    conn, _ = server.accept()
    client.sendall(b"ok")
    print("loopback:", conn.recv(2).decode())
    PY
    """
)
"""What a command sees of its network namespace, each line headed by where it comes
from (its counters and socket tables, read before it makes traffic of its own; the socket
tables by their length, since their lines carry inode numbers), and whether its loopback
carries traffic."""


async def a_recycled_sandbox_has_a_fresh_network(
    s: Session,
    executor: Callable[[Sandbox], Awaitable[object]],
    *,
    carried: frozenset[str] = frozenset(),
) -> None:
    """A command sends traffic on the loopback of a recyclable sandbox; the next sandbox
    of the same settings gets it back, reset, and its first command sees the network of a
    fresh sandbox's first command. ``executor`` tells which executor runs a sandbox's
    commands: the reset keeps it (one that started a new one would give a fresh network
    too, at the cost of a start: that is not what is checked here). ``carried``: the
    files of ``/proc/net`` (``snmp``) known to keep the last episode's traffic whatever
    the reset does; they must still show it (so the check says when they stop)."""
    async with s.sandbox(recyclable=True) as sandbox:
        first_id = sandbox.id
        fresh = await sandbox.exec(["sh", "-c", NETWORK_LOOK])
        before = await executor(sandbox)
        assert fresh.returncode == 0, fresh
        assert fresh.stdout_text.endswith("loopback: ok\n"), fresh
        planted = await sandbox.exec(["python3", "-c", NETWORK_PLANT])
        assert planted.stdout_text == "done\n", planted
        # What the plant left is there while the episode lasts (so the check below can fail).
        assert (await sandbox.exec(["sh", "-c", NETWORK_LOOK])).stdout != fresh.stdout
    async with s.sandbox(recyclable=True) as sandbox:
        assert sandbox.id == first_id, "the released sandbox was not recycled"
        reused = await sandbox.exec(["sh", "-c", NETWORK_LOOK])
        assert await executor(sandbox) == before, "the reset replaced the executor"
    assert reused.returncode == 0, reused

    def lines(result: ExecResult, of_carried: bool) -> list[str]:
        return [
            line
            for line in result.stdout_text.split("\n")
            if (line.split(": ", 1)[0] in carried) == of_carried
        ]

    left = set(lines(reused, False)) - set(lines(fresh, False))
    assert lines(reused, False) == lines(fresh, False), f"left by the last episode: {left}"
    if carried:
        assert lines(reused, True) != lines(fresh, True), f"{sorted(carried)} are fresh now"
