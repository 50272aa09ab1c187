"""``asyncsandbox mcp`` driven by the MCP SDK's own client (``mcp.Client``), over stdio and
streamable HTTP, against the real server command on the process backend: the tools and
their schemas, one sandbox per session (state kept, sessions isolated), timeouts, bad
calls, authentication, session bounds and expiry, and nothing left once the server is
gone (client gone, SIGTERM)."""

from __future__ import annotations

import base64
import os
import signal
import subprocess
import sys
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from pathlib import Path
from typing import Any

import anyio
import httpx2
import mcp_types as types
import pytest
from asyncsandbox_mcp import INFRASTRUCTURE_ERROR
from mcp import Client, MCPError, StdioServerParameters
from mcp.client.streamable_http import streamable_http_client

from asyncsandbox import SandboxInfo, Session
from asyncsandbox.tools import Toolbox

from ._support import docker_test_image, eventually_async, require_docker

KEY = "mcp-test-key-0123456789abcdef"

pytestmark = pytest.mark.filterwarnings(
    # The SDK's HTTP client (httpx2) leaves a response's byte stream to trio's GC hook when
    # a session's event stream is torn down: theirs, like httpx's in pyproject.toml.
    "ignore:Async generator 'http(x|core)2\\.:ResourceWarning"
)


def server_env(root: Path, **extra: str) -> dict[str, str]:
    return {**os.environ, "ASYNCSANDBOX_PROCESS_ROOT": str(root), **extra}


def stdio(root: Path, *args: str) -> StdioServerParameters:
    """The stdio server as an MCP client starts it: ``asyncsandbox mcp``."""
    return StdioServerParameters(
        command=sys.executable, args=["-m", "asyncsandbox", "mcp", *args], env=server_env(root)
    )


class HttpServer:
    """``asyncsandbox mcp --transport streamable-http`` on a free loopback port."""

    def __init__(self, root: Path, *args: str, env: dict[str, str] | None = None) -> None:
        self.process = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "asyncsandbox",
                "mcp",
                "--transport",
                "streamable-http",
                "--listen",
                "127.0.0.1:0",
                "--print-url",
                *args,
            ],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            env=env or server_env(root),
        )
        assert self.process.stdout is not None
        self.url = self.process.stdout.readline().decode().strip()
        if not self.url.startswith("http://"):
            self.stop()
            pytest.fail(f"the server did not start: {self.process.stderr.read().decode()}")  # type: ignore[union-attr]

    def stop(self, sig: int = signal.SIGTERM) -> int:
        if self.process.poll() is None:
            self.process.send_signal(sig)
        status = self.process.wait(timeout=60)
        for stream in (self.process.stdout, self.process.stderr):
            assert stream is not None
            stream.close()
        return status

    def stderr(self) -> str:
        assert self.process.stderr is not None
        return self.process.stderr.read().decode()


@pytest.fixture(scope="module")
def module_root(module_process_root: Path) -> Path:
    return module_process_root


@pytest.fixture(scope="module")
def http_server(module_root: Path) -> Iterator[HttpServer]:
    """One server for the tests that only need sessions of their own (each test opens
    its own; they share the server's process, as a deployment's clients do)."""
    server = HttpServer(module_root)
    yield server
    assert server.stop() == 0


@asynccontextmanager
async def http(url: str, key: str | None = None, **options: Any) -> AsyncIterator[Client]:
    """An MCP session over streamable HTTP (``Authorization: Bearer KEY`` when given)."""
    headers = {"Authorization": f"Bearer {key}"} if key else None
    async with (
        httpx2.AsyncClient(headers=headers) as http_client,
        Client(streamable_http_client(url, http_client=http_client), **options) as client,
    ):
        yield client


async def sandboxes(root: Path) -> list[SandboxInfo]:
    """The sandboxes under ``root``, whoever made them."""
    async with Session("process", backend_options={"root": str(root)}, sweep=False) as session:
        return await session.list()


