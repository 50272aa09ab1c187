"""The driver-side half: :class:`RayBackend`, a :class:`~asyncsandbox.abc.Backend` whose
sandboxes live on the nodes of a Ray cluster, each hosted by its node's
:class:`~asyncsandbox_ray._node.NodeAgent` actor.

Every call of a sandbox goes straight to its node's actor (no central hop). Ray's object
refs are awaited through ``ObjectRef.future()``, so the backend runs on asyncio and trio
alike; blocking Ray calls (connecting, listing nodes, finding actors) run in a worker
thread. Ray's failures are translated here, once (:func:`_ray_errors`): an actor or node
that died is :class:`~asyncsandbox.SandboxDied`; a call that does not answer within its
deadline is too (a node that stopped answering), so nothing hangs.
"""

from __future__ import annotations

import builtins
import re
import time
import uuid
from collections.abc import AsyncIterable, AsyncIterator, Iterator, Mapping
from contextlib import asynccontextmanager, contextmanager, suppress
from typing import Any, Self

import anyio
import anyio.abc
import anyio.lowlevel
import anyio.to_thread
import msgspec
from anyio import TypedAttributeSet, typed_attribute

from asyncsandbox import (
    BackendUnavailable,
    CodeContext,
    Execution,
    InvalidArgument,
    SandboxDied,
    SandboxError,
    SandboxInfo,
    SandboxNotFound,
)
from asyncsandbox.abc import (
    Backend,
    BackendCapabilities,
    CodeEventCallback,
    CodeRequest,
    ExitStatus,
    OutputCallback,
    SandboxHandle,
    SandboxSpec,
)
from asyncsandbox.log import get_logger

from ._link import CALL_GRACE, Link, future_result, in_daemon_thread, result
from ._node import OWNER_LABEL, POLL_WAIT, NodeAgent
from ._wire import error_from_wire

__all__ = ("RayAttributes", "RayBackend")

NAMESPACE = "asyncsandbox"
NODE_TABLE_TTL = 2.0
AVOID_FOR = 30.0
"""Seconds a node whose create failed as unavailable (gone, or its engine down) is not
chosen, while Ray's node table may still list it as alive."""
_ID = re.compile(r"r-([0-9a-f]{16})-(.+)")

log = get_logger("asyncsandbox.ray")


class RayAttributes(TypedAttributeSet):
    """Typed attributes of Ray sandboxes (``sandbox.extra(RayAttributes.node_id)``)."""

    node_id: str = typed_attribute()
    """The Ray node the sandbox lives on (hex)."""
    local_id: str = typed_attribute()
    """The sandbox's id in the node's own backend."""


# -- Ray, at the boundary ----------------------------------------------------------------


@contextmanager
def _ray_errors(sandbox_id: str | None, what: str) -> Iterator[None]:
    """Translate Ray's exceptions (users never see them)."""
    import ray.exceptions as rx

    try:
        yield
    except SandboxError:
        raise
    except (rx.RayActorError, rx.ActorUnschedulableError, rx.NodeDiedError) as exc:
        if sandbox_id is not None:
            raise SandboxDied(sandbox_id, f"its Ray node or actor died ({what})") from exc
        raise BackendUnavailable(f"a Ray node actor died ({what}): {exc}") from exc
    except TimeoutError as exc:
        if sandbox_id is not None:
            raise SandboxDied(sandbox_id, f"its Ray node stopped answering ({what})") from exc
        raise BackendUnavailable(f"a Ray node did not answer ({what})") from exc
    except rx.RayError as exc:
        raise BackendUnavailable(f"Ray failed ({what}): {type(exc).__name__}: {exc}") from exc


def _unwrap(answer: Any, sandbox_id: str | None) -> Any:
    status, value = answer
    if status == "error":
        raise error_from_wire(value, sandbox_id=sandbox_id)
    return value


