"""What a case's fork becomes: the program (a Python program run in the fork, or a
command executed), with the exit statuses ``python3`` and a shell would give.

Shipped into the sandbox as source with the judge's runner (:mod:`._runner`, which runs
it in each case's fork) and run on the sandbox's own ``python3`` (3.8 or newer, standard
library only).
"""

from __future__ import annotations

import os
import resource
import sys
import types

TYPE_CHECKING = False
if TYPE_CHECKING:
    import signal
    from typing import Any, NoReturn
else:
    import _signal as signal  # signal's C module: the calls, without the enums' import


class Program:
    """What each case runs: a compiled Python program (fork mode) or an argv (exec)."""

    def __init__(self, request: dict[str, Any]) -> None:
        self.argv: list[str] | None = request.get("argv")
        self.path: str = request.get("program") or ""
        self.code: types.CodeType | None = None
        self.error: BaseException | None = None
        if self.argv is None:
            with open(self.path, "rb") as file:
                source = file.read()
            try:
                self.code = compile(source, os.path.abspath(self.path), "exec", dont_inherit=True)
            except (SyntaxError, ValueError) as exc:
                self.error = exc.with_traceback(None)  # raised in each case, as python3 would

    def become(self, memory_kb: int | None) -> NoReturn:
        """Become the program, in the case's fork (never returns)."""
        if memory_kb is not None:
            try:
                limit = memory_kb * 1024
                resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
            except (OSError, ValueError) as exc:
                os.write(2, ("cannot limit memory: %s\n" % exc).encode())
                os._exit(125)
        if self.argv is not None:
            execute(self.argv)
        run_python(self.path, self.code, self.error)


def execute(argv: list[str]) -> NoReturn:
    """``execvp``, with the exit statuses of a shell for a program that cannot run."""
    try:
        os.execvp(argv[0], argv)
    except FileNotFoundError:
        os.write(2, ("%s: not found\n" % argv[0]).encode(errors="replace"))
        os._exit(127)
    except OSError as exc:
        os.write(2, ("%s: %s\n" % (argv[0], exc.strerror)).encode(errors="replace"))
        os._exit(126)


def run_python(path: str, code: types.CodeType | None, error: BaseException | None) -> NoReturn:
    """Become ``python3 PATH`` for one case."""
    status = 1
    try:
        main = types.ModuleType("__main__")
        main.__file__ = os.path.abspath(path)
        sys.modules["__main__"] = main
        sys.argv = [path]
        sys.path[0] = os.path.dirname(os.path.abspath(path))
        try:
            if error is not None:
                raise error
            exec(code, main.__dict__)  # type: ignore[arg-type] # code is None only with error
            status = 0
        except SystemExit as exc:
            status = exit_status(exc.code)
        except KeyboardInterrupt as exc:
            report_uncaught(exc)
            status = 128 + signal.SIGINT
        except BaseException as exc:  # noqa: BLE001 - what the interpreter does with it
            report_uncaught(exc)
            status = 1
        threading = sys.modules.get("threading")
        if threading is not None:
            threading._shutdown()  # as the interpreter does
        import atexit

        atexit._run_exitfuncs()
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except BaseException:  # noqa: BLE001 - as the interpreter: status 120
                status = 120
    finally:
        os._exit(status)


def report_uncaught(exc: BaseException) -> None:
    if exc.__traceback__ is not None:  # from the program's frame on, not ours
        exc.__traceback__ = exc.__traceback__.tb_next
    sys.excepthook(type(exc), exc, exc.__traceback__)


def exit_status(code: object) -> int:
    if code is None:
        return 0
    if isinstance(code, int):
        return code & 0xFF
    try:
        sys.stderr.write("%s\n" % (code,))
    except BaseException:  # noqa: BLE001, S110 - as the interpreter: the status is 1 anyway
        pass
    return 1