def mcp_error(error: BaseException) -> MCPError:
    """The client's MCPError, out of the task groups it may come wrapped in."""
    while isinstance(error, BaseExceptionGroup) and len(error.exceptions) == 1:
        error = error.exceptions[0]
    assert isinstance(error, MCPError), repr(error)
    return error


def text(result: types.CallToolResult) -> str:
    assert len(result.content) == 1
    block = result.content[0]
    assert isinstance(block, types.TextContent)
    return block.text


# The server under test is a process of its own: what these tests prove is the server's,
# whatever loop the client runs on, so they run on asyncio; the tests marked with both
# loops show the SDK's client against the server on trio too.
@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


BOTH_LOOPS = pytest.mark.parametrize("anyio_backend", ["asyncio", "trio"])


@asynccontextmanager
async def stdio_client(root: Path, *args: str) -> AsyncIterator[Client]:
    async with Client(stdio(root, *args)) as client:
        yield client


class Transport:
    """New MCP sessions over one transport, and where their sandboxes live."""

    def __init__(
        self, connect: Callable[[], AbstractAsyncContextManager[Client]], root: Path
    ) -> None:
        self.connect = connect
        self.root = root


@pytest.fixture(params=["stdio", "streamable-http"])
def transport(request: pytest.FixtureRequest, process_root: Path) -> Transport:
    if request.param == "stdio":
        return Transport(lambda: Client(stdio(process_root)), process_root)
    server: HttpServer = request.getfixturevalue("http_server")
    return Transport(lambda: http(server.url), request.getfixturevalue("module_root"))


@pytest.fixture
def connect(transport: Transport) -> Callable[[], AbstractAsyncContextManager[Client]]:
    """A new MCP session over the transport the test is parametrized with."""
    return transport.connect


# -- the tools ------------------------------------------------------------------------------


@BOTH_LOOPS
async def test_the_tools_are_the_toolboxs_with_its_schemas_and_mcp_hints(
    connect: Callable[[], AbstractAsyncContextManager[Client]],
) -> None:
    offered = ["bash", "read_file", "write_file", "str_replace_editor", "python"]
    async with Session("process") as session:
        expected = Toolbox(session.sandbox(), tools=offered).schemas()  # schemas only
    async with connect() as client:
        listed = (await client.list_tools()).tools
    assert [tool.name for tool in listed] == [
        "bash",
        "read_file",
        "write_file",
        "str_replace_editor",
        "run_code",  # the Toolbox's python
    ]
    for tool, schema in zip(listed, expected, strict=True):
        assert tool.input_schema == schema["function"]["parameters"]
        assert tool.description == schema["function"]["description"]
        assert tool.annotations is not None
        assert tool.annotations.open_world_hint is False
    hints = {t.name: t.annotations for t in listed}
    assert hints["read_file"] is not None
    assert hints["read_file"].read_only_hint is True
    for name in ("bash", "write_file", "str_replace_editor", "run_code"):
        hint = hints[name]
        assert hint is not None
        assert hint.read_only_hint is False
        assert hint.destructive_hint is True


@BOTH_LOOPS
async def test_run_code_keeps_its_state_and_returns_errors_with_their_traceback(
    connect: Callable[[], AbstractAsyncContextManager[Client]],
) -> None:
    async with connect() as client:
        first = await client.call_tool("run_code", {"code": "import math\nx = 6 * 7\nprint(x)"})
        assert not first.is_error, text(first)
        assert text(first) == "42\n"
        shown = await client.call_tool("run_code", {"code": "math.sqrt(x * 2)"})
        assert text(shown) == "Out: 9.16515138991168\n"
        failed = await client.call_tool("run_code", {"code": "print('before')\nx / 0"})
        assert failed.is_error
        assert (failed.meta or {}).get(INFRASTRUCTURE_ERROR) is None  # the code's doing
        said = text(failed)
        assert said.startswith("before\n")
        assert "Traceback (most recent call last):" in said
        assert "ZeroDivisionError: division by zero" in said
        assert text(await client.call_tool("run_code", {"code": "x"})) == "Out: 42\n"
        unknown = await client.call_tool("python", {"code": "x"})  # the Toolbox's name
        assert unknown.is_error
        assert "unknown tool 'python'" in text(unknown)