class _Nodes:
    """Finds (or makes) the agent actor of a node; cached per backend."""

    def __init__(self, kind: str, options: dict[str, Any], lease_ttl: float) -> None:
        self.kind, self.options, self.lease_ttl = kind, options, lease_ttl
        self.actors: dict[str, Any] = {}

    def name(self, node_key: str) -> str:
        return f"asyncsandbox-{node_key}-{self.kind}"

    def cached(self, node_id: str) -> Any | None:
        return self.actors.get(node_id[:16])

    def get_or_create(self, node_id: str) -> Any:
        """(Blocking: Ray looks the name up in its control plane.)"""
        from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

        key = node_id[:16]
        actor = self.actors.get(key)
        if actor is None:
            actor = (
                _agent_class()
                .options(
                    name=self.name(key),
                    namespace=NAMESPACE,
                    get_if_exists=True,
                    lifetime="detached",
                    num_cpus=0,
                    max_restarts=0,
                    max_concurrency=10_000,
                    # A data-plane actor: Ray's task events would report each of its
                    # calls to the control plane (CPU per call on the driver, the actor
                    # and the GCS); its failures are reported by this backend.
                    enable_task_events=False,
                    scheduling_strategy=NodeAffinitySchedulingStrategy(node_id, soft=False),
                )
                .remote(self.kind, self.options, self.lease_ttl)
            )
            self.actors[key] = actor
        return actor

    def forget(self, node_id: str) -> None:
        self.actors.pop(node_id[:16], None)

    def existing(self, key: str) -> Any | None:
        import ray

        actor = self.actors.get(key)
        if actor is None:
            try:
                actor = ray.get_actor(self.name(key), namespace=NAMESPACE)
            except ValueError:
                return None
            self.actors[key] = actor
        return actor


_AGENT: Any = None


def _agent_class() -> Any:
    global _AGENT
    if _AGENT is None:
        import ray

        _AGENT = ray.remote(NodeAgent)
    return _AGENT


def _alive_nodes() -> list[dict[str, Any]]:
    import ray

    nodes: list[dict[str, Any]] = ray.nodes()  # type: ignore[no-untyped-call]
    return [n for n in nodes if n.get("Alive")]


