"""The Ray backend on a real local Ray cluster the tests start themselves
(:class:`asyncsandbox_ray.testing.LocalCluster`): a head and two worker nodes on this
machine (``ray start``), each with a custom resource of its own, all on a loopback address
(127.0.0.2: Ray turns 127.0.0.1 into the machine's own address).

Without Ray installed the tests skip, unless ``ASYNCSANDBOX_REQUIRE_RAY=1`` (then they
fail). Every process of the cluster is in a process group of its own and is killed when
this module's tests are done, also when one fails.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import select
import shutil
import signal
import subprocess
import sys
import time
import uuid
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import anyio
import pytest

from asyncsandbox import ExecResult, Sandbox, SandboxDied, Session
from asyncsandbox.testing import CHECKS, Check

if TYPE_CHECKING:
    from asyncsandbox_ray.testing import LocalCluster

from ._support import eventually, eventually_async, processes_with, unique_marker

# A cluster of three nodes started for the module, nodes started and killed, 1,000
# rollouts: slow (`uv run pytest -m slow`; CI runs them once).
pytestmark = pytest.mark.slow

# A driver started by `uv run` (as the README's test command is) makes Ray start each of
# its workers with `uv run` too, in a copy of the working directory, where uv first makes
# an environment (Ray's uv integration, read by `ray` when it is imported): three of these
# tests took 75.6 s so, 24.6 s without. The nodes here run this environment already.
os.environ.setdefault("RAY_ENABLE_UV_RUN_RUNTIME_ENV", "0")


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


async def _wipe_node(node_id: str) -> int:
    """What losing a node's machine would take with it: the sandboxes left in the node's
    root (with their cgroups), removed through the process backend. Returns how many."""

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


@pytest.fixture(scope="module")  # stopped when this file is done, not at the run's end
def ray_cluster() -> Iterator[LocalCluster]:
    missing = _ray_missing()
    if missing:
        if os.environ.get("ASYNCSANDBOX_REQUIRE_RAY") == "1":
            pytest.fail(f"Ray is required (ASYNCSANDBOX_REQUIRE_RAY=1): {missing}")
        pytest.skip(missing)
    import ray
    from asyncsandbox_ray.testing import LocalCluster

    cluster = LocalCluster()
    atexit.register(cluster.stop)  # also if pytest itself is interrupted
    left: list[int] = []
    try:
        # asb_slots: each node's capacity for sandboxes placed by it (1 : 2 : 3).
        cluster.start_node("head", {"asb_head": 1, "asb_slots": 1}, head=True)
        cluster.start_node("w1", {"asb_w1": 1, "asb_slots": 2})
        cluster.start_node("w2", {"asb_w2": 1, "asb_slots": 3})
        ray.init(address=cluster.address, _node_ip_address=cluster.ip, log_to_driver=False)
        yield cluster
    finally:
        nodes: list[str] = []
        if ray.is_initialized():
            nodes = [n["NodeID"] for n in ray.nodes()]  # type: ignore[no-untyped-call]
            ray.shutdown()
        cluster.stop()
        left = [anyio.run(_wipe_node, node) for node in nodes]  # directories go too
        atexit.unregister(cluster.stop)
    assert sum(left) == 0, f"sandboxes left on the nodes after the tests: {left}"


def _node_of(resource: str) -> str:

    from asyncsandbox_ray._backend import _alive_nodes

    (node,) = [n["NodeID"] for n in _alive_nodes() if resource in n["Resources"]]
    return str(node)


async def _where(sandbox: Any) -> dict[str, Any]:
    """Facts reported by the actor on the sandbox's node (its Ray runtime context)."""
    from asyncsandbox_ray._link import result

    handle: Any = sandbox._life.handle
    return dict(await result(handle._actor.where.remote(), 30))


# -- placement --------------------------------------------------------------------------


async def test_placement_by_custom_resource(ray_cluster: LocalCluster) -> None:
    for resource in ("asb_w1", "asb_w2", "asb_head"):
        options = ray_cluster.backend_options(resources={resource: 1})
        async with Session("ray", backend_options=options) as session, session.sandbox() as sb:
            where = await _where(sb)
            assert where["node_id"] == _node_of(resource)
            result = await sb.exec(["sh", "-c", "echo $$"])
            assert result.ok