PNG = bytes.fromhex(
    "89504e470d0a1a0a0000000d4948445200000001000000010806000000"
    "1f15c4890000000d49444154789c63f8cfc0f01f0005000201a5a2f0f10000000049454e44ae426082"
)


async def test_run_code_returns_images_as_image_content(
    connect: Callable[[], AbstractAsyncContextManager[Client]],
) -> None:
    """An object's ``_repr_png_`` (no third-party package needed)."""
    shows_png = f"class Dot:\n    def _repr_png_(self):\n        return {PNG!r}\nDot()"
    async with connect() as client:
        result = await client.call_tool("run_code", {"code": shows_png})
        assert not result.is_error, result
        said, image = result.content
        assert isinstance(said, types.TextContent)
        assert "[image 1: image/png, shown as an image]" in said.text
        assert isinstance(image, types.ImageContent)
        assert image.mime_type == "image/png"
        assert base64.b64decode(image.data) == PNG


@pytest.mark.parametrize("backend", ["process", "docker"])
async def test_run_code_returns_a_matplotlib_figure_as_image_content(
    process_root: Path, backend: str
) -> None:
    """Over stdio, on the process backend (skipped where the sandbox's Python has no
    matplotlib) and on Docker (the test image has it)."""
    args: tuple[str, ...] = ()
    if backend == "docker":
        require_docker()
        args = ("--backend", "docker", "--image", docker_test_image())
    async with stdio_client(process_root, *args) as client:
        has = await client.call_tool(
            "run_code",
            {"code": "import importlib.util\nimportlib.util.find_spec('matplotlib') is None"},
        )
        assert not has.is_error, text(has)
        plot = None
        if text(has) != "Out: True\n":
            plot = await client.call_tool(
                "run_code",
                {"code": "import matplotlib.pyplot as plt\nplt.plot([1, 2, 3])\nplt.show()"},
            )
    if plot is None:  # (out of the client's task group, which would wrap the skip)
        pytest.skip("the sandbox's Python has no matplotlib")
    assert not plot.is_error, plot
    said, figure = plot.content
    assert isinstance(said, types.TextContent)
    assert "[image 1: image/png, shown as an image]" in said.text
    assert isinstance(figure, types.ImageContent)
    assert figure.mime_type == "image/png"
    assert base64.b64decode(figure.data).startswith(b"\x89PNG\r\n\x1a\n")


async def test_a_session_keeps_its_files_across_calls(
    connect: Callable[[], AbstractAsyncContextManager[Client]],
) -> None:
    async with connect() as client:
        wrote = await client.call_tool("write_file", {"path": "notes/a.txt", "content": "one\n"})
        assert not wrote.is_error, text(wrote)
        edited = await client.call_tool(
            "str_replace_editor",
            {"command": "str_replace", "path": "notes/a.txt", "old_str": "one", "new_str": "two"},
        )
        assert not edited.is_error, text(edited)
        ran = await client.call_tool("bash", {"command": "cat notes/a.txt; pwd"})
        assert not ran.is_error
        assert text(ran) == "exit=0\ntwo\n/workspace\n"
        read = await client.call_tool("read_file", {"path": "notes/a.txt"})
        assert text(read) == "two\n"


async def test_two_sessions_have_two_sandboxes(
    connect: Callable[[], AbstractAsyncContextManager[Client]],
) -> None:
    async with connect() as first, connect() as second:
        await first.call_tool("bash", {"command": "echo first > mine"})
        await second.call_tool("bash", {"command": "echo second > mine"})
        assert text(await first.call_tool("read_file", {"path": "mine"})) == "first\n"
        assert text(await second.call_tool("read_file", {"path": "mine"})) == "second\n"


