"""Archives and the code interpreter through a REAL server on loopback: an archive transfer
holds a slot of the server's Session as a command does, and marks its sandbox dead when it
finds it gone; code runs as a stream of NDJSON frames in contexts, and closing the stream
interrupts it. (The interpreter's semantics, remote included: tests/test_interpreter_*.py.)
"""

from __future__ import annotations

import io
import json
import re
import shutil
import tarfile
from collections.abc import AsyncIterator
from typing import Any

import anyio
import httpx
import pytest

from . import _remote_support as remote
from ._remote_support import create_sandbox
from ._support import ALICE, BOB, Server, eventually_async

# The remote family's fixtures (tests/_remote_support.py), this module's by name.
anyio_backend = remote.anyio_backend
server_dir = remote.server_dir
process_server = remote.process_server


# -- archives -------------------------------------------------------------------------------


def _tar(name: str, data: bytes) -> bytes:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as tar:
        info = tarfile.TarInfo(name)
        info.size = len(data)
        tar.addfile(info, io.BytesIO(data))
    return buffer.getvalue()


async def test_archive_transfers_hold_a_slot_of_the_server_session(
    process_server: Server,
) -> None:
    """The server moves archives through the public Sandbox API, under its Session's
    limits: a download or an upload in progress holds an ``execs`` slot, as a command
    does. They went to the backend's handle directly, outside every limit."""
    async with httpx.AsyncClient(
        base_url=process_server.url, headers={"authorization": f"Bearer {ALICE}"}, timeout=60
    ) as client:

        async def execs_held() -> int:
            text = (await client.get("/metrics")).text
            found = re.search(r'session_slots_active\{limiter="execs"\} (\d+)', text)
            assert found is not None, text
            return int(found.group(1))

        sandbox_id = (await client.post("/v1/sandboxes", json={})).json()["id"]
        base = f"/v1/sandboxes/{sandbox_id}"
        made = await client.post(
            f"{base}/exec", json={"argv": ["sh", "-c", "head -c 32000000 /dev/urandom > big"]}
        )
        assert made.json()["returncode"] == 0
        assert await execs_held() == 0
        # A download past the server's look-ahead (1 MiB), its reader paused, then resumed.
        async with client.stream("GET", f"{base}/archive", params={"path": "big"}) as download:
            assert download.status_code == 200
            received = 0
            async for chunk in download.aiter_raw():
                if not received:
                    assert await execs_held() == 1
                received += len(chunk)
            assert received > 32_000_000
        # An upload whose client pauses half way.
        archive, resume = _tar("uploaded.txt", b"up\n" * 1000), anyio.Event()

        async def body() -> AsyncIterator[bytes]:
            yield archive[:1024]
            await resume.wait()
            yield archive[1024:]

        uploaded: list[int] = []

        async def upload() -> None:
            answer = await client.put(f"{base}/archive", params={"path": "."}, content=body())
            uploaded.append(answer.status_code)

        async def held(count: int) -> None:
            """Wait until ``count`` slots are held (the server's own pace: poll it)."""

            async def holds() -> bool:
                return await execs_held() == count

            await eventually_async(holds, within=30, what=f"{count} slots held")

        async with anyio.create_task_group() as tg:
            tg.start_soon(upload)
            await held(1)
            resume.set()
        assert uploaded == [204]
        read = await client.get(f"{base}/files", params={"path": "uploaded.txt"})
        assert read.content == b"up\n" * 1000
        await held(0)
        await client.delete(base)


@pytest.mark.parametrize("first", ["archive", "exec"])
def test_a_transfer_that_finds_its_sandbox_dead_marks_it_dead(
    process_server: Server, first: str
) -> None:
    """The sandbox's directory is removed from outside. Whatever finds it first, an
    archive transfer or a command, the served Sandbox remembers that it died: the server
    then describes it as dead, and every later call answers 410. Through the backend's
    handle, a transfer left the sandbox unmarked (and its record was dropped: 404)."""
    assert process_server.root is not None
    with process_server.client(ALICE) as alice:
        sandbox_id = create_sandbox(alice)
        base = f"/v1/sandboxes/{sandbox_id}"
        assert alice.put(f"{base}/files", params={"path": "a"}, content=b"a").status_code == 204
        shutil.rmtree(process_server.root / sandbox_id)
        if first == "archive":
            found = alice.get(f"{base}/archive", params={"path": "a"})
        else:
            found = alice.post(f"{base}/exec", json={"argv": ["true"]})
        assert found.status_code == 410, found.text
        assert found.json()["error"]["code"] == "sandbox_died"
        described = alice.get(base)
        assert described.status_code == 200, described.text
        assert described.json()["status"] == "dead"
        later = alice.get(f"{base}/archive", params={"path": "a"})
        assert later.status_code == 410, later.text
        assert alice.delete(base).status_code == 204


