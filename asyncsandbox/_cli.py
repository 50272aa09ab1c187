"""The ``asyncsandbox`` command line."""

from __future__ import annotations

import argparse
import logging
import os
import sys
import time
from collections.abc import Awaitable, Callable, Sequence
from typing import TYPE_CHECKING, Any

import anyio

from ._config import SandboxDefaults
from ._errors import ExecTimeout, SandboxError
from ._models import SandboxInfo
from ._owner import garbage_reason
from ._registry import available_backends, create_backend
from ._session import Session
from .abc import BackendCapabilities
from .cli import COMMAND_GROUP, Command, parse_backend_options

if TYPE_CHECKING:
    from importlib.metadata import EntryPoint


def _configure_logging(verbosity: int) -> None:
    # The CLI is an application, so it may configure structlog (the library never does).
    # Imported here, when a command runs: importing structlog costs a third of a second.
    import structlog

    level = {0: logging.WARNING, 1: logging.INFO}.get(verbosity, logging.DEBUG)
    structlog.configure(
        wrapper_class=structlog.make_filtering_bound_logger(level),
        logger_factory=structlog.PrintLoggerFactory(sys.stderr),
        cache_logger_on_first_use=False,
    )


def _session(args: argparse.Namespace, **defaults: Any) -> Session:
    return Session(
        args.backend,
        backend_options=parse_backend_options(args.backend_option),
        defaults=SandboxDefaults(**defaults),
        sweep=False,
    )


def _print_infos(infos: list[SandboxInfo], as_json: bool) -> None:
    if as_json:
        import msgspec

        print(msgspec.json.encode(infos).decode())
        return
    if not infos:
        print("no sandboxes")
        return
    print(f"{'ID':<20} {'STATUS':<9} {'AGE':>8}  TAGS")
    now = time.time()
    for info in infos:
        age = "" if info.created_at is None else f"{now - info.created_at:7.0f}s"
        line = f"{info.id:<20} {info.status.value:<9} {age:>8}  {','.join(info.tags)}"
        reason = garbage_reason(info.labels)
        if reason is not None:
            line += f"  ({reason}: `asyncsandbox gc` removes it)"
        print(line.rstrip())


async def _cmd_demo(args: argparse.Namespace) -> int:
    from .demo import run_demo

    return await run_demo(
        args.backend,
        timeout=args.timeout,
        backend_options=parse_backend_options(args.backend_option),
    )


async def _cmd_exec(args: argparse.Namespace) -> int:
    if not args.argv:
        raise SystemExit("exec needs a command, e.g.: asyncsandbox exec -- python3 -c 'print(1)'")
    stdin = sys.stdin.buffer.read() if args.stdin else None
    defaults: dict[str, Any] = {"tags": tuple(args.tag)}
    if args.image:
        defaults["image"] = args.image
    async with _session(args, **defaults) as session:
        try:
            result = await session.run(args.argv, stdin=stdin, timeout=args.timeout)
        except ExecTimeout as exc:
            result = exc.result
            print(f"asyncsandbox: timed out after {args.timeout}s", file=sys.stderr)
    sys.stdout.buffer.write(result.stdout)
    sys.stderr.buffer.write(result.stderr)
    if result.truncated:
        print("asyncsandbox: output was truncated (kept head and tail)", file=sys.stderr)
    return result.returncode


async def _cmd_ls(args: argparse.Namespace) -> int:
    async with _session(args) as session:
        infos = await session.list(tags=args.tag, status=args.status or None)
    _print_infos(infos, args.json)
    return 0


async def _cmd_rm(args: argparse.Namespace) -> int:
    if not args.ids and not args.tag:
        raise SystemExit("rm needs sandbox ids or --tag (refusing to remove everything)")
    async with _session(args) as session:
        known = {i.id for i in await session.list()} if args.ids else set()
        missing = [i for i in args.ids if i not in known]
        present = [i for i in args.ids if i in known]
        removed = []
        if present or args.tag:
            removed = await session.delete(ids=present, tags=args.tag, status=args.status or None)
    for sandbox_id in removed:
        print(f"removed {sandbox_id}")
    for sandbox_id in missing:
        print(f"not found: {sandbox_id}", file=sys.stderr)
    return 1 if missing else 0


async def _cmd_gc(args: argparse.Namespace) -> int:
    async with _session(args) as session:
        garbage = await session.gc(dry_run=args.dry_run)
    verb = "would remove" if args.dry_run else "removed"
    for info, reason in garbage:
        print(f"{verb} {info.id} ({reason})")
    if not garbage:
        print("nothing to collect")
    return 0


