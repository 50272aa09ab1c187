"""E2B's API on a REAL ``asyncsandbox serve`` (process and Docker backends, on loopback),
driven by the real ``e2b`` SDK (sync, and async on asyncio: the SDK's async client is
asyncio-only), pointed at the server as a user points it: ``E2B_API_URL``,
``E2B_SANDBOX_URL`` and ``E2B_API_KEY``.
"""

from __future__ import annotations

import secrets
from collections.abc import Iterator
from pathlib import Path

import anyio
import httpx
import pytest
from asyncsandbox_remote._e2b._fs import Entry
from asyncsandbox_remote._e2b._processes import Processes
from asyncsandbox_remote._e2b._watch import EventType, Watchers
from connectrpc.code import Code
from connectrpc.errors import ConnectError
from e2b import (
    AsyncSandbox,
    AuthenticationException,
    CommandExitException,
    FileNotFoundException,
    FilesystemEvent,
    Sandbox,
    SandboxException,
    SandboxNotRunningException,
    SandboxQuery,
    TimeoutException,
)
from e2b.envd.process import process_pb
from e2b.sandbox.commands.command_handle import PtySize

from asyncsandbox import Session

from ._support import ALICE, BOB, Server, eventually


@pytest.fixture
def sandbox(e2b_env: str) -> Iterator[Sandbox]:
    made = Sandbox.create("base", timeout=120)
    try:
        yield made
    finally:
        made.kill()


def test_commands_output_exit_codes_and_bytes(sandbox: Sandbox) -> None:
    result = sandbox.commands.run("echo out; echo err >&2; pwd")
    assert result.exit_code == 0
    assert result.stdout == "out\n/home/user\n"
    assert result.stderr == "err\n"
    with pytest.raises(CommandExitException) as failed:
        sandbox.commands.run("exit 7")
    assert failed.value.exit_code == 7
    # Non-UTF-8 output comes through (the SDK decodes it with replacement characters).
    assert sandbox.commands.run(r"printf 'a\xff'").stdout == "a\ufffd"


def test_cwd_envs_and_sandbox_env(e2b_env: str) -> None:
    made = Sandbox.create("base", envs={"FROM_SANDBOX": "s"})
    try:
        made.files.make_dir("sub")
        result = made.commands.run("pwd; echo $FROM_SANDBOX $X", cwd="sub", envs={"X": "x"})
        assert result.stdout == "/home/user/sub\ns x\n"
    finally:
        made.kill()


def test_a_timeout_kills_the_process_tree(sandbox: Sandbox) -> None:
    with pytest.raises(TimeoutException):
        sandbox.commands.run("(sleep 300 &) ; echo started > /tmp/m; sleep 300", timeout=2)
    eventually(lambda: sandbox.commands.list() == [], within=30)
    survivors = sandbox.commands.run("ps -e -o comm= | grep -c '^sleep$' || true")
    assert survivors.stdout.strip() == "0"


def test_background_stdin_kill_and_list(sandbox: Sandbox) -> None:
    cat = sandbox.commands.run("cat", background=True, stdin=True)
    sandbox.commands.send_stdin(cat.pid, "one\n")
    sandbox.commands.send_stdin(cat.pid, b"two\n")
    sandbox.commands.close_stdin(cat.pid)
    assert cat.wait().stdout == "one\ntwo\n"
    sleeper = sandbox.commands.run("sleep 300", background=True)
    assert [p.pid for p in sandbox.commands.list()] == [sleeper.pid]
    assert sandbox.commands.kill(sleeper.pid) is True
    with pytest.raises(CommandExitException):
        sleeper.wait()
    assert sandbox.commands.list() == []
    assert sandbox.commands.kill(sleeper.pid) is False


def test_reconnect_to_a_background_command(sandbox: Sandbox) -> None:
    sandbox.commands.run("mkfifo /tmp/go")  # the command waits on it: no race
    started = sandbox.commands.run("read x < /tmp/go; echo got $x", background=True)
    again = sandbox.commands.connect(started.pid)
    sandbox.commands.run("echo hello > /tmp/go")
    assert again.wait().stdout.endswith("got hello\n")


