"""The Ray backend on a real local Ray cluster the tests start themselves: a head and two
worker nodes on this machine (``ray start``), each with a custom resource of its own, all
on a loopback address (127.0.0.2: Ray turns 127.0.0.1 into the machine's own address).

Without Ray installed the tests skip, unless ``ASYNCSANDBOX_REQUIRE_RAY=1`` (then they
fail). Every process of the cluster is in a process group of its own and is killed when
this module's tests are done, also when one fails.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import anyio
import pytest

from asyncsandbox import SandboxDied, Session
from asyncsandbox.testing import CHECKS, Check

from ._support import eventually, eventually_async, processes_with, unique_marker

# A cluster of three nodes started for the module, a fourth started and killed, 1,000
# rollouts: slow (`uv run pytest -m slow`; CI runs them once).
pytestmark = pytest.mark.slow

IP = "127.0.0.2"
NODE_ARGS = ["--num-cpus=1", "--object-store-memory=200000000", "--disable-usage-stats"]
START_DEADLINE = 60.0


@pytest.fixture
def anyio_backend() -> str:
    # The cluster is per session; asyncio here (the trio path is exercised by a test below).
    return "asyncio"


def _ray_missing() -> str | None:
    try:
        import ray  # noqa: F401
    except ImportError:
        return "ray is not installed (pip install 'asyncsandbox[ray]')"
    return None


@dataclass
class Cluster:
    address: str
    temp_dir: Path
    groups: dict[str, subprocess.Popen[bytes]] = field(default_factory=dict)

    def start_node(self, name: str, resources: str, *, head: bool = False) -> None:
        """Start node ``name`` and wait until it runs. Retried: two raylets starting on one
        machine can pick the same free port, and the loser exits ("Address already in
        use")."""
        for attempt in range(3):
            if self._try_start(name, resources, head=head):
                return
            log = self.temp_dir.parent / f"{self.temp_dir.name}-{name}.log"
            if attempt == 2:
                raise RuntimeError(f"ray node {name} did not start: {log.read_text()[-2000:]}")

    def _try_start(self, name: str, resources: str, *, head: bool) -> bool:
        ray = str(Path(sys.executable).with_name("ray"))
        args = [ray, "start", "--block", f"--node-ip-address={IP}", *NODE_ARGS]
        args.append(f"--resources={resources}")
        if head:
            port = self.address.rsplit(":", 1)[1]
            args += [
                "--head",
                f"--port={port}",
                "--include-dashboard=false",
                f"--temp-dir={self.temp_dir}",
            ]
        else:
            args.append(f"--address={self.address}")
        path = self.temp_dir.parent / f"{self.temp_dir.name}-{name}.log"
        env = {**os.environ, "RAY_USAGE_STATS_ENABLED": "0"}
        with path.open("wb") as log:
            process = subprocess.Popen(  # own group: killed whole
                args, stdout=log, stderr=subprocess.STDOUT, start_new_session=True, env=env
            )
        self.groups[name] = process

        def started() -> bool:
            return b"Ray runtime started" in path.read_bytes()

        with contextlib.suppress(AssertionError):  # not started in time: said below
            eventually(lambda: started() or process.poll() is not None, within=START_DEADLINE)
        if not started():
            self.kill_node(name)
            return False
        return True

    def kill_node(self, name: str, sig: int = signal.SIGKILL) -> None:
        """Kill node ``name``: its ``ray start`` group, and every process below it (Ray's
        workers, such as the agent actor, run in sessions of their own)."""
        process = self.groups.pop(name)
        below = _descendants(process.pid)
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, sig)
        if sig != signal.SIGKILL:
            try:
                process.wait(10)
            except subprocess.TimeoutExpired:
                os.killpg(process.pid, signal.SIGKILL)
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGKILL)
        for pid in below:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        process.wait(10)

    def stop(self) -> None:
        for name in [n for n in self.groups if n != "head"] + ["head"]:
            if name in self.groups:
                self.kill_node(name, signal.SIGTERM)

    def options(self, **more: Any) -> dict[str, Any]:
        return {"address": self.address, "init_options": {"_node_ip_address": IP}, **more}