@BOTH_LOOPS
async def test_a_timeout_ends_the_call_and_keeps_the_session(
    connect: Callable[[], AbstractAsyncContextManager[Client]],
) -> None:
    async with connect() as client:
        await client.call_tool("bash", {"command": "echo kept > state"})
        slow = await client.call_tool(
            "bash",
            {
                "command": "echo started; exec flock held sh -c 'touch locked; exec sleep 60'",
                "timeout": 0.5,
            },
        )
        assert slow.is_error
        assert text(slow).startswith("timed out after 0.5s (the command was killed)")
        assert "started" in text(slow)
        assert (slow.meta or {}).get(INFRASTRUCTURE_ERROR) is None  # the call's doing
        # The sleep held a lock on `held`: it is free again, so the sleep was killed.
        after = await client.call_tool("bash", {"command": "cat state locked; flock -n held true"})
        assert text(after) == "exit=0\nkept\n"


async def test_a_client_that_gives_up_on_a_call_keeps_its_session(
    connect: Callable[[], AbstractAsyncContextManager[Client]],
) -> None:
    """The client's own deadline: it cancels the request; the command is killed and the
    session goes on."""
    async with connect() as client:
        await client.call_tool("bash", {"command": "echo kept > state"})
        with pytest.raises(MCPError):
            await client.call_tool(
                "bash",
                {"command": "exec flock held sh -c 'touch locked; exec sleep 60'"},
                read_timeout_seconds=2,
            )

        async def killed() -> bool:
            # The sleep holds a lock on `held` until it dies.
            probe = await client.call_tool(
                "bash", {"command": "test -e locked && flock -n held true"}
            )
            return text(probe).startswith("exit=0")

        await eventually_async(killed, within=30)
        assert text(await client.call_tool("read_file", {"path": "state"})) == "kept\n"


BAD_CALLS: list[tuple[str, dict[str, Any], str]] = [
    ("bash", {}, "invalid arguments for bash"),
    ("bash", {"command": 42}, "Expected `str`"),
    ("bash", {"command": "true", "timeout": -1}, "Expected `float` >"),
    ("read_file", {"paht": "x"}, "unknown field `paht`"),
    ("read_file", {"path": "missing"}, "Error: "),
    ("str_replace_editor", {"command": "delete", "path": "x"}, "invalid arguments"),
    ("rm_rf", {"path": "/"}, "unknown tool 'rm_rf'"),
]


async def test_bad_calls_are_error_results_and_the_session_goes_on(
    connect: Callable[[], AbstractAsyncContextManager[Client]],
) -> None:
    """Each bad call, one after another in one session: an error result (the caller's,
    never infrastructure's), and the session answers the next call."""
    async with connect() as client:
        for name, arguments, says in BAD_CALLS:
            result = await client.call_tool(name, arguments)
            assert result.is_error, name
            assert says in text(result), (name, arguments)
            assert (result.meta or {}).get(INFRASTRUCTURE_ERROR) is None
            alive = await client.call_tool("bash", {"command": "echo alive"})
            assert text(alive) == "exit=0\nalive\n", (name, arguments)


async def test_a_failing_command_is_an_error_result(
    connect: Callable[[], AbstractAsyncContextManager[Client]],
) -> None:
    async with connect() as client:
        result = await client.call_tool("bash", {"command": "echo out; echo err >&2; exit 3"})
    assert result.is_error
    assert text(result) == "exit=3\nout\n[stderr]\nerr\n"