class RayBackend(Backend):
    """Sandboxes across a Ray cluster: ``Session("ray")``.

    :param address: the cluster to join when Ray is not initialized in this process yet
        (``ray.init(address=...)``); default ``"auto"``. Inside a Ray task or actor, and
        after your own ``ray.init``, the running connection is used.
    :param node_backend: the backend each node runs sandboxes with (``"process"``, or
        ``"docker"`` where nodes have an engine).
    :param node_backend_options: its options (as ``backend_options``).
    :param resources: custom resources a node must have to host this session's sandboxes
        (e.g. ``{"sandbox": 1}``): nodes without them are never chosen.
    :param max_per_node: sandboxes of this backend per node at most (spread before that).
    :param lease_ttl: seconds after its owner stopped renewing (crashed) before a node
        removes its sandboxes.
    :param init_options: more keyword arguments for ``ray.init``.
    """

    name = "ray"

    def __init__(
        self,
        *,
        address: str | None = None,
        node_backend: str = "process",
        node_backend_options: Mapping[str, Any] | None = None,
        resources: Mapping[str, float] | None = None,
        max_per_node: int = 256,
        lease_ttl: float = 60.0,
        init_options: Mapping[str, Any] | None = None,
    ) -> None:
        if max_per_node < 1:
            raise InvalidArgument("max_per_node must be >= 1")
        if not lease_ttl > 0:
            raise InvalidArgument("lease_ttl must be > 0")
        self._address = address
        self._init = dict(init_options or {})
        self._resources = dict(resources or {})
        self._max_per_node = max_per_node
        self._nodes = _Nodes(node_backend, dict(node_backend_options or {}), lease_ttl)
        self._owner = uuid.uuid4().hex
        self._table: list[dict[str, Any]] = []
        self._table_read = -float("inf")
        self._table_lock = anyio.Lock()
        self._placed: dict[str, int] = {}  # node id -> sandboxes of this backend there
        self._avoid: dict[str, float] = {}  # node id -> until when no sandbox goes there
        self._task_group: anyio.abc.TaskGroup | None = None
        self._links: dict[str, Link] = {}  # node key -> this backend's link to its agent

    @property
    def capabilities(self) -> BackendCapabilities:
        return BackendCapabilities(
            isolation=f"the {self._nodes.kind} backend of a Ray node",
            enforced_limits=frozenset({"memory_mb", "pids", "cpus"}),
            network_modes=frozenset({"none", "host"}),
        )

    async def __aenter__(self) -> Self:
        # In a daemon thread, abandoned if cancelled (a deadline of the caller): ray.init
        # cannot be interrupted, and waits for as long as a cluster that does not answer
        # lets it; nor may it keep the interpreter from exiting.
        await future_result(in_daemon_thread(self._connect), None)
        task_group = anyio.create_task_group()
        await task_group.__aenter__()
        self._task_group = task_group
        task_group.start_soon(self._renew_forever)
        return self

    def _connect(self) -> None:
        import ray

        if not ray.is_initialized():
            try:
                ray.init(
                    address=self._address or "auto",
                    namespace=NAMESPACE,
                    log_to_driver=False,
                    **self._init,
                )
            except (ConnectionError, RuntimeError, ValueError) as exc:
                raise BackendUnavailable(
                    f"cannot join the Ray cluster at {self._address or 'auto'}: {exc}"
                ) from exc

    async def _renew_forever(self) -> None:
        while True:
            await self._renew()
            await anyio.sleep(self._nodes.lease_ttl / 4)

    async def _renew(self) -> None:
        for key in list(self._nodes.actors):
            actor = self._nodes.actors[key]
            try:
                await result(actor.renew.remote(self._owner, self._nodes.lease_ttl), CALL_GRACE)
            except Exception as exc:  # noqa: BLE001 - a dead node: its sandboxes report it themselves
                log.debug("ray.lease.renew_failed", node=key, error=repr(exc))

    async def aclose(self) -> None:
        if self._task_group is not None:
            task_group, self._task_group = self._task_group, None
            task_group.cancel_scope.cancel()
            await task_group.__aexit__(None, None, None)

    def _link(self, node_id: str, actor: Any) -> Link:
        """This backend's link to ``actor``, the agent of ``node_id`` (a new one when the
        node's actor was found anew)."""
        key = node_id[:16]
        link = self._links.get(key)
        if link is None or link.actor is not actor:
            # (A link replaced stays with the sandboxes that use it: their calls fail
            # as that actor's calls do.)
            if self._task_group is None:
                raise BackendUnavailable("the Ray backend is not open")
            link = self._links[key] = Link(actor)
            self._task_group.start_soon(link.pump)
        return link

    # -- placement -----------------------------------------------------------------------

    async def _live_nodes(self) -> builtins.list[dict[str, Any]]:
        """Live nodes, read from Ray's control plane at most every ``NODE_TABLE_TTL``
        seconds (not once per sandbox; one reader at a time). A node that died since
        fails its create with ``BackendUnavailable`` (retryable): it is avoided for
        ``AVOID_FOR`` seconds, the table is read again, and the runtime's retry places
        the sandbox anew."""
        if time.monotonic() - self._table_read > NODE_TABLE_TTL:
            async with self._table_lock:
                if time.monotonic() - self._table_read > NODE_TABLE_TTL:
                    self._table = await anyio.to_thread.run_sync(_alive_nodes)
                    self._table_read = time.monotonic()
        return self._table

    def _capacity(self, node: dict[str, Any]) -> float:
        """How many sandboxes of this backend the node is worth, relative to others: its
        amount of the custom resources asked for, per sandbox (the scarcest one), or its
        CPUs when none were asked for. 0: not a candidate."""
        have = node.get("Resources", {})
        wanted = {k: v for k, v in self._resources.items() if v > 0}
        if any(have.get(k, 0.0) < v for k, v in self._resources.items()):
            return 0.0
        if wanted:
            return float(min(have.get(k, 0.0) / v for k, v in wanted.items()))
        return float(have.get("CPU", 0.0))

    def _choose(self, table: builtins.list[dict[str, Any]]) -> str:
        """The node for the next sandbox: the least loaded for its capacity, counting
        every sandbox this backend placed so far (also those still being created, so a
        burst of creates spreads by capacity). Synchronous: the caller counts the
        placement before it awaits anything."""
        now = time.monotonic()
        best: tuple[float, str] | None = None
        for node in table:
            node_id = str(node["NodeID"])
            placed = self._placed.get(node_id, 0)
            if placed >= self._max_per_node or self._avoid.get(node_id, 0.0) > now:
                continue
            capacity = self._capacity(node)
            if capacity > 0 and (best is None or (placed + 1) / capacity < best[0]):
                best = ((placed + 1) / capacity, node_id)
        if best is None:
            raise BackendUnavailable(
                f"no live Ray node has room for a sandbox needing {self._resources or 'a CPU'}"
                f" (max_per_node={self._max_per_node})",
                retryable=True,
            )
        return best[1]

    def _released(self, node_id: str) -> None:
        self._placed[node_id] = max(0, self._placed.get(node_id, 0) - 1)

    async def create(self, spec: SandboxSpec) -> SandboxHandle:
        node_id = self._choose(await self._live_nodes())
        self._placed[node_id] = self._placed.get(node_id, 0) + 1
        labels = {**spec.labels, OWNER_LABEL: self._owner}
        wire = msgspec.to_builtins(msgspec.structs.replace(spec, labels=labels))
        token = uuid.uuid4().hex
        actor: Any = None
        try:
            with _ray_errors(None, "create"):
                actor = self._nodes.cached(node_id)
                if actor is None:
                    actor = await anyio.to_thread.run_sync(self._nodes.get_or_create, node_id)
                link = self._link(node_id, actor)
                args = (token, self._owner, self._nodes.lease_ttl, wire)
                local_id = _unwrap(await link.call("create", args, None), None)
        except BaseException as exc:
            self._released(node_id)
            if isinstance(exc, BackendUnavailable):  # the node may be gone: look again
                self._avoid[node_id] = time.monotonic() + AVOID_FOR
                self._table_read = -float("inf")
                self._nodes.forget(node_id)
            if actor is not None:
                # Shielded and bounded: a cancelled create leaves nothing behind, so the
                # node is told to remove what it makes (or made) for this token.
                with anyio.CancelScope(shield=True), anyio.move_on_after(self.timeouts.cleanup):
                    try:
                        await result(actor.abandon.remote(token), None)
                    except Exception as error:  # noqa: BLE001 - the node is gone; so is the sandbox
                        log.debug("ray.create.abandon_failed", node=node_id, error=repr(error))
            raise
        return RaySandbox(self, link, node_id, local_id, spec.workdir, spec.env)

    async def attach(self, sandbox_id: str) -> SandboxHandle:
        match = _ID.fullmatch(sandbox_id)
        if match is None:
            raise SandboxNotFound(sandbox_id)
        key, local_id = match.groups()
        actor = await anyio.to_thread.run_sync(self._nodes.existing, key)
        if actor is None:
            raise SandboxNotFound(sandbox_id)
        with _ray_errors(None, "attach"):
            _unwrap(await result(actor.attach.remote(local_id), CALL_GRACE), sandbox_id)
            where = await result(actor.where.remote(), CALL_GRACE)
        return RaySandbox(self, self._link(key, actor), where["node_id"], local_id)

    async def list(self, *, labels: Mapping[str, str]) -> builtins.list[SandboxInfo]:
        nodes = await anyio.to_thread.run_sync(_alive_nodes)
        out: builtins.list[SandboxInfo] = []
        for node in nodes:
            key = node["NodeID"][:16]
            actor = await anyio.to_thread.run_sync(self._nodes.existing, key)
            if actor is None:
                continue
            try:
                with _ray_errors(None, "list"):
                    infos = _unwrap(await result(actor.list.remote(dict(labels)), CALL_GRACE), None)
            except BackendUnavailable:
                continue  # a node dying now: its sandboxes are gone with it
            out.extend(
                msgspec.structs.replace(info, id=f"r-{key}-{info.id}", backend=self.name)
                for info in infos
            )
        return out