async def _burst(session: Session, count: int) -> list[Sandbox]:
    """``count`` sandboxes created at once (each create in a task of its own)."""
    sandboxes: list[Sandbox] = []

    async def create() -> None:
        sandboxes.append(await session.sandbox().start())

    async with anyio.create_task_group() as tg:
        for _ in range(count):
            tg.start_soon(create)
    return sandboxes


async def test_a_burst_spreads_over_nodes(ray_cluster: LocalCluster) -> None:
    """Six sandboxes created at once on three nodes of one CPU each: two on each (every
    placement is counted when it is made, not once its create answered)."""
    from asyncsandbox_ray import RayAttributes

    async with Session("ray", backend_options=ray_cluster.backend_options()) as session:
        sandboxes = await _burst(session, 6)
        nodes = Counter(sb.extra(RayAttributes.node_id) for sb in sandboxes)
        assert sorted(nodes.values()) == [2, 2, 2], nodes
        for sb in sandboxes:
            assert (await _where(sb))["node_id"] == sb.extra(RayAttributes.node_id)


async def test_a_burst_spreads_by_capacity(ray_cluster: LocalCluster) -> None:
    """Twelve sandboxes needing one ``asb_slots`` each, created at once on nodes holding 1,
    2 and 3 of it: 2, 4 and 6 of them, in every burst."""
    from asyncsandbox_ray import RayAttributes

    expected = {_node_of("asb_head"): 2, _node_of("asb_w1"): 4, _node_of("asb_w2"): 6}
    options = ray_cluster.backend_options(resources={"asb_slots": 1})
    async with Session("ray", backend_options=options) as session:
        for _ in range(3):
            sandboxes = await _burst(session, 12)
            nodes = Counter(sb.extra(RayAttributes.node_id) for sb in sandboxes)
            assert nodes == expected
            async with anyio.create_task_group() as tg:
                for sb in sandboxes:
                    tg.start_soon(sb.stop)


async def test_trio_driver(ray_cluster: LocalCluster) -> None:
    """A driver on trio; and what the node's backend knows of the command (its CPU time,
    here) crosses the hop."""

    async def main() -> ExecResult:
        options = ray_cluster.backend_options()
        async with Session("ray", backend_options=options) as session, session.sandbox() as sb:
            return await sb.exec(["echo", "from trio"])

    result = await anyio.to_thread.run_sync(lambda: anyio.run(main, backend="trio"))
    assert result.stdout == b"from trio\n"
    assert result.cpu_time is not None, result


# -- the code interpreter -----------------------------------------------------------------


async def test_run_code_runs_on_the_sandboxs_node(ray_cluster: LocalCluster) -> None:
    """run_code goes to the node (its agent's interpreter over the local sandbox): state,
    events as they come, a timeout that keeps the state, contexts, and nothing left when
    the sandbox goes."""
    from asyncsandbox import ExecTimeout, OutputMessage, SandboxDefaults

    options = ray_cluster.backend_options(resources={"asb_w1": 1})
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
async def test_conformance_on_ray(ray_cluster: LocalCluster, check: Check) -> None:
    if check.name == "launch_failure":
        pytest.skip("no hook yet to break a node's launcher from the driver")
    await check.run(lambda: _backend(ray_cluster))


def _backend(cluster: LocalCluster) -> Any:
    from asyncsandbox_ray import RayBackend

    return RayBackend(**cluster.backend_options())


# -- faults -------------------------------------------------------------------------------


async def test_node_killed_mid_exec(ray_cluster: LocalCluster) -> None:
    """A worker node killed during a command: SandboxDied (infrastructure) in bounded time;
    sandboxes on other nodes go on."""
    ray_cluster.start_node("victim", {"asb_victim": 1})
    victim = Session(
        "ray", backend_options=ray_cluster.backend_options(resources={"asb_victim": 1})
    )
    other = Session("ray", backend_options=ray_cluster.backend_options(resources={"asb_w1": 1}))
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