async def _cmd_backends(args: argparse.Namespace) -> int:
    probe = _Probe(args.timeout)
    for name in sorted(available_backends()):
        caps, why = await probe.capabilities(name)
        if caps is None:
            detail = f"unavailable: {why}"
        else:
            owner = "root" if os.geteuid() == 0 else f"uid {os.geteuid()}"
            detail = (
                f"{caps.isolation}; limits enforced for this owner ({owner}): "
                f"{', '.join(sorted(caps.enforced_limits)) or 'none'}"
            )
            if caps.limits_note:
                then = (
                    "run without them (best-effort)" if caps.best_effort_limits else ("are refused")
                )
                detail += f"; sandboxes asking for others {then}: {caps.limits_note}"
        print(f"{name:<8} {detail}")
        if name == "process":
            print("         isolation mechanisms here (backend_options={'isolation': NAME}):")
            for mode in ("bwrap", "native", "gvisor"):
                caps, why = await probe.capabilities("process", {"isolation": mode})
                print(f"           {mode:<7} {_availability(caps, why)}")
            print(
                "           (gvisor only when asked for by name: a kernel of its own per sandbox)"
            )
            print("           none    only when asked for by name: no isolation at all")
        if name == "docker" and caps is not None:
            caps, why = await probe.capabilities("docker", {"runtime": "runsc"})
            print("         gVisor runtime (backend_options={'runtime': 'runsc'}):")
            print(f"           runsc   {_availability(caps, why)}")
    return 0


class _Probe:
    """Enters a backend to read its capabilities, within ``timeout`` seconds: a backend
    that cannot tell by then (a cluster that does not answer) is listed as unavailable,
    and the listing goes on."""

    def __init__(self, timeout: float) -> None:
        self.timeout = timeout

    async def capabilities(
        self, name: str, options: dict[str, Any] | None = None
    ) -> tuple[BackendCapabilities | None, str]:
        try:
            with anyio.fail_after(self.timeout):
                async with create_backend(name, options) as backend:
                    return backend.capabilities, ""
        except TimeoutError:
            return None, f"no answer within {self.timeout:g} s (--timeout)"
        except SandboxError as exc:
            return None, str(exc)


def _availability(caps: BackendCapabilities | None, why: str) -> str:
    return f"unavailable: {why}" if caps is None else f"available: {caps.isolation}"


COMMANDS: dict[str, Callable[[argparse.Namespace], Awaitable[int]]] = {
    "demo": _cmd_demo,
    "exec": _cmd_exec,
    "ls": _cmd_ls,
    "rm": _cmd_rm,
    "gc": _cmd_gc,
    "backends": _cmd_backends,
}

# Commands of our own plugins, by name: what they do, what they need, and what installs
# it. Named here only so that `asyncsandbox --help` lists them and running one that is not
# installed says what to install; the command itself comes from the plugin's entry point
# (asyncsandbox.cli), as any third-party command does.
PLUGIN_COMMANDS: dict[str, tuple[str, str, str]] = {
    "serve": (
        "serve sandboxes over HTTP to remote clients",
        "the remote backend",
        "asyncsandbox[remote]",
    ),
    "mcp": (
        "an MCP server: a sandbox per MCP session (stdio or streamable HTTP)",
        "the MCP server",
        "asyncsandbox[mcp]",
    ),
}


def _plugin_commands() -> dict[str, EntryPoint]:
    """The commands plugins add (entry-point group ``asyncsandbox.commands``), by name;
    a built-in command's name cannot be taken."""
    from importlib.metadata import entry_points  # not at import: it costs ~20 ms

    return {ep.name: ep for ep in entry_points(group=COMMAND_GROUP) if ep.name not in COMMANDS}


def _run_plugin_command(
    name: str, found: EntryPoint | None, argv: list[str], verbosity: int
) -> int:
    if found is None:
        _, needs, install = PLUGIN_COMMANDS[name]
        print(f"asyncsandbox {name} needs {needs}: pip install '{install}'", file=sys.stderr)
        return 2
    command: Command = found.load()
    return command(argv, verbosity=verbosity)