async def test_a_dead_sandbox_is_an_infrastructure_error(transport: Transport) -> None:
    """The sandbox removed behind the server's back: the tool says so, flagged as the
    infrastructure's failure (not the call's), and the server stays up."""
    async with transport.connect() as client:
        before = {i.id for i in await sandboxes(transport.root)}
        await client.call_tool("bash", {"command": "true"})
        (mine,) = {i.id for i in await sandboxes(transport.root)} - before
        async with Session("process", backend_options={"root": str(transport.root)}) as other:
            assert await other.delete(ids=[mine]) == [mine]
        result = await client.call_tool("bash", {"command": "echo still there?"})
        assert result.is_error
        assert "infrastructure failure" in text(result)
        assert (result.meta or {}).get(INFRASTRUCTURE_ERROR) is True
        assert (await client.list_tools()).tools  # the server is up


# -- HTTP: auth, eras, bounds, expiry --------------------------------------------------------


async def test_http_refuses_requests_without_a_valid_key(
    process_root: Path, tmp_path: Path
) -> None:
    keys = tmp_path / "keys"
    keys.write_text(f"alice:{KEY}\n")
    server = HttpServer(process_root, "--keys", str(keys))
    initialize = {
        "jsonrpc": "2.0",
        "id": 1,
        "method": "initialize",
        "params": {
            "protocolVersion": "2025-11-25",
            "capabilities": {},
            "clientInfo": {"name": "raw", "version": "0"},
        },
    }
    try:
        for key in (None, "wrong-key-0123456789abcdef"):
            with pytest.raises(ExceptionGroup) as refused:
                async with http(server.url, key) as client:
                    await client.list_tools()
            assert refused.group_contains(MCPError)
            headers = {"Accept": "application/json, text/event-stream"}
            if key:
                headers["Authorization"] = f"Bearer {key}"
            async with httpx2.AsyncClient() as raw:
                answer = await raw.post(server.url, json=initialize, headers=headers)
            assert answer.status_code == 401
            assert answer.headers["www-authenticate"].startswith("Bearer ")
        async with http(server.url, KEY) as client:
            ran = await client.call_tool("bash", {"command": "echo authorized"})
            assert text(ran) == "exit=0\nauthorized\n"
    finally:
        assert server.stop() == 0
    assert await sandboxes(process_root) == []


def test_http_off_loopback_needs_keys(process_root: Path) -> None:
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "asyncsandbox",
            "mcp",
            "--transport",
            "streamable-http",
            "--listen",
            "0.0.0.0:0",
        ],
        capture_output=True,
        timeout=60,
        env={k: v for k, v in server_env(process_root).items() if k != "ASYNCSANDBOX_API_KEYS"},
        check=False,
    )
    assert done.returncode == 2
    assert b"not loopback) needs API keys" in done.stderr


async def test_http_serves_the_handshake_era_and_refuses_stateless_requests(
    http_server: HttpServer,
) -> None:
    """A sandbox lives as long as a session, and 2026-07-28 has no sessions: a client
    pinned to it is told which versions are served; ``mode="auto"`` falls back."""
    with pytest.raises((MCPError, ExceptionGroup)) as refused:
        async with http(http_server.url, mode="2026-07-28") as client:
            await client.call_tool("bash", {"command": "true"})
    assert mcp_error(refused.value).error.code == types.UNSUPPORTED_PROTOCOL_VERSION
    async with http(http_server.url) as client:
        assert client.session.initialize_result is not None  # the handshake
        assert client.session.initialize_result.protocol_version == "2025-11-25"


async def test_http_bounds_sessions(process_root: Path) -> None:
    server = HttpServer(process_root, "--max-sessions", "1")
    try:
        async with http(server.url) as first:
            await first.call_tool("bash", {"command": "true"})
            with pytest.raises(Exception) as refused:  # noqa: PT011 - checked below
                async with http(server.url) as second:
                    await second.list_tools()
            assert "503" in repr(refused.value) or "Too many" in repr(refused.value)
        # The first session ended (DELETE): its place and its sandbox are free.
        await eventually_async(lambda: _none_left(process_root), within=30)
        async with http(server.url) as third:
            assert text(await third.call_tool("bash", {"command": "echo in"})) == "exit=0\nin\n"
    finally:
        assert server.stop() == 0


async def _none_left(root: Path) -> bool:
    return await sandboxes(root) == []