def _identity(pid: int) -> bytes | None:
    """``pid``'s start time (so a reused pid is not taken for it), or None once it exited
    (a zombie has exited: it is only its exit status)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_bytes()
    except OSError:
        return None
    fields = stat[stat.rindex(b")") + 2 :].split()
    return None if fields[0] in (b"Z", b"X") else fields[19]


def _left(processes: dict[int, bytes | None]) -> list[int]:
    return [pid for pid, start in processes.items() if _identity(pid) == start]


@contextlib.contextmanager
def _raylet_killed(cluster: LocalCluster, name: str, *, reaped: bool) -> Iterator[None]:
    """SIGKILL node ``name``'s raylet, and nothing else of the node. ``reaped``: its
    parent (``ray start``) reaps it and ends the node's other daemons, as it does; else
    the parent is stopped first, so the raylet stays a zombie (as under an init that does
    not reap), which Ray's own check in its workers counts as alive. The node's processes
    are all killed on leaving."""
    parent = cluster.processes[name].pid
    raylet = cluster.raylet(name)
    exited = select.poll()
    pidfd = os.pidfd_open(raylet)
    exited.register(pidfd, select.POLLIN)
    if not reaped:
        os.kill(parent, signal.SIGSTOP)
    try:
        os.kill(raylet, signal.SIGKILL)
        # Exited: every thread of it (its pidfd is readable), not only its main thread.
        # /proc says "Z" once the main thread is gone, while the others may still run for
        # a while (13 ms seen here): a call the agent got then ran as on a live node.
        eventually(lambda: exited.poll(0), within=30, what="the raylet's end")
        yield
    finally:
        os.close(pidfd)
        with contextlib.suppress(ProcessLookupError):
            os.kill(parent, signal.SIGCONT)
        cluster.kill_node(name)


@pytest.mark.timeout(300)  # a node and its agent start: a minute here when the machine is busy
@pytest.mark.parametrize("reaped", [True, False], ids=["reaped", "zombie"])
async def test_a_raylet_killed_is_sandbox_died(ray_cluster: LocalCluster, reaped: bool) -> None:
    """A node's raylet SIGKILLed while a command runs there: the command, and every later
    call of that node's sandboxes (exec, write_file, read_file), raise SandboxDied (the
    sandbox is gone), never a plain InfrastructureError (which says: retry in it).
    Another node's sandbox goes on."""
    from asyncsandbox_ray import RayAttributes

    name = f"raylet-{'reaped' if reaped else 'zombie'}"
    resource = f"asb_{name}"
    ray_cluster.start_node(name, {resource: 1})
    victim = Session("ray", backend_options=ray_cluster.backend_options(resources={resource: 1}))
    other = Session("ray", backend_options=ray_cluster.backend_options(resources={"asb_w1": 1}))
    marker = unique_marker()
    async with victim, other:
        running, *idle = [await victim.sandbox().start() for _ in range(4)]
        node_id = running.extra(RayAttributes.node_id)
        agent = (await _where(running))["pid"]
        agent_process = {agent: _identity(agent)}
        survivor = await other.sandbox().start()
        for sb in idle:
            await sb.write_file("f", b"before")
        outcome: list[BaseException] = []

        async def run() -> None:
            try:
                await running.exec(["sleep", marker])
            except Exception as exc:  # noqa: BLE001 - the test looks at its type
                outcome.append(exc)

        async with anyio.create_task_group() as tg:
            tg.start_soon(run)
            await eventually_async(lambda: processes_with(marker), within=30, what="it runs")
            with _raylet_killed(ray_cluster, name, reaped=reaped):
                calls = (
                    lambda: idle[0].exec(["echo", "hello"]),
                    lambda: idle[1].write_file("f", b"after"),
                    lambda: idle[2].read_file("f"),
                )
                for call in calls:
                    with anyio.fail_after(60), pytest.raises(SandboxDied):
                        await call()
                await eventually_async(lambda: outcome, within=60, what="the exec's end")
        assert isinstance(outcome[0], SandboxDied), repr(outcome[0])
        assert (await survivor.exec(["echo", "alive"])).stdout == b"alive\n"
    # The agent may still be removing its sandboxes and its root: a wipe beside it raced it
    # (CI: the root's .trash gone between the wipe's mkdir and its check).
    await eventually_async(
        lambda: not _left(agent_process), within=AGENT_EXIT_BOUND, what="the agent's end"
    )
    await _wipe_node(node_id)  # what the agent had no time to remove (Ray's exit came first)


AGENT_EXIT_BOUND = 15.0
"""Seconds from a raylet's death until no process of its node's agent is left: the agent
notices at once (a pidfd on the raylet), spends at most ``EXIT_GRACE`` (5 s) removing its
sandboxes, then exits; the rest is slack for a loaded two-core machine."""