class _Version(argparse.Action):
    """``--version``: asyncsandbox's version, then each installed distribution of ours (the
    plugins, found by name only when asked: listing distributions costs tens of ms)."""

    def __init__(self, option_strings: Sequence[str], dest: str, help: str | None = None):
        super().__init__(option_strings, dest, nargs=0, default=argparse.SUPPRESS, help=help)

    def __call__(self, parser: argparse.ArgumentParser, *args: object) -> None:
        from importlib.metadata import distributions

        from ._version import __version__

        lines = [f"asyncsandbox {__version__}"]
        plugins = {
            dist.metadata["Name"]: dist.version
            for dist in distributions()
            if (dist.metadata["Name"] or "").startswith("asyncsandbox-")
        }
        lines += [f"{name} {version}" for name, version in sorted(plugins.items())]
        print("\n".join(lines))  # on stdout, as argparse's own version action does
        parser.exit()


def _parser(plugins: dict[str, EntryPoint]) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="asyncsandbox", description="Run untrusted code in isolated sandboxes."
    )
    parser.add_argument("-v", "--verbose", action="count", default=0, help="log more (-vv: debug)")
    parser.add_argument(
        "--version", action=_Version, help="print the versions of asyncsandbox and its plugins"
    )
    parser.add_argument("--async-library", choices=["asyncio", "trio"], default="asyncio")
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--backend", default="process", help="backend name (default: process)")
    common.add_argument(
        "--backend-option",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="backend constructor option (repeatable), e.g. root=/tmp/sandboxes",
    )
    sub = parser.add_subparsers(dest="command", required=True)

    demo = sub.add_parser(
        "demo", parents=[common], help="score model-written programs in parallel sandboxes"
    )
    demo.add_argument("--timeout", type=float, default=3.0, help="seconds per program (default 3)")

    exe = sub.add_parser("exec", parents=[common], help="run one command in a fresh sandbox")
    exe.add_argument("--image", help="image (docker) or root filesystem directory (process)")
    exe.add_argument("--timeout", type=float, default=None, help="command timeout in seconds")
    exe.add_argument("--tag", action="append", default=[], help="tag the sandbox (repeatable)")
    exe.add_argument("--stdin", action="store_true", help="pass our stdin to the command")
    exe.add_argument("argv", nargs=argparse.REMAINDER, help="the command, after --")

    ls = sub.add_parser("ls", parents=[common], help="list sandboxes (of any session)")
    ls.add_argument(
        "--tag", action="append", default=[], help="only with this tag (repeatable: all)"
    )
    ls.add_argument(
        "--status", action="append", default=[], help="only in this status (repeatable)"
    )
    ls.add_argument("--json", action="store_true", help="print JSON")

    rm = sub.add_parser("rm", parents=[common], help="remove sandboxes by id or by tag")
    rm.add_argument("ids", nargs="*", help="sandbox ids")
    rm.add_argument(
        "--tag", action="append", default=[], help="remove all with this tag (repeatable: all)"
    )
    rm.add_argument("--status", action="append", default=[], help="only in this status")

    gc = sub.add_parser(
        "gc", parents=[common], help="remove sandboxes of dead owners or past their lifetime"
    )
    gc.add_argument("--dry-run", action="store_true", help="only show what would be removed")

    backends = sub.add_parser("backends", help="list backends and what they can do")
    backends.add_argument(
        "--timeout",
        type=float,
        default=15.0,
        help="seconds each backend may take to say what it can do (default 15)",
    )
    for name in sorted(PLUGIN_COMMANDS.keys() | plugins.keys()):
        if name in PLUGIN_COMMANDS:
            does, _, install = PLUGIN_COMMANDS[name]
            summary = f"{does} (needs {install})"
        else:
            dist = plugins[name].dist
            summary = f"added by {dist.name if dist is not None else plugins[name].value}"
        # The command parses its own options: `asyncsandbox NAME --help` lists them.
        sub.add_parser(name, add_help=False, help=summary)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    plugins = _plugin_commands()
    parser = _parser(plugins)
    args, extra = parser.parse_known_args(argv)
    if args.command not in COMMANDS:  # a plugin's: it parses what follows its name
        _configure_logging(args.verbose)
        return _run_plugin_command(args.command, plugins.get(args.command), extra, args.verbose)
    if extra:
        parser.error(f"unrecognized arguments: {' '.join(extra)}")
    if args.command == "exec" and args.argv[:1] == ["--"]:
        args.argv = args.argv[1:]
    _configure_logging(args.verbose)
    try:
        return anyio.run(COMMANDS[args.command], args, backend=args.async_library)
    except SandboxError as exc:
        print(f"asyncsandbox: {type(exc).__name__}: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