async def test_http_an_idle_session_ends_with_its_sandbox(process_root: Path) -> None:
    server = HttpServer(process_root, "--idle-timeout", "2")
    try:
        async with http(server.url) as client:
            wrote = await client.call_tool("bash", {"command": "echo x > f"})
            assert not wrote.is_error  # so the session had a sandbox
            await eventually_async(lambda: _none_left(process_root), within=30)
            with pytest.raises(MCPError):
                await client.call_tool("read_file", {"path": "f"})
    finally:
        assert server.stop() == 0


async def test_http_a_session_ended_by_its_client_loses_its_sandbox(
    http_server: HttpServer, module_root: Path
) -> None:
    before = {i.id for i in await sandboxes(module_root)}
    async with http(http_server.url) as client:
        await client.call_tool("bash", {"command": "true"})
        mine = {i.id for i in await sandboxes(module_root)} - before
        assert len(mine) == 1
    await eventually_async(lambda: _gone(module_root, mine), within=30)


async def _gone(root: Path, ids: set[str]) -> bool:
    return not ids & {i.id for i in await sandboxes(root)}


def test_a_stdio_server_does_not_import_the_http_transport() -> None:
    """``asyncsandbox mcp`` over stdio loads the package and its command line, not the
    streamable-HTTP transport (Starlette, MCP's auth) nor the remote server's tenants (an
    eighth of its start). Asked for, they are there."""
    probe = (
        "import sys, asyncsandbox_mcp\n"
        "print(sorted(m for m in ('asyncsandbox_mcp._http', 'asyncsandbox_remote.server')"
        " if m in sys.modules))\n"
        "print(asyncsandbox_mcp.create_app.__module__, asyncsandbox_mcp.serve_http.__name__)\n"
    )
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True)
    assert done.stdout.splitlines() == ["[]", "asyncsandbox_mcp serve_http"]


# -- nothing left behind ---------------------------------------------------------------------


async def test_stdio_client_gone_leaves_nothing(process_root: Path) -> None:
    async with stdio_client(process_root) as client:
        await client.call_tool("bash", {"command": "sleep 1000 & echo started"})
        assert len(await sandboxes(process_root)) == 1
    # The client closed our stdin and waited for us to exit.
    assert await sandboxes(process_root) == []


async def test_stdio_sigterm_leaves_nothing(process_root: Path) -> None:
    async with stdio_client(process_root) as client:
        await client.call_tool("bash", {"command": "sleep 1000 & echo started"})
        (info,) = await sandboxes(process_root)
        pid = int(info.labels["asyncsandbox.owner"].split("/")[2])  # host/boot/pid/start
        os.kill(pid, signal.SIGTERM)  # while the client still holds our stdin open
        await eventually_async(lambda: _none_left(process_root), within=30)
        with pytest.raises(Exception):  # noqa: PT011, B017 - the server is gone
            await client.call_tool("bash", {"command": "true"})


async def test_http_sigterm_leaves_nothing(process_root: Path) -> None:
    """SIGTERM with two sessions, one of them in the middle of a command: the call ends,
    the server exits 0, and no sandbox is left."""
    server = HttpServer(process_root)
    async with http(server.url) as first, http(server.url) as second:
        await first.call_tool("bash", {"command": "sleep 1000 & echo started"})
        async with anyio.create_task_group() as tg:

            async def call_in_flight() -> None:
                with pytest.raises(Exception):  # noqa: PT011, B017 - the server went away
                    await second.call_tool("bash", {"command": "echo $$ > pid; exec sleep 1000"})

            tg.start_soon(call_in_flight)

            async def running() -> bool:
                probe = await second.call_tool("bash", {"command": "test -s pid"})
                return not probe.is_error

            await eventually_async(running, within=30)
            assert len(await sandboxes(process_root)) == 2
            assert await anyio.to_thread.run_sync(server.stop) == 0
    assert await sandboxes(process_root) == []