def _descendants(root: int) -> list[int]:
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                stat = (entry / "stat").read_bytes()
            except OSError:
                continue
            ppid = int(stat[stat.rindex(b")") + 2 :].split()[1])
            children.setdefault(ppid, []).append(int(entry.name))
    out, todo = [], [root]
    while todo:
        for child in children.get(todo.pop(), []):
            out.append(child)
            todo.append(child)
    return out


async def _wipe_node(node_id: str) -> int:
    """What losing a node's machine would take with it: the sandboxes left in the node's
    root (with their cgroups), removed through the process backend. Returns how many."""
    import shutil

    from asyncsandbox_ray._node import _node_root

    from asyncsandbox import create_backend

    root = _node_root(node_id)
    if not root.exists():
        return 0
    async with create_backend("process", {"root": str(root)}) as backend:
        infos = await backend.list(labels={})
        for info in infos:
            await (await backend.attach(info.id)).remove()
    shutil.rmtree(root, ignore_errors=True)
    return len(infos)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind((IP, 0))
        return int(s.getsockname()[1])


@pytest.fixture(scope="module")  # stopped when this file is done, not at the run's end
def ray_cluster() -> Iterator[Cluster]:
    missing = _ray_missing()
    if missing:
        if os.environ.get("ASYNCSANDBOX_REQUIRE_RAY") == "1":
            pytest.fail(f"Ray is required (ASYNCSANDBOX_REQUIRE_RAY=1): {missing}")
        pytest.skip(missing)
    import ray

    temp = Path("/tmp", f"asb-ray-{uuid.uuid4().hex[:8]}")
    temp.mkdir()
    cluster = Cluster(f"{IP}:{_free_port()}", temp)
    atexit.register(cluster.stop)  # also if pytest itself is interrupted
    left: list[int] = []
    try:
        cluster.start_node("head", '{"asb_head": 1}', head=True)
        cluster.start_node("w1", '{"asb_w1": 1}')
        cluster.start_node("w2", '{"asb_w2": 1}')
        ray.init(address=cluster.address, _node_ip_address=IP, log_to_driver=False)
        yield cluster
    finally:
        nodes: list[str] = []
        if ray.is_initialized():
            nodes = [n["NodeID"] for n in ray.nodes()]  # type: ignore[no-untyped-call]
            ray.shutdown()
        cluster.stop()
        left = [anyio.run(_wipe_node, node) for node in nodes]  # directories go too
        shutil.rmtree(temp, ignore_errors=True)
        for log in temp.parent.glob(f"{temp.name}-*.log"):
            log.unlink()
        atexit.unregister(cluster.stop)
    assert sum(left) == 0, f"sandboxes left on the nodes after the tests: {left}"


def _node_of(resource: str) -> str:

    from asyncsandbox_ray._backend import _alive_nodes

    (node,) = [n["NodeID"] for n in _alive_nodes() if resource in n["Resources"]]
    return str(node)


async def _where(sandbox: Any) -> dict[str, Any]:
    """Facts reported by the actor on the sandbox's node (its Ray runtime context)."""
    from asyncsandbox_ray._backend import _result

    handle: Any = sandbox._handle
    return dict(await _result(handle._actor.where.remote(), 30))


# -- placement --------------------------------------------------------------------------


async def test_placement_by_custom_resource(ray_cluster: Cluster) -> None:
    for resource in ("asb_w1", "asb_w2", "asb_head"):
        options = ray_cluster.options(resources={resource: 1})
        async with Session("ray", backend_options=options) as session, session.sandbox() as sb:
            where = await _where(sb)
            assert where["node_id"] == _node_of(resource)
            result = await sb.exec(["sh", "-c", "echo $$"])
            assert result.ok


