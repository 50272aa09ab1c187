"""How the library logs: silent below warning until the application configures structlog,
warnings on stderr, every event once configured; importing it imports no structlog. Each
case runs in a fresh interpreter, as an application would (structlog's configuration is
global to a process)."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap


def python(code: str) -> subprocess.CompletedProcess[bytes]:
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)], capture_output=True, timeout=60, check=False
    )


def test_importing_asyncsandbox_imports_no_structlog() -> None:
    """structlog (and through it rich and pygments: a third of a second) is imported when
    an event is emitted, not when asyncsandbox or a plugin is imported."""
    done = python(
        """
        import sys
        import asyncsandbox, asyncsandbox.sync, asyncsandbox.abc, asyncsandbox.log
        import asyncsandbox.testing, asyncsandbox.tools, asyncsandbox_docker
        print(sorted(m for m in ("structlog", "rich", "pygments") if m in sys.modules))
        # httpx imports rich for its own command line when that is installed: only structlog
        import asyncsandbox_remote, asyncsandbox_remote.server, asyncsandbox_e2b
        print("structlog" in sys.modules)
        """
    )
    assert done.returncode == 0, done.stderr.decode()
    assert done.stdout == b"[]\nFalse\n"


SESSION = """
    import anyio
    from asyncsandbox import RetryPolicy, Session
    from asyncsandbox.log import get_logger
    from asyncsandbox.testing import FakeBackend

    async def main():
        # create_failures=1: one retried create, logged as a warning (backend.retry)
        retries = RetryPolicy(attempts=2, backoff=0.001)
        async with Session(FakeBackend(create_failures=1), retries=retries, sweep=False) as s:
            async with s.sandbox() as sb:
                await sb.exec(["echo", "hello"])
        for name in ("asyncsandbox.docker", "asyncsandbox.remote"):  # the plugins' loggers
            get_logger(name).debug(name + ".debug")
            get_logger(name).info(name + ".info")
        print("done")

    anyio.run(main)
"""


def test_the_library_is_silent_below_warning_until_configured() -> None:
    """Unconfigured structlog prints every event on stdout; the library's debug and info
    events must not reach the application's output, and its warnings go to stderr."""
    done = python(SESSION)
    assert done.returncode == 0, done.stderr.decode()
    assert done.stdout == b"done\n"
    stderr = done.stderr.decode()
    assert "backend.retry" in stderr
    assert "session.opened" not in stderr
    assert ".debug" not in stderr
    assert ".info" not in stderr


def test_a_configured_structlog_gets_every_event() -> None:
    """Once the application configures structlog, its settings rule: the core's and the
    plugins' debug events arrive, with their bound context."""
    configure = """
        import sys, structlog
        structlog.configure(
            processors=[structlog.processors.add_log_level, structlog.processors.JSONRenderer()],
            logger_factory=structlog.PrintLoggerFactory(sys.stderr),
        )
    """
    done = python(textwrap.dedent(configure) + textwrap.dedent(SESSION))
    assert done.returncode == 0, done.stderr.decode()
    assert done.stdout == b"done\n"
    events = [json.loads(line) for line in done.stderr.decode().splitlines()]
    names = [e["event"] for e in events]
    for name in (
        "session.opened",
        "backend.retry",
        "sandbox.exec.finished",
        "asyncsandbox.docker.debug",
        "asyncsandbox.remote.info",
    ):
        assert name in names, names
    finished = next(e for e in events if e["event"] == "sandbox.exec.finished")
    assert finished["level"] == "debug"
    assert finished["sandbox_id"].startswith("f-")
    assert finished["backend"] == "fake"


def test_configuring_structlog_later_takes_effect() -> None:
    """A logger obtained before the application configured structlog (the plugins' are
    made at import) follows the configuration made later."""
    done = python(
        """
        import sys
        from asyncsandbox.log import get_logger
        log = get_logger("asyncsandbox.docker", sandbox_id="x")
        log.debug("before")
        import structlog
        structlog.configure(
            processors=[structlog.processors.JSONRenderer()],
            logger_factory=structlog.PrintLoggerFactory(sys.stdout),
        )
        log.debug("after")
        log.bind(command="true").info("bound")
        """
    )
    assert done.returncode == 0, done.stderr.decode()
    events = [json.loads(line) for line in done.stdout.decode().splitlines()]
    assert events == [
        {"sandbox_id": "x", "event": "after"},
        {"sandbox_id": "x", "command": "true", "event": "bound"},
    ]
