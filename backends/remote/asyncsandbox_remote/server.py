"""The sandbox server: ``asyncsandbox serve``.

Serves any backend over HTTP (Starlette on uvicorn, asyncio) with API keys as bearer
tokens, one tenant per key. Run it from the command line::

    ASYNCSANDBOX_API_KEYS="alice:$(openssl rand -hex 24)" \\
        asyncsandbox serve --backend process --listen 0.0.0.0:8765

or embed it: ``await serve(ServerConfig(...), load_tenants("keys.txt"))``; or mount
:func:`create_app` in an ASGI server of your own (on asyncio).

Shutdown (SIGTERM or SIGINT): the server stops accepting connections, gives requests in
flight ``shutdown_grace`` seconds to finish, cancels the rest (their commands are
killed), then removes every sandbox — or keeps them with ``on_shutdown="keep"`` (they
then end at their ``max_lifetime``; ``asyncsandbox gc`` on the server host or the next
server's sweep removes them, their owner being gone).
"""

from __future__ import annotations

import argparse
import functools
import logging
import signal
import socket
import sys
from collections.abc import Callable, Sequence
from typing import TextIO

import anyio
import msgspec

from asyncsandbox import Limits, SandboxError, Timeouts
from asyncsandbox.abc import Backend
from asyncsandbox.cli import parse_backend_options

from ._app import create_app
from ._config import KEYS_ENV, ServerConfig, Tenant, load_tenants
from ._serverstate import ServerState

__all__ = ("ServerConfig", "Tenant", "create_app", "load_tenants", "main", "serve")


# Show public objects as `asyncsandbox_remote.server.X`, as anyio does for its own. The
# structs' annotations are evaluated where they are defined (_config.py has no postponed
# annotations): msgspec would otherwise look their names up here.
for _obj in (ServerConfig, Tenant, create_app, load_tenants):
    _obj.__module__ = __name__
del _obj


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("asyncsandbox-remote")
    except PackageNotFoundError:  # pragma: no cover - running from a source tree
        return "0"


def _bind(host: str, port: int) -> socket.socket:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.create_server((host.strip("[]"), port), family=family, backlog=2048)
    sock.set_inheritable(True)
    return sock


async def serve(
    config: ServerConfig,
    tenants: Sequence[Tenant],
    *,
    backend: Backend | None = None,
    ready: Callable[[str], None] | None = None,
) -> bool:
    """Run the server until SIGTERM/SIGINT (or cancellation); return whether it started.

    :param backend: an instance to serve instead of ``config.backend`` by name.
    :param ready: called with the base URL once the server accepts requests (useful with
        ``port=0``, which picks a free port).

    Runs on asyncio only (uvicorn). Cancellation: the server shuts down as on SIGTERM.
    """
    import uvicorn

    app = create_app(config, tenants, backend=backend, version=_version())
    state: ServerState = app.state.server
    sock = _bind(config.host, config.port)
    host, port = sock.getsockname()[:2]
    scheme = "https" if config.tls_cert else "http"
    shown = f"[{host}]" if ":" in host else host
    url = f"{scheme}://{shown}:{port}"
    uv_config = uvicorn.Config(
        app,
        lifespan="off",  # run by us, around the server: see below
        log_config=None,  # the application configures logging (see main())
        access_log=True,
        server_header=False,
        ssl_certfile=config.tls_cert,
        ssl_keyfile=config.tls_key,
        # Longer than clients keep idle connections (RemoteBackend: 15 s), so the server
        # never closes a connection a client is about to reuse.
        timeout_keep_alive=60,
        timeout_graceful_shutdown=max(1, round(config.shutdown_grace)),
    )
    server = uvicorn.Server(uv_config)

    async def announce() -> None:
        while not server.started:
            if server.should_exit:
                return
            await anyio.sleep(0.02)
        if ready is not None:
            ready(url)

    try:
        # The application's lifespan (the Session over the backend, the lease reaper) runs
        # here, around uvicorn, rather than under it: a backend that cannot start (say, no
        # Docker engine) is raised to the caller as the asyncsandbox error it is, before
        # the URL is announced, instead of uvicorn logging a traceback and exiting.
        async with state.lifespan(), anyio.create_task_group() as tg:
            tg.start_soon(announce)
            await server.serve(sockets=[sock])
            tg.cancel_scope.cancel()
    finally:
        sock.close()
    return bool(server.started)


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="asyncsandbox serve",
        description="Serve sandboxes over HTTP (one tenant per API key).",
    )
    parser.add_argument(
        "--backend", default="process", help="backend to serve: process (default), docker, ..."
    )
    parser.add_argument(
        "--backend-option",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="backend constructor option (repeatable), e.g. root=/srv/sandboxes",
    )
    parser.add_argument(
        "--listen", default="127.0.0.1:8765", help="HOST:PORT (default 127.0.0.1:8765; port 0: any)"
    )
    parser.add_argument("--tls-cert", help="PEM certificate file (HTTPS; needs --tls-key)")
    parser.add_argument("--tls-key", help="PEM private key file")
    parser.add_argument(
        "--keys",
        help=f"API keys file: TENANT:KEY per line (also read: ${KEYS_ENV}, comma-separated)",
    )
    parser.add_argument("--lease", type=float, default=60.0, help="default lease, seconds")
    parser.add_argument("--max-lease", type=float, default=3600.0, help="longest lease, seconds")
    parser.add_argument(
        "--max-live-per-tenant", type=int, default=64, help="sandboxes per tenant (0: no limit)"
    )
    parser.add_argument(
        "--max-execs-per-tenant",
        type=int,
        default=128,
        help="concurrent commands and transfers per tenant (0: no limit)",
    )
    parser.add_argument("--max-request-bytes", type=int, default=16 * 1024 * 1024)
    parser.add_argument("--max-file-bytes", type=int, default=256 * 1024 * 1024)
    parser.add_argument("--max-upload-bytes", type=int, default=8 * 1024 * 1024 * 1024)
    parser.add_argument(
        "--allow-host-network", action="store_true", help='let tenants use network="host"'
    )
    parser.add_argument(
        "--on-shutdown",
        choices=["remove", "keep"],
        default="remove",
        help="what to do with live sandboxes on shutdown (default: remove)",
    )
    parser.add_argument(
        "--shutdown-grace",
        type=float,
        default=10.0,
        help="seconds in-flight requests get on SIGTERM before they are cancelled",
    )
    parser.add_argument(
        "--no-sweep",
        action="store_true",
        help="do not remove sandboxes of dead owners on start (keeps what a server kept)",
    )
    parser.add_argument("--max-live", type=int, default=512, help="server-wide live sandboxes")
    parser.add_argument("--max-lifecycle", type=int, default=8, help="concurrent creates/removes")
    parser.add_argument("--max-execs", type=int, default=256, help="server-wide concurrent execs")
    parser.add_argument(
        "--e2b-template",
        action="append",
        default=[],
        metavar="NAME=IMAGE",
        help="an E2B template and the image its sandboxes run (repeatable); 'base' and "
        "'code-interpreter-v1' run the backend's default image unless named",
    )
    parser.add_argument(
        "--print-url",
        action="store_true",
        help="once ready, print the base URL alone on stdout (the log line goes to stderr)",
    )
    return parser