def test_files(sandbox: Sandbox) -> None:
    sandbox.files.write("dir/a.txt", "alpha")
    sandbox.files.write("/home/user/dir/b.bin", b"\x00\xff")
    assert sandbox.files.read("dir/a.txt") == "alpha"
    assert bytes(sandbox.files.read("dir/b.bin", format="bytes")) == b"\x00\xff"
    assert [e.name for e in sandbox.files.list("dir")] == ["a.txt", "b.bin"]
    info = sandbox.files.get_info("dir/a.txt")
    assert (info.path, info.size, info.permissions) == ("/home/user/dir/a.txt", 5, "-rw-r--r--")
    sandbox.files.rename("dir/a.txt", "dir/c.txt")
    assert sandbox.files.exists("dir/c.txt")
    assert not sandbox.files.exists("dir/a.txt")
    sandbox.files.remove("dir")
    assert not sandbox.files.exists("dir")
    with pytest.raises(FileNotFoundException):
        sandbox.files.read("dir/c.txt")


def test_paths_cannot_leave_the_sandbox(sandbox: Sandbox) -> None:
    sandbox.files.write("../../tmp/inside.txt", "x")  # normalised to /tmp, in the sandbox
    assert sandbox.commands.run("cat /tmp/inside.txt").stdout == "x"
    assert not Path("/tmp/inside.txt").exists() or Path("/tmp/inside.txt").read_text() != "x"


def test_lifecycle_timeout_and_kill(e2b_env: str) -> None:
    made = Sandbox.create("base", timeout=60, metadata={"k": "v"})
    info = made.get_info()
    assert info.metadata == {"k": "v"}
    assert (info.end_at - info.started_at).total_seconds() == pytest.approx(60, abs=2)
    made.set_timeout(600)
    assert (made.get_info().end_at - info.started_at).total_seconds() == pytest.approx(600, abs=5)
    listed = Sandbox.list().next_items()
    assert made.sandbox_id in [s.sandbox_id for s in listed]
    assert made.kill() is True
    assert made.is_running() is False
    assert Sandbox.kill(made.sandbox_id) is False


def test_isolation_between_sandboxes_and_tenants(e2b_env: str, e2b_server: Server) -> None:
    one = Sandbox.create("base")
    two = Sandbox.create("base")
    try:
        one.files.write("secret.txt", "one's")
        assert not two.files.exists("secret.txt")
        # Another tenant neither sees nor reaches alice's sandbox.
        listed = Sandbox.list(api_key=BOB).next_items()
        assert one.sandbox_id not in [s.sandbox_id for s in listed]
        with pytest.raises(SandboxException):
            Sandbox.connect(one.sandbox_id, api_key=BOB)
        assert Sandbox.kill(one.sandbox_id, api_key=BOB) is False
        assert one.is_running()
    finally:
        one.kill()
        two.kill()


def test_auth_is_refused_without_key_or_token(sandbox: Sandbox, e2b_server: Server) -> None:
    with pytest.raises(AuthenticationException):
        Sandbox.create("base", api_key="e2b_" + "0" * 40)
    envd = {
        "E2b-Sandbox-Id": sandbox.sandbox_id,
        "E2b-Sandbox-Port": "49983",
    }
    bare = httpx.get(f"{e2b_server.url}/files", params={"path": "/etc/hostname"}, headers=envd)
    assert bare.status_code == 401
    wrong = httpx.get(
        f"{e2b_server.url}/files",
        params={"path": "/etc/hostname"},
        headers={**envd, "X-Access-Token": "not-the-token"},
    )
    assert wrong.status_code == 401