@pytest.mark.timeout(300)
async def test_an_agent_does_not_outlive_its_raylet(ray_cluster: LocalCluster) -> None:
    """A node's raylet SIGKILLed and left unreaped (Ray's own check in the agent counts it
    alive, so the agent used to live on for hours): within ``AGENT_EXIT_BOUND`` seconds
    the agent, its sandboxes' processes and their command are gone, and so are the
    sandboxes' files."""
    from asyncsandbox_ray import RayAttributes
    from asyncsandbox_ray._node import _node_root
    from asyncsandbox_ray.testing import descendants

    ray_cluster.start_node("orphan", {"asb_orphan": 1})
    options = ray_cluster.backend_options(resources={"asb_orphan": 1})
    marker = unique_marker()
    async with Session("ray", backend_options=options) as session:
        sandboxes = [await session.sandbox().start() for _ in range(2)]
        node_id = sandboxes[0].extra(RayAttributes.node_id)
        agent = (await _where(sandboxes[0]))["pid"]

        async def run() -> None:
            with contextlib.suppress(SandboxDied):
                await sandboxes[0].exec(["sleep", marker])

        async with anyio.create_task_group() as tg:
            tg.start_soon(run)
            await sandboxes[1].exec(["true"])  # its executor started too
            await eventually_async(lambda: processes_with(marker), within=30, what="it runs")
            processes = {pid: _identity(pid) for pid in [agent, *descendants(agent)]}
            assert len(processes) >= 4, processes  # agent, executors, the command's init
            with _raylet_killed(ray_cluster, "orphan", reaped=False):
                await eventually_async(
                    lambda: not _left(processes), within=AGENT_EXIT_BOUND, what="the agent's end"
                )
                root_left = _node_root(node_id).exists()
                assert await _wipe_node(node_id) == 0  # the agent removed its sandboxes
                assert not root_left  # and the node's root
            tg.cancel_scope.cancel()


# -- load ---------------------------------------------------------------------------------

ROLLOUTS = int(os.environ.get("ASYNCSANDBOX_RAY_ROLLOUTS", "1000"))


@pytest.mark.timeout(900)  # a minute on a quiet machine; several when CI shares it
async def test_many_rollouts_leave_nothing(ray_cluster: LocalCluster) -> None:
    """ROLLOUTS short rollouts (create, two commands, remove), 16 at a time, over the
    cluster; afterwards no sandbox and no command is left on any node."""
    tag = f"rollouts-{uuid.uuid4().hex[:8]}"
    async with Session("ray", backend_options=ray_cluster.backend_options()) as session:
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
    from asyncsandbox_ray._backend import NAMESPACE, _alive_nodes
    from asyncsandbox_ray._link import result

    for node in _alive_nodes():
        actor = ray.get_actor(f"asyncsandbox-{node['NodeID'][:16]}-process", namespace=NAMESPACE)
        where = await result(actor.where.remote(), 30)
        assert where["runs"] == 0, where


OWNER = """
import sys, anyio
from asyncsandbox import Session

async def main() -> None:
    options = {"address": sys.argv[1], "init_options": {"_node_ip_address": "127.0.0.2"},
               "lease_ttl": 3.0}
    async with Session("ray", backend_options=options) as session:
        sandbox = await session.sandbox(tags=[sys.argv[2]]).start()
        print("sandbox", sandbox.id, flush=True)
        await anyio.sleep_forever()  # until it is killed

anyio.run(main)
"""


async def test_crashed_owner_is_swept(ray_cluster: LocalCluster) -> None:
    """An owner killed with SIGKILL stops renewing its lease; the node's actor removes
    its sandbox soon after the lease ends (the Session's own same-host sweep is off here,
    as it would be for an owner on another machine)."""
    tag = f"orphan-{uuid.uuid4().hex[:8]}"
    args = [sys.executable, "-c", OWNER, ray_cluster.address, tag]
    async with await anyio.open_process(args, stderr=subprocess.DEVNULL) as owner:
        assert owner.stdout is not None
        # Ray's driver prints to stdout too (a node killed by an earlier test is reported
        # to every new driver once it is marked dead): the sandbox's line, among others.
        said = b""
        with anyio.fail_after(120):
            while b"sandbox r-" not in said:
                said += await owner.stdout.receive()
        owner.kill()
    options = ray_cluster.backend_options()
    async with Session("ray", backend_options=options, sweep=False) as session:
        assert len(await session.list(tags=[tag])) == 1

        async def swept() -> bool:
            return not await session.list(tags=[tag])

        await eventually_async(swept, within=30, what="the orphan swept")