def config_from_args(args: argparse.Namespace) -> ServerConfig:
    """A :class:`ServerConfig` from parsed command-line arguments."""
    host, sep, port = args.listen.rpartition(":")
    if not sep or not port.isdigit():
        raise SystemExit(f"--listen needs HOST:PORT, got {args.listen!r}")
    templates: dict[str, str | None] = {}
    for item in args.e2b_template:
        name, sep, image = item.partition("=")
        if not sep or not name:
            raise SystemExit(f"--e2b-template needs NAME=IMAGE, got {item!r}")
        templates[name] = image or None
    return ServerConfig(
        e2b_templates=templates,
        backend=args.backend,
        backend_options=parse_backend_options(args.backend_option),
        host=host or "127.0.0.1",
        port=int(port),
        tls_cert=args.tls_cert,
        tls_key=args.tls_key,
        lease_seconds=args.lease,
        max_lease_seconds=max(args.max_lease, args.lease),
        max_live_per_tenant=args.max_live_per_tenant or None,
        max_execs_per_tenant=args.max_execs_per_tenant or None,
        max_request_bytes=args.max_request_bytes,
        max_file_bytes=args.max_file_bytes,
        max_upload_bytes=args.max_upload_bytes or None,
        allow_host_network=args.allow_host_network,
        on_shutdown=args.on_shutdown,
        shutdown_grace=args.shutdown_grace,
        sweep=not args.no_sweep,
        limits=Limits(
            max_live=args.max_live or None,
            max_lifecycle=args.max_lifecycle,
            max_execs=args.max_execs or None,
        ),
        timeouts=Timeouts(),
    )


def _say(message: str, stream: TextIO | None = None) -> None:
    stream = stream or sys.stderr
    stream.write(message + "\n")
    stream.flush()


def main(argv: Sequence[str] | None = None, *, verbosity: int = 0) -> int:
    """``asyncsandbox serve``: parse ``argv``, serve until SIGTERM; the exit status.

    The command line's ``serve`` (an :class:`asyncsandbox.cli.Command`, registered under
    the entry-point group ``asyncsandbox.commands``)."""
    args = _parser().parse_args(argv)
    if not logging.getLogger().handlers:
        level = {0: logging.WARNING, 1: logging.INFO}.get(verbosity, logging.DEBUG)
        logging.basicConfig(level=level, stream=sys.stderr, format="%(name)s: %(message)s")
    try:
        config = config_from_args(args)
        tenants = load_tenants(args.keys)
    except (SandboxError, msgspec.ValidationError, OSError) as exc:
        _say(f"asyncsandbox serve: {exc}")
        return 2
    if not tenants:
        _say(
            f"asyncsandbox serve: no API keys: pass --keys FILE or set {KEYS_ENV} "
            "(TENANT:KEY entries)"
        )
        return 2
    stop_signal: list[int] = []
    # uvicorn re-raises the signal that stopped it once it is done; take it as a clean exit.
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda signum, frame: stop_signal.append(signum))

    def ready(url: str) -> None:
        _say(
            f"asyncsandbox serve: listening on {url} (backend {config.backend}, "
            f"{len({t.name for t in tenants})} tenant(s))"
        )
        if args.print_url:  # alone on stdout, for scripts: URL=$(... --print-url | head -1)
            _say(url, sys.stdout)

    try:
        started = anyio.run(
            functools.partial(serve, config, tenants, ready=ready), backend="asyncio"
        )
    except SandboxError as exc:
        _say(f"asyncsandbox serve: {type(exc).__name__}: {exc}")
        return 2
    except OSError as exc:
        _say(f"asyncsandbox serve: cannot listen on {args.listen}: {exc}")
        return 2
    return 0 if started else 1