def test_unknown_sandbox_answers_502_was_not_found(e2b_server: Server) -> None:
    answer = httpx.post(
        f"{e2b_server.url}/process.Process/List",
        json={},
        headers={"E2b-Sandbox-Id": "nosuchsandbox", "E2b-Sandbox-Port": "49983"},
    )
    assert answer.status_code == 502
    assert "was not found" in answer.json()["message"]


def test_hostile_connect_envelopes_are_refused(sandbox: Sandbox, e2b_server: Server) -> None:
    headers = {
        "E2b-Sandbox-Id": sandbox.sandbox_id,
        "E2b-Sandbox-Port": "49983",
        "X-Access-Token": sandbox._envd_access_token or "",
        "Content-Type": "application/connect+json",
    }
    url = f"{e2b_server.url}/process.Process/Start"
    # A frame announcing 2 GiB, a truncated frame, and garbage JSON in a whole frame.
    for body in (b"\x00\x7f\xff\xff\xff{}", b"\x00\x00\x00\x00\x10{", b"\x00\x00\x00\x00\x02}{"):
        answer = httpx.post(url, content=body, headers=headers, timeout=30)
        assert answer.status_code in (200, 400, 413)
        assert b'"error"' in answer.content or answer.status_code != 200
    assert sandbox.commands.run("echo still fine").stdout == "still fine\n"


def test_unsupported_features_are_clear_errors(sandbox: Sandbox, e2b_server: Server) -> None:
    with pytest.raises(SandboxException, match="memory-preserving pause"):
        sandbox.pause()
    for field, value in (
        ("allowInternetAccess", True),
        ("autoPause", True),
        ("volumeMounts", [{"name": "v", "path": "/v"}]),
    ):
        answer = httpx.post(
            f"{e2b_server.url}/v2/sandboxes",
            json={"templateID": "base", field: value},
            headers={"X-API-KEY": ALICE},
        )
        assert answer.status_code == 400
        assert "not supported by asyncsandbox serve" in answer.json()["message"]


def test_filesystem_only_pause_keeps_id_token_and_files(e2b_env: str) -> None:
    made = Sandbox.create("base")
    try:
        made.files.write("kept.txt", "kept")
        token = made._envd_access_token
        made.pause(keep_memory=False)
        assert made.get_info().state.value == "paused"
        resumed = Sandbox.connect(made.sandbox_id)
        assert resumed.sandbox_id == made.sandbox_id
        assert resumed._envd_access_token == token
        assert resumed.files.read("kept.txt") == "kept"
    finally:
        Sandbox.kill(made.sandbox_id)


def test_fork(sandbox: Sandbox) -> None:
    sandbox.files.write("state.txt", "before")
    (child,) = sandbox.fork()
    assert isinstance(child, Sandbox)
    try:
        assert child.sandbox_id != sandbox.sandbox_id
        assert child.files.read("state.txt") == "before"
        child.files.write("state.txt", "child")
        assert sandbox.files.read("state.txt") == "before"
    finally:
        child.kill()


@pytest.mark.parametrize("anyio_backend", ["asyncio"])  # the SDK's async client: asyncio
async def test_sixteen_async_sandboxes_at_once(e2b_env: str) -> None:
    import anyio

    async def one(i: int) -> None:
        made = await AsyncSandbox.create("base")
        try:
            result = await made.commands.run(f"echo {i}")
            assert result.stdout == f"{i}\n"
            await made.files.write("n.txt", str(i))
            assert await made.files.read("n.txt") == str(i)
        finally:
            await made.kill()

    async with anyio.create_task_group() as tg:
        for i in range(16):
            tg.start_soon(one, i)