# -- the code interpreter (its semantics: tests/test_interpreter_*.py, remote included) ---


def _code_frames(response: httpx.Response) -> list[dict[str, Any]]:
    return [json.loads(line) for line in response.iter_lines() if line]


def test_run_code_streams_ndjson_frames(process_server: Server) -> None:
    with process_server.client(ALICE) as alice:
        sandbox_id = create_sandbox(alice)
        base = f"/v1/sandboxes/{sandbox_id}/code"
        body = {"code": "x = 20\nprint('hi')\ndisplay(1)\nx + 22", "env": {"A": "b"}}
        with alice.stream("POST", f"{base}/run", json=body) as response:
            assert response.status_code == 200
            assert response.headers["content-type"] == "application/x-ndjson"
            frames = _code_frames(response)
        assert [f["type"] for f in frames] == ["OutputMessage", "Result", "Result", "end"]
        assert frames[0]["line"] == "hi\n"
        assert frames[0]["error"] is False
        execution = frames[-1]["execution"]
        assert execution["results"][-1]["text"] == "42"
        assert execution["results"][-1]["is_main_result"] is True
        assert execution["logs"]["stdout"] == ["hi\n"]
        assert execution["context_id"] == "default"
        # The state is the context's, from one request to the next.
        with alice.stream("POST", f"{base}/run", json={"code": "x"}) as response:
            assert _code_frames(response)[-1]["execution"]["results"][0]["text"] == "20"
        # A timeout is data, as the client raises it.
        slow = {"code": "import time; time.sleep(60)", "timeout": 0.5}
        with alice.stream("POST", f"{base}/run", json=slow) as response:
            end = _code_frames(response)[-1]
        assert end["execution"]["timed_out"] is True
        assert end["execution"]["error"]["name"] == "KeyboardInterrupt"
        # Contexts.
        created = alice.post(f"{base}/contexts", json={"cwd": "/tmp"})
        assert created.status_code == 201, created.text
        context = created.json()
        assert context["cwd"] == "/tmp"
        assert context["language"] == "python"
        listed = alice.get(f"{base}/contexts").json()["items"]
        assert {c["id"] for c in listed} == {"default", context["id"]}
        restarted = alice.post(f"{base}/contexts/{context['id']}/restart")
        assert restarted.status_code == 204
        assert alice.delete(f"{base}/contexts/{context['id']}").status_code == 204
        unknown = alice.post(f"{base}/run", json={"code": "1", "context": context["id"]})
        assert unknown.status_code == 400
        assert unknown.json()["error"]["code"] == "invalid_argument"
        assert alice.delete(f"{base}/contexts/{context['id']}").status_code == 400
        bad = alice.post(f"{base}/contexts", json={"cwd": "/no/such/directory"})
        assert bad.status_code == 400, bad.text
        # Another tenant's sandbox does not exist for it.
        with process_server.client(BOB) as bob:
            assert bob.post(f"{base}/run", json={"code": "x"}).status_code == 404
            assert bob.get(f"{base}/contexts").status_code == 404
        alice.delete(f"/v1/sandboxes/{sandbox_id}")


def test_closing_the_run_code_stream_interrupts_the_code(process_server: Server) -> None:
    code = "kept = 'yes'\nimport time\nprint('started', flush=True)\ntime.sleep(600)"
    with process_server.client(ALICE) as alice:
        sandbox_id = create_sandbox(alice)
        base = f"/v1/sandboxes/{sandbox_id}/code"
        with alice.stream("POST", f"{base}/run", json={"code": code}) as response:
            lines = response.iter_lines()
            assert json.loads(next(lines))["line"] == "started\n"
        # The connection is closed: the server interrupts the code (KeyboardInterrupt, as
        # a notebook's interrupt), and the context keeps its state. The next call waits for
        # the interrupted one to end (one call at a time in a context).
        with alice.stream("POST", f"{base}/run", json={"code": "kept"}) as response:
            execution = _code_frames(response)[-1]["execution"]
        assert execution["results"][0]["text"] == "'yes'"
        assert execution["restarted"] is False
        alice.delete(f"/v1/sandboxes/{sandbox_id}")