async def test_spreads_over_nodes(ray_cluster: Cluster) -> None:
    from asyncsandbox_ray import RayAttributes

    async with Session("ray", backend_options=ray_cluster.options()) as session:
        sandboxes = [await session.sandbox().start() for _ in range(6)]
        nodes = [sb.extra(RayAttributes.node_id) for sb in sandboxes]
        assert len(set(nodes)) == 3, nodes
        for sb in sandboxes:
            assert (await _where(sb))["node_id"] == sb.extra(RayAttributes.node_id)


async def test_trio_driver(ray_cluster: Cluster) -> None:
    async def main() -> bytes:
        options = ray_cluster.options()
        async with Session("ray", backend_options=options) as session, session.sandbox() as sb:
            return (await sb.exec(["echo", "from trio"])).stdout

    assert await anyio.to_thread.run_sync(lambda: anyio.run(main, backend="trio")) == (
        b"from trio\n"
    )


# -- the code interpreter -----------------------------------------------------------------


async def test_run_code_runs_on_the_sandboxs_node(ray_cluster: Cluster) -> None:
    """run_code goes to the node (its agent's interpreter over the local sandbox): state,
    events as they come, a timeout that keeps the state, contexts, and nothing left when
    the sandbox goes."""
    from asyncsandbox import ExecTimeout, OutputMessage, SandboxDefaults

    options = ray_cluster.options(resources={"asb_w1": 1})
    defaults = SandboxDefaults(env={"FROM_SPEC": "yes"})
    async with (
        Session("ray", backend_options=options, defaults=defaults) as session,
        session.sandbox() as sb,
    ):
        await sb.run_code("import os\nx = 40")
        seen: list[str] = []

        async def on_stdout(message: OutputMessage) -> None:
            seen.append(message.line)

        execution = await sb.run_code(
            "print(os.environ['FROM_SPEC'], os.getcwd())\nx + 2", on_stdout=on_stdout
        )
        assert execution.text == "42"
        assert seen == ["yes /workspace\n"]
        with pytest.raises(ExecTimeout) as raised:
            await sb.run_code("import time\ntime.sleep(60)", timeout=1)
        assert raised.value.execution is not None
        assert raised.value.execution.error is not None
        assert raised.value.execution.error.name == "KeyboardInterrupt"
        assert (await sb.run_code("x")).text == "40"
        context = await sb.create_code_context(cwd="/tmp")
        assert (await sb.run_code("import os; os.getcwd()", context=context)).text == "'/tmp'"
        assert {c.id for c in await sb.list_code_contexts()} == {"default", context.id}
        await sb.remove_code_context(context)
        assert [c.id for c in await sb.list_code_contexts()] == ["default"]
        async with sb.run_code_stream("print('a')\n1") as stream:
            events = [event async for event in stream]
        assert [type(e).__name__ for e in events] == ["OutputMessage", "Result"]
        assert (await _where(sb))["node_id"] == _node_of("asb_w1")


# -- conformance --------------------------------------------------------------------------


@pytest.mark.parametrize("check", CHECKS, ids=lambda c: c.name)
async def test_conformance_on_ray(ray_cluster: Cluster, check: Check) -> None:
    if check.name == "launch_failure":
        pytest.skip("no hook yet to break a node's launcher from the driver")
    await check.run(lambda: _backend(ray_cluster))


def _backend(cluster: Cluster) -> Any:
    from asyncsandbox_ray import RayBackend

    return RayBackend(**cluster.options())


# -- faults -------------------------------------------------------------------------------