def test_filesystem_only_snapshots(sandbox: Sandbox) -> None:
    """create_snapshot(mode="filesystem") keeps the files (the sandbox goes on running);
    a sandbox created from it has them; it is listed and deleted as a template; a memory
    snapshot is refused, clearly."""
    sandbox.files.write("snap.txt", "snapped")
    info = sandbox.create_snapshot(mode="filesystem")
    try:
        assert sandbox.commands.run("cat snap.txt").stdout == "snapped"
        made = Sandbox.create(info.snapshot_id)
        try:
            assert made.files.read("snap.txt") == "snapped"
            assert made.commands.run("pwd").stdout == "/home/user\n"
        finally:
            made.kill()
        listed = Sandbox.list_snapshots(sandbox_id=sandbox.sandbox_id).next_items()
        assert [s.snapshot_id for s in listed] == [info.snapshot_id]
        # Another tenant's snapshot is a template it does not have.
        with pytest.raises(SandboxException, match="not found"):
            Sandbox.create(info.snapshot_id, api_key=BOB)
        assert Sandbox.list_snapshots(api_key=BOB).next_items() == []
        assert Sandbox.delete_snapshot(info.snapshot_id, api_key=BOB) is False
    finally:
        assert Sandbox.delete_snapshot(info.snapshot_id) is True
    assert Sandbox.delete_snapshot(info.snapshot_id) is False
    with pytest.raises(SandboxException, match="memory snapshot"):
        sandbox.create_snapshot()


def test_a_command_whose_sandbox_is_killed_ends_not_running(sandbox: Sandbox) -> None:
    """The command's stream ends UNAVAILABLE; the SDK probes the sandbox (502 "was not
    found") and says it is gone."""
    running = sandbox.commands.run("sleep 60", background=True)
    sandbox.kill()
    with pytest.raises(SandboxNotRunningException, match="killed or reached its end of life"):
        running.wait()


def test_files_show_the_sandboxs_user_as_user_and_writes_raise_envds_events(
    sandbox: Sandbox,
) -> None:
    """The sandbox's user is E2B's `user` in file listings; a write through /files raises
    the events envd's upload raises (create, chmod, write), at once."""
    sandbox.files.make_dir("watched")
    info = sandbox.files.get_info("watched")
    assert (info.owner, info.group) == ("user", "user")
    handle = sandbox.files.watch_dir("watched", recursive=True)
    try:
        sandbox.files.write("watched/new/a.txt", "a")
        events = [(e.type.value, e.name) for e in handle.get_new_events()]
        assert events == [
            ("create", "new"),
            ("chmod", "new"),
            ("create", "new/a.txt"),
            ("chmod", "new/a.txt"),
            ("write", "new/a.txt"),
        ]
        sandbox.files.write("watched/new/a.txt", "b")
        assert [(e.type.value, e.name) for e in handle.get_new_events()] == [
            ("chmod", "new/a.txt"),
            ("write", "new/a.txt"),
        ]
    finally:
        handle.stop()


async def test_a_listing_during_an_upload_waits_for_the_uploads_events() -> None:
    """A watcher's listing that would see an upload half done waits for the upload, whose
    own events come first (CI's README suite, under load, saw a listing report the new
    directory and file before them, and the upload's events after)."""
    files: dict[str, Entry] = {}

    class Listed:  # the sandbox as a listing sees it: what ``files`` holds
        async def entries(self, path: str, depth: int) -> list[Entry]:
            return [files[p] for p in sorted(files)]

    def entry(path: str, kind: str, size: int = 0) -> Entry:
        return Entry(kind, kind, size, 0o644, "rw-r--r--", "user", "user", 1.0, "", path)

    async with anyio.create_task_group() as tg:
        watchers = Watchers(Listed(), lambda: tg)  # type: ignore[arg-type]
        watcher = await watchers.create("/w", recursive=True)
        watcher.scope.cancel()  # its listings run when this test says
        async with watchers.writing("/w/new/a.txt", empty=False):
            files["/w/new"] = entry("/w/new", "d")
            files["/w/new/a.txt"] = entry("/w/new/a.txt", "f", 1)
            tg.start_soon(watcher.scan)
            await anyio.wait_all_tasks_blocked()
        await anyio.wait_all_tasks_blocked()
        await watcher.scan()  # and the next listing takes the upload in silently
    assert [(e.type, e.name) for e in watcher.take()] == [
        (EventType.CREATE, "new"),
        (EventType.CHMOD, "new"),
        (EventType.CREATE, "new/a.txt"),
        (EventType.CHMOD, "new/a.txt"),
        (EventType.WRITE, "new/a.txt"),
    ]


