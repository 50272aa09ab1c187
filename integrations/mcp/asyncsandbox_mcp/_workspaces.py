"""One sandbox per MCP session: created on the session's first tool call, removed when
the session ends (its client ends it, it is idle too long, or the server stops)."""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from types import TracebackType
from typing import Any, Self

import anyio
import anyio.abc

from asyncsandbox import Sandbox, Session
from asyncsandbox.log import get_logger
from asyncsandbox.tools import Toolbox, ToolResult

from ._config import McpConfig

__all__ = ("Workspaces",)

log = get_logger("asyncsandbox.mcp")

# How long removing the sandboxes may take when the server stops; Sandbox.stop() bounds
# each removal by the Session's own Timeouts.remove, this bounds them all together.
_CLOSE_DEADLINE = 120.0


class _Workspace:
    __slots__ = ("busy", "idle_since", "sandbox", "toolbox")

    def __init__(self, sandbox: Sandbox, toolbox: Toolbox, now: float) -> None:
        self.sandbox = sandbox
        self.toolbox = toolbox
        self.busy = 0
        self.idle_since = now


class Workspaces:
    """The sandboxes of the MCP server's sessions, by session key; an async context
    manager whose exit removes every one of them.

    :param session: where the sandboxes are created (tagged ``asyncsandbox-mcp``).
    :param config: the tools offered, the session bound and the idle timeout.
    :param expire_idle: remove the sandbox of a session idle for ``config.idle_timeout``
        (streamable HTTP; stdio's one session lasts as long as its client).
    """

    def __init__(self, session: Session, config: McpConfig, *, expire_idle: bool) -> None:
        self.session = session
        self.config = config
        self.idle_timeout = config.idle_timeout if expire_idle else None
        self._workspaces: dict[str, _Workspace] = {}
        self._expired: dict[str, float] = {}  # key -> when: answered as an ended session
        self._task_group: anyio.abc.TaskGroup | None = None
        # The tools' schemas do not depend on a sandbox's state: a Toolbox over a sandbox
        # that is never started gives them (and checks the tool options once, up front).
        self._template = Toolbox(session.sandbox(), **config.toolbox_options())

    def schemas(self) -> list[dict[str, Any]]:
        """The OpenAI-style definitions of the tools offered (:meth:`Toolbox.schemas
        <asyncsandbox.tools.Toolbox.schemas>`)."""
        return self._template.schemas()

    @property
    def live(self) -> int:
        """Sessions that have a sandbox now."""
        return len(self._workspaces)

    async def __aenter__(self) -> Self:
        if self.idle_timeout is not None:
            self._task_group = await anyio.create_task_group().__aenter__()
            self._task_group.start_soon(self._expire_idle)
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> bool | None:
        try:
            if self._task_group is not None:
                # Only the expiry loop runs in it: stop it. The body's own exception (if any)
                # propagates from here unchanged, not wrapped in the group's.
                self._task_group.cancel_scope.cancel()
                await self._task_group.__aexit__(None, None, None)
        finally:
            await self.aclose()
        return None

    async def aclose(self) -> None:
        """Remove every session's sandbox. Idempotent.

        Cancellation: runs shielded, bounded (each removal by the Session's
        ``Timeouts.remove``), so the sandboxes go even when the server is cancelled.
        """
        # Shielded: a server stopped by a signal or a cancelled task must not leave sandboxes.
        with anyio.CancelScope(shield=True), anyio.move_on_after(_CLOSE_DEADLINE):
            async with anyio.create_task_group() as tg:
                for key in list(self._workspaces):
                    tg.start_soon(self.end, key, "server stopped")

    def ended(self, key: str) -> bool:
        """Whether the session ``key`` was ended here (its sandbox expired): the transport
        answers it as a session that no longer exists."""
        return key in self._expired

    @contextmanager
    def active(self, key: str) -> Iterator[None]:
        """While inside, the session ``key`` has a request in flight: it is not idle."""
        workspace = self._workspaces.get(key)
        if workspace is not None:
            workspace.busy += 1
        try:
            yield
        finally:
            if workspace is not None:
                workspace.busy -= 1
                workspace.idle_since = anyio.current_time()

    async def call(self, key: str, name: str, arguments: Mapping[str, Any] | None) -> ToolResult:
        """Run the tool ``name`` in the sandbox of session ``key`` (made on first use).

        Never raises for the tool's failures: they are results (see
        :meth:`Toolbox.call <asyncsandbox.tools.Toolbox.call>`); so is a session beyond
        ``max_sessions``.

        Cancellation: propagates; a running command is killed first.
        """
        workspace = self._workspaces.get(key)
        if workspace is None:
            if len(self._workspaces) >= self.config.max_sessions:
                return ToolResult(
                    name=name,
                    observation=(
                        f"Error: the server has {self.config.max_sessions} sessions with "
                        "sandboxes already; try again when one ends. This is an "
                        "infrastructure failure."
                    ),
                    is_error=True,
                    infrastructure_error=True,
                )
            sandbox = self.session.sandbox(tags=("asyncsandbox-mcp",))
            toolbox = Toolbox(sandbox, **self.config.toolbox_options())
            workspace = self._workspaces[key] = _Workspace(sandbox, toolbox, anyio.current_time())
            log.info("mcp.session.sandbox", session=key)
        with self.active(key):
            return await workspace.toolbox.call(name, dict(arguments or {}))

    async def end(self, key: str, reason: str) -> None:
        """Remove the sandbox of session ``key``, if it has one.

        Cancellation: the removal runs shielded (:meth:`Sandbox.stop
        <asyncsandbox.Sandbox.stop>`).
        """
        workspace = self._workspaces.pop(key, None)
        if workspace is None:
            return
        log.info("mcp.session.ended", session=key, reason=reason, sandbox_id=workspace.sandbox.id)
        await workspace.sandbox.stop()

    async def _expire_idle(self) -> None:
        assert self.idle_timeout is not None
        timeout = self.idle_timeout
        while True:
            await anyio.sleep(min(timeout / 4, 15.0))
            now = anyio.current_time()
            for key, since in list(self._expired.items()):
                # By then the transport has forgotten the session too (same timeout).
                if now - since > 2 * timeout:
                    del self._expired[key]
            for key, workspace in list(self._workspaces.items()):
                if not workspace.busy and now - workspace.idle_since >= timeout:
                    self._expired[key] = now
                    await self.end(key, "idle")
