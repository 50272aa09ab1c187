"""``asyncsandbox mcp``: the command line."""

from __future__ import annotations

import argparse
import functools
import logging
import signal
import sys
from collections.abc import Sequence
from typing import TYPE_CHECKING

import anyio
import msgspec

from asyncsandbox import SandboxDefaults, SandboxError, Session
from asyncsandbox.cli import parse_backend_options

from ._config import MCP_TOOL_NAMES, McpConfig
from ._stdio import serve_stdio

if TYPE_CHECKING:
    from asyncsandbox_remote.server import Tenant

__all__ = ("main",)


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="asyncsandbox mcp",
        description=(
            "An MCP server: each session gets its own sandbox and the tools "
            f"{', '.join(MCP_TOOL_NAMES)} (some on request)."
        ),
    )
    parser.add_argument(
        "--transport",
        choices=["stdio", "streamable-http"],
        default="stdio",
        help="stdio (default: one client, the process that started us) or streamable-http",
    )
    parser.add_argument(
        "--listen",
        default="127.0.0.1:8766",
        help="streamable-http: HOST:PORT (default 127.0.0.1:8766; port 0: any); the endpoint "
        "is /mcp",
    )
    parser.add_argument(
        "--keys",
        help="streamable-http: API keys file, TENANT:KEY per line (also read: "
        "$ASYNCSANDBOX_API_KEYS, comma-separated), sent as 'Authorization: Bearer KEY'; "
        "required unless listening on loopback",
    )
    parser.add_argument("--print-url", action="store_true", help="print the endpoint on stdout")
    parser.add_argument("--backend", default="process", help="backend name (default: process)")
    parser.add_argument(
        "--backend-option",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="backend constructor option (repeatable), e.g. root=/tmp/sandboxes",
    )
    parser.add_argument("--image", help="image (docker) or root filesystem directory (process)")
    parser.add_argument(
        "--tool",
        action="append",
        choices=MCP_TOOL_NAMES,
        help="offer this tool (repeatable; default: bash, read_file, write_file, "
        "str_replace_editor, run_code)",
    )
    defaults = McpConfig()
    parser.add_argument(
        "--bash-timeout",
        type=float,
        default=defaults.bash_timeout,
        help=f"seconds a command may run when the call says nothing (default "
        f"{defaults.bash_timeout:g})",
    )
    parser.add_argument(
        "--max-bash-timeout",
        type=float,
        default=defaults.max_bash_timeout,
        help=f"the longest timeout a call may ask for (default {defaults.max_bash_timeout:g})",
    )
    parser.add_argument(
        "--max-sessions",
        type=int,
        default=defaults.max_sessions,
        help=f"sessions (sandboxes) at once (default {defaults.max_sessions})",
    )
    parser.add_argument(
        "--idle-timeout",
        type=float,
        default=defaults.idle_timeout,
        help="streamable-http: seconds after which an idle session ends and its sandbox is "
        f"removed; 0: never (default {defaults.idle_timeout:g})",
    )
    return parser


def _say(message: str) -> None:
    sys.stderr.write(message + "\n")
    sys.stderr.flush()


async def _stdio(session: Session, config: McpConfig) -> None:
    async with session, anyio.create_task_group() as tg:

        async def stop_on_signal() -> None:
            with anyio.open_signal_receiver(signal.SIGTERM, signal.SIGINT) as signals:
                async for _ in signals:
                    tg.cancel_scope.cancel()
                    return

        tg.start_soon(stop_on_signal)
        await serve_stdio(session, config)
        tg.cancel_scope.cancel()


async def _http(
    session: Session,
    config: McpConfig,
    host: str,
    port: int,
    tenants: Sequence[Tenant] | None,
    print_url: bool,
) -> bool:
    def ready(url: str) -> None:
        auth = "Bearer keys" if tenants is not None else "no authentication (loopback)"
        _say(f"asyncsandbox mcp: listening on {url} ({auth}, backend {session.backend.name})")
        if print_url:  # alone on stdout, for scripts
            sys.stdout.write(url + "\n")
            sys.stdout.flush()

    from ._http import serve_http  # (not imported for stdio: see the package's __getattr__)

    async with session:
        return await serve_http(session, config, host=host, port=port, tenants=tenants, ready=ready)


def main(argv: Sequence[str] | None = None, *, verbosity: int = 0) -> int:
    """``asyncsandbox mcp``: parse ``argv``, serve until the client leaves (stdio) or
    SIGTERM; the exit status.

    The command line's ``mcp`` (an :class:`asyncsandbox.cli.Command`, registered under the
    entry-point group ``asyncsandbox.commands``)."""
    args = _parser().parse_args(argv)
    if not logging.getLogger().handlers:
        # stderr: on stdio, stdout is the protocol's.
        level = {0: logging.WARNING, 1: logging.INFO}.get(verbosity, logging.DEBUG)
        logging.basicConfig(level=level, stream=sys.stderr, format="%(name)s: %(message)s")
    try:
        config = McpConfig(
            tools=tuple(args.tool) if args.tool else None,
            bash_timeout=args.bash_timeout,
            max_bash_timeout=args.max_bash_timeout,
            max_sessions=args.max_sessions,
            idle_timeout=args.idle_timeout or None,
        )
        defaults = SandboxDefaults(image=args.image) if args.image else None
        session = Session(
            args.backend,
            backend_options=parse_backend_options(args.backend_option),
            defaults=defaults,
        )
    except (SandboxError, msgspec.ValidationError) as exc:
        _say(f"asyncsandbox mcp: {exc}")
        return 2
    try:
        if args.transport == "stdio":
            anyio.run(_stdio, session, config)
            return 0
        host, sep, port = args.listen.rpartition(":")
        if not sep or not port.isdigit():
            _say(f"asyncsandbox mcp: --listen needs HOST:PORT, got {args.listen!r}")
            return 2
        host = host or "127.0.0.1"
        from asyncsandbox_remote.server import load_tenants

        from ._http import is_loopback

        tenants: Sequence[Tenant] | None = load_tenants(args.keys) or None
        if tenants is None and not is_loopback(host):
            _say(
                f"asyncsandbox mcp: listening on {host} (not loopback) needs API keys: pass "
                "--keys FILE or set $ASYNCSANDBOX_API_KEYS (TENANT:KEY entries)"
            )
            return 2
        stop_signal: list[int] = []
        # uvicorn re-raises the signal that stopped it once it is done: a clean exit.
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, lambda signum, frame: stop_signal.append(signum))
        started = anyio.run(
            functools.partial(_http, session, config, host, int(port), tenants, args.print_url)
        )
        return 0 if started else 1
    except SandboxError as exc:
        _say(f"asyncsandbox mcp: {type(exc).__name__}: {exc}")
        return 2
    except OSError as exc:
        _say(f"asyncsandbox mcp: {exc}")
        return 2