def test_listings_are_newest_first(e2b_env: str) -> None:
    tag = {"listing": secrets.token_hex(4)}
    first = Sandbox.create("base", metadata=tag)
    second = Sandbox.create("base", metadata=tag)
    try:
        listed = Sandbox.list(query=SandboxQuery(metadata=tag)).next_items()
        assert [s.sandbox_id for s in listed] == [second.sandbox_id, first.sandbox_id]
    finally:
        first.kill()
        second.kill()


def test_file_metadata_is_kept_as_envd_keeps_it(sandbox: Sandbox) -> None:
    """envd 0.6.2's file metadata: set by an upload, shown by get_info and list, moved
    with a rename, replaced (or cleared) by the next upload; an extended attribute set from
    inside shows too. envd 0.6.3: watch events carry their entry."""
    info = sandbox.files.write("meta.txt", "x", metadata={"author": "me", "stage": "one"})
    assert info.metadata == {"author": "me", "stage": "one"}
    assert sandbox.files.get_info("meta.txt").metadata == {"author": "me", "stage": "one"}
    sandbox.files.rename("meta.txt", "moved.txt")
    assert [e.metadata for e in sandbox.files.list(".") if e.name == "moved.txt"] == [
        {"author": "me", "stage": "one"}
    ]
    assert sandbox.files.write("moved.txt", "y").metadata is None
    assert sandbox.files.get_info("moved.txt").metadata is None
    sandbox.commands.run("python3 -c \"import os; os.setxattr('moved.txt', 'user.e2b.k', b'v')\"")
    assert sandbox.files.get_info("moved.txt").metadata == {"k": "v"}
    sandbox.files.make_dir("seen")
    handle = sandbox.files.watch_dir("seen", include_entry=True)
    try:
        sandbox.files.write("seen/f.txt", "z")
        # An upload may be seen as more than one write (envd's too: truncate, then data),
        # and events arrive when the watcher has them: gather until the last write shows.
        writes: list[FilesystemEvent] = []

        def written() -> bool:
            writes.extend(e for e in handle.get_new_events() if e.type.value == "write")
            return any(e.entry is not None and e.entry.size == 1 for e in writes)

        eventually(written, within=10, what="a write event carrying the written entry")
        assert [e.entry.path if e.entry else None for e in writes] == (
            ["/home/user/seen/f.txt"] * len(writes)
        )
    finally:
        handle.stop()


