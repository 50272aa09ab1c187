"""The opening and closing of a backend that talks to a service through a client, with
background work beside it (see :class:`ServiceConnection`)."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Coroutine
from typing import Any, Generic, Literal, Protocol, TypeVar

import anyio
import anyio.abc

from ._errors import InvalidArgument, RequestNotSent

__all__ = ("ServiceConnection",)


class _Closable(Protocol):
    async def aclose(self) -> None: ...


ClientT = TypeVar("ClientT", bound=_Closable)


class ServiceConnection(Generic[ClientT]):
    """What :meth:`Backend.__aenter__ <asyncsandbox.abc.Backend.__aenter__>` and
    :meth:`Backend.aclose <asyncsandbox.abc.Backend.aclose>` do for a backend that talks to
    a service through a client (an HTTP connection pool) and keeps work running in the
    background (a lease keeper): opened once, with a first call that checks the service;
    closed once, the background work first, then the client.

    A first call whose request never left (:class:`~asyncsandbox.RequestNotSent`) leaves
    it as new, its client closed, so that the Session's
    :class:`~asyncsandbox.RetryPolicy` may open it again, as the contract asks; any other
    failure leaves it closed.

    :param owner: what the backend is called in the error when it is opened twice
        (``"a RemoteBackend"``).
    """

    __slots__ = ("_client", "_closed", "_owner", "_task_group")

    def __init__(self, owner: str) -> None:
        self._owner = owner
        self._client: ClientT | None = None
        self._task_group: anyio.abc.TaskGroup | None = None
        self._closed = False

    @property
    def client(self) -> ClientT | None:
        """The client: None until :meth:`open` made one, or after its first call never
        left."""
        return self._client

    @property
    def state(self) -> Literal["new", "open", "closed"]:
        """``new`` (never opened, or its first call never left), ``open`` or ``closed``."""
        if self._closed:
            return "closed"
        return "open" if self._client is not None else "new"

    async def open(
        self,
        connect: Callable[[], ClientT],
        check: Callable[[ClientT], Awaitable[object]],
        background: Callable[[], Coroutine[Any, Any, object]],
    ) -> ClientT:
        """Make the client (``connect()``), await ``check(client)``, then run
        ``background()`` in a task group of its own until :meth:`aclose`, which must be
        called from the same task (the Session does). Returns the client.

        :raises InvalidArgument: it was opened before.

        Cancellation: the client is closed, and the cancellation propagates.
        """
        if self._closed or self._client is not None:
            raise InvalidArgument(f"{self._owner} can be opened once")
        client = self._client = connect()
        task_group = anyio.create_task_group()
        try:
            await check(client)
            # Exited in aclose(), which the Session calls from this same task.
            await task_group.__aenter__()
        except RequestNotSent:
            # The service never saw us: left as new, to be opened again.
            self._client = None
            await _close(client)
            raise
        except BaseException:
            self._closed = True
            await _close(client)
            raise
        self._task_group = task_group
        task_group.start_soon(background)
        return client

    async def aclose(self) -> None:
        """Stop the background work, then close the client. Idempotent.

        Cancellation: the client's ``aclose`` shields what it must.
        """
        if self._closed and self._task_group is None:
            return
        self._closed = True
        task_group, self._task_group = self._task_group, None
        if task_group is not None:
            task_group.cancel_scope.cancel()
            await task_group.__aexit__(None, None, None)
        if self._client is not None:
            await self._client.aclose()


async def _close(client: _Closable) -> None:
    """Close ``client`` on an exit path: shielded, so that a cancellation (the one being
    raised, perhaps) does not leave its connections open; closing a pool only closes its
    sockets."""
    with anyio.CancelScope(shield=True):
        await client.aclose()