async def test_node_killed_mid_exec(ray_cluster: Cluster) -> None:
    """A worker node killed during a command: SandboxDied (infrastructure) in bounded time;
    sandboxes on other nodes go on."""
    ray_cluster.start_node("victim", '{"asb_victim": 1}')
    victim = Session("ray", backend_options=ray_cluster.options(resources={"asb_victim": 1}))
    other = Session("ray", backend_options=ray_cluster.options(resources={"asb_w1": 1}))
    async with victim, other:
        doomed = await victim.sandbox().start()
        survivor = await other.sandbox().start()
        outcome: list[BaseException] = []
        marker = unique_marker()

        async def run() -> None:
            try:
                await doomed.exec(["sleep", marker])
            except SandboxDied as exc:
                outcome.append(exc)

        async with anyio.create_task_group() as tg:
            tg.start_soon(run)
            await eventually_async(lambda: processes_with(marker), within=60, what="it runs")
            killed = time.monotonic()
            await anyio.to_thread.run_sync(ray_cluster.kill_node, "victim")
        elapsed = time.monotonic() - killed
        assert outcome
        assert isinstance(outcome[0], SandboxDied)
        assert elapsed < 44, elapsed  # 45 s from the start, which was 1 s before the kill
        assert (await survivor.exec(["echo", "alive"])).stdout == b"alive\n"
        # The node's machine is still here (it is this one; the test killed every process
        # of the node): the sandbox's directory goes, as it would with the machine.
        from asyncsandbox_ray import RayAttributes

        assert await _wipe_node(doomed.extra(RayAttributes.node_id)) == 1


# -- load ---------------------------------------------------------------------------------

ROLLOUTS = int(os.environ.get("ASYNCSANDBOX_RAY_ROLLOUTS", "1000"))


async def test_many_rollouts_leave_nothing(ray_cluster: Cluster) -> None:
    """ROLLOUTS short rollouts (create, two commands, remove), 16 at a time, over the
    cluster; afterwards no sandbox and no command is left on any node."""
    tag = f"rollouts-{uuid.uuid4().hex[:8]}"
    async with Session("ray", backend_options=ray_cluster.options()) as session:
        limiter = anyio.CapacityLimiter(16)

        async def rollout(i: int) -> None:
            async with limiter, session.sandbox(tags=[tag]) as sb:
                await sb.write_file("x", str(i).encode())
                result = await sb.exec(["cat", "x"])
                assert result.stdout == str(i).encode()

        async with anyio.create_task_group() as tg:
            for i in range(ROLLOUTS):
                tg.start_soon(rollout, i)
        assert await session.list(tags=[tag]) == []
    import ray
    from asyncsandbox_ray._backend import NAMESPACE, _alive_nodes, _result

    for node in _alive_nodes():
        actor = ray.get_actor(f"asyncsandbox-{node['NodeID'][:16]}-process", namespace=NAMESPACE)
        where = await _result(actor.where.remote(), 30)
        assert where["runs"] == 0, where


OWNER = """
import sys, anyio
from asyncsandbox import Session

async def main() -> None:
    options = {"address": sys.argv[1], "init_options": {"_node_ip_address": "127.0.0.2"},
               "lease_ttl": 3.0}
    async with Session("ray", backend_options=options) as session:
        sandbox = await session.sandbox(tags=[sys.argv[2]]).start()
        print(sandbox.id, flush=True)
        await anyio.sleep_forever()  # until it is killed

anyio.run(main)
"""


async def test_crashed_owner_is_swept(ray_cluster: Cluster) -> None:
    """An owner killed with SIGKILL stops renewing its lease; the node's actor removes
    its sandbox soon after the lease ends (the Session's own same-host sweep is off here,
    as it would be for an owner on another machine)."""
    tag = f"orphan-{uuid.uuid4().hex[:8]}"
    args = [sys.executable, "-c", OWNER, ray_cluster.address, tag]
    async with await anyio.open_process(args, stderr=subprocess.DEVNULL) as owner:
        assert owner.stdout is not None
        line = await owner.stdout.receive()
        assert line.startswith(b"r-"), line
        owner.kill()
    options = ray_cluster.options()
    async with Session("ray", backend_options=options, sweep=False) as session:
        assert len(await session.list(tags=[tag])) == 1

        async def swept() -> bool:
            return not await session.list(tags=[tag])

        await eventually_async(swept, within=30, what="the orphan swept")