@pytest.mark.parametrize("anyio_backend", ["asyncio"])  # the server's loop
async def test_a_commands_stdin_is_held_before_its_first_input(
    process_root: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The FIFO a command with stdin reads is held open for writing before the command
    starts, so the writer of its first input is never its only one (whose close would give
    it end of file: on the landing machine's CI a PTY session read end of file after its
    first input, lost the rest and ran to its timeout). Here the holder is made to come
    after the first input, or after a second when it is awaited."""
    written = anyio.Event()
    hold = Processes._hold

    async def late(self: Processes, *args: object, **kwargs: object) -> None:
        with anyio.move_on_after(1):
            await written.wait()
        await hold(self, *args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(Processes, "_hold", late)
    async with (
        Session("process", backend_options={"root": str(process_root)}) as session,
        session.sandbox() as sandbox,
        anyio.create_task_group() as tg,
    ):
        processes = Processes(sandbox, lambda: tg)
        config = process_pb.ProcessConfig(cmd="head", args=["-n", "2"])
        proc, events = await processes.start(config, None, stdin=True)
        await processes.send_input(proc, b"first\n")
        written.set()
        await processes.send_input(proc, b"second\n")
        output, ends = b"", []
        async with events:
            async for event in events:
                value = None if event.event is None else event.event.value
                if isinstance(value, process_pb.ProcessEvent.DataEvent) and value.output:
                    output += value.output.value
                elif isinstance(value, process_pb.ProcessEvent.EndEvent):
                    ends.append(value.exit_code)
    assert output == b"first\nsecond\n"
    assert ends == [0]


@pytest.mark.parametrize("anyio_backend", ["asyncio"])  # the server's loop
async def test_a_command_whose_stdin_cannot_be_held_is_not_started(
    process_root: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """If the FIFO of a command's stdin cannot be held open, the start fails with a
    reason (UNAVAILABLE) and the command never runs (its input would end early), leaving
    no process listed. Here the FIFO is replaced by a directory before the holder opens
    it, as a command of the sandbox could."""
    hold = Processes._hold
    async with (
        Session("process", backend_options={"root": str(process_root)}) as session,
        session.sandbox() as sandbox,
        anyio.create_task_group() as tg,
    ):

        async def spoiled(self: Processes, fifo: str, *args: object, **kwargs: object) -> None:
            await sandbox.exec(["sh", "-c", 'rm "$0" && mkdir "$0"', fifo])
            await hold(self, fifo, *args, **kwargs)  # type: ignore[arg-type]

        monkeypatch.setattr(Processes, "_hold", spoiled)
        processes = Processes(sandbox, lambda: tg)
        config = process_pb.ProcessConfig(cmd="touch", args=["/tmp/it-ran"])
        with pytest.raises(ConnectError) as refused:
            await processes.start(config, None, stdin=True)
        assert refused.value.code == Code.UNAVAILABLE
        assert "could not hold the command's stdin" in str(refused.value)
        assert "Is a directory" in str(refused.value)  # the sandbox's own reason
        assert processes.list() == []
        ran = await sandbox.exec(["test", "-e", "/tmp/it-ran"])
        assert ran.returncode == 1, "the command ran"


def test_pty_sessions(sandbox: Sandbox) -> None:
    """A PTY session: a login shell on a terminal of the asked size, input, a resize (the
    shell sees it), reconnecting to it, killing it."""
    output: list[bytes] = []
    terminal = sandbox.pty.create(PtySize(cols=80, rows=24), envs={"ABC": "123"})
    sandbox.pty.send_stdin(terminal.pid, b"tty; echo $ABC; tput cols\n")
    sandbox.pty.resize(terminal.pid, PtySize(cols=100, rows=30))
    terminal.disconnect()
    again = sandbox.pty.connect(terminal.pid)
    sandbox.pty.send_stdin(terminal.pid, b"tput cols; exit 4\n")
    with pytest.raises(CommandExitException) as ended:
        again.wait(on_pty=output.append)
    assert ended.value.exit_code == 4
    text = b"".join(output).decode(errors="replace")
    assert "100" in text
    other = sandbox.pty.create(PtySize(cols=80, rows=24))
    assert sandbox.pty.kill(other.pid) is True
    with pytest.raises(CommandExitException):
        other.wait()


def test_a_pty_session_ends_with_its_shell_however_busy_its_terminal(sandbox: Sandbox) -> None:
    """A PTY session ends when its shell exits, with the shell's exit code, even while
    something the shell left running keeps writing to the terminal (the relay used to
    look for the shell's end only once the terminal had been quiet for 0.2 s: here,
    never, so the session ran to its timeout)."""
    output: list[bytes] = []
    terminal = sandbox.pty.create(PtySize(cols=80, rows=24), timeout=30)
    sandbox.pty.send_stdin(
        terminal.pid, b"(while :; do echo tick; sleep 0.05; done) & echo bye; exit 3\n"
    )
    with pytest.raises(CommandExitException) as ended:
        terminal.wait(on_pty=output.append)
    assert ended.value.exit_code == 3  # not -1: killed at its 30 s timeout
    assert b"bye" in b"".join(output)