class RaySandbox(SandboxHandle):
    """A sandbox on a node. A :class:`~asyncsandbox.abc.CodeInterpreter`: its code runs on
    its node, in the node agent's interpreter over the local sandbox (the driver polls
    the call's events as it polls a command's output)."""

    def __init__(
        self,
        backend: RayBackend,
        link: Link,
        node_id: str,
        local_id: str,
        workdir: str = "/workspace",
        env: Mapping[str, str] | None = None,
    ) -> None:
        self._backend = backend
        self._link = link
        self._actor = link.actor
        self._node_id = node_id
        self._local = local_id
        self._id = f"r-{node_id[:16]}-{local_id}"
        self._removed = False
        # Where its interpreter starts, and with what environment (an attached sandbox's
        # are not known here: the defaults).
        self._code_home = (workdir, dict(env or {}))

    @property
    def id(self) -> str:
        return self._id

    @property
    def extra_attributes(self) -> Mapping[Any, Any]:
        return {
            RayAttributes.node_id: lambda: self._node_id,
            RayAttributes.local_id: lambda: self._local,
        }

    async def _call(self, method: str, *args: Any, wait: float = CALL_GRACE) -> Any:
        with _ray_errors(self._id, method):
            return _unwrap(await self._link.call(method, (self._local, *args), wait), self._id)

    async def exec(
        self,
        argv: tuple[str, ...],
        *,
        cwd: str,
        env: Mapping[str, str],
        stdin: bytes | None,
        on_output: OutputCallback,
        timeout: float | None = None,
    ) -> ExitStatus:
        run_id = uuid.uuid4().hex  # ours: a start still on its way can be killed by it
        status: ExitStatus | None = None
        error: Any = None
        try:
            chunks, status, error = await self._call(
                "exec_start",
                run_id,
                argv,
                cwd,
                dict(env),
                stdin,
                timeout,
                wait=POLL_WAIT + CALL_GRACE,
            )
            while True:
                for stream, data in chunks:
                    await on_output(stream, data)
                if error is not None:
                    raise error_from_wire(error, sandbox_id=self._id)
                if status is not None:
                    return status
                with _ray_errors(self._id, "exec"):
                    answer = await self._link.call("exec_poll", (run_id,), POLL_WAIT + CALL_GRACE)
                    chunks, status, error = answer
        except BaseException:
            if status is None and error is None:
                await self._kill_on_node(run_id, "exec")
            raise

    async def _kill_on_node(self, run_id: str, what: str) -> None:
        """Kill run ``run_id`` (a command's tree, or a code call) on its node, shielded and
        bounded: it is gone before the cancellation (or error) that ended its wait goes on."""
        with anyio.CancelScope(shield=True), anyio.move_on_after(self._backend.timeouts.cleanup):
            try:
                await result(self._actor.exec_kill.remote(run_id), None)
            except Exception as exc:  # noqa: BLE001 - the node is gone: so is the run
                log.debug("ray.kill_failed", sandbox=self._id, run=what, error=repr(exc))

    # -- the code interpreter ---------------------------------------------------------

    async def run_code(self, request: CodeRequest, *, on_event: CodeEventCallback) -> Execution:
        run_id = uuid.uuid4().hex
        execution: Execution | None = None
        error: Any = None
        try:
            events, execution, error = await self._call(
                "code_start", run_id, request, *self._code_home, wait=POLL_WAIT + CALL_GRACE
            )
            while True:
                for event in events:
                    await on_event(event)
                if error is not None:
                    raise error_from_wire(error, sandbox_id=self._id)
                if execution is not None:
                    return execution
                with _ray_errors(self._id, "run_code"):
                    answer = await self._link.call("code_poll", (run_id,), POLL_WAIT + CALL_GRACE)
                    events, execution, error = answer
        except BaseException:
            if execution is None and error is None:
                await self._kill_on_node(run_id, "run_code")
            raise

    async def _contexts(self, op: str, *args: Any) -> Any:
        return await self._call("code_contexts", *self._code_home, op, *args)

    async def create_code_context(self, *, cwd: str, language: str) -> CodeContext:
        context: CodeContext = await self._contexts("create", cwd, language)
        return context

    async def list_code_contexts(self) -> builtins.list[CodeContext]:
        contexts: builtins.list[CodeContext] = await self._contexts("list")
        return contexts

    async def restart_code_context(self, context_id: str) -> None:
        await self._contexts("restart", context_id)

    async def remove_code_context(self, context_id: str) -> None:
        await self._contexts("remove", context_id)

    # -- files ---------------------------------------------------------------------------

    async def read_file(self, path: str, *, max_bytes: int) -> bytes:
        data: bytes = await self._call("read_file", path, max_bytes)
        return data

    async def write_file(self, path: str, data: bytes, *, mode: int) -> None:
        await self._call("write_file", path, data, mode)

    async def put_archive(self, path: str, archive: AsyncIterable[bytes]) -> None:
        # Sent whole in one call (a Ray object): simple; bounded by what the caller sends.
        data = bytearray()
        async for chunk in archive:
            data += chunk
        await self._call("put_archive", path, bytes(data))

    @asynccontextmanager
    async def _archive(self, path: str) -> AsyncIterator[AsyncIterator[bytes]]:
        data: bytes = await self._call("get_archive", path)

        async def stream() -> AsyncIterator[bytes]:
            for i in range(0, len(data), 1 << 20):
                yield data[i : i + (1 << 20)]

        yield stream()

    def get_archive(self, path: str) -> Any:
        return self._archive(path)

    async def inspect(self) -> SandboxInfo:
        try:
            info: SandboxInfo = await self._call("inspect")
        except SandboxDied as exc:
            raise SandboxNotFound(self._id) from exc
        return msgspec.structs.replace(info, id=self._id, backend="ray")

    async def remove(self) -> None:
        if self._removed:
            return
        with suppress(SandboxDied):  # its node is gone, and the sandbox with it
            await self._call("remove", wait=self._backend.timeouts.cleanup)
        self._removed = True
        self._backend._released(self._node_id)
