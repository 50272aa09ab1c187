"""What a kernel (:mod:`._kernel`) hooks into the code's Python: IPython's shell lines
(``!cmd``, ``x = !cmd``) and hooks run on a module right after its first import (the
code's own ``plt.show`` and ``IPython.display.display`` become the kernel's). Shipped with
the runner (see :data:`._engine.RUNNER`).
"""

from __future__ import annotations

import os
import sys

TYPE_CHECKING = False  # not typing's: nothing is imported that the runner does not use
if TYPE_CHECKING:
    from collections.abc import Callable
    from typing import Any

    from asyncsandbox._interpreter import _common as common  # shipped before this file (see RUNNER)

SHELL = "__asyncsandbox_shell__"
SHELL_LINE = (
    r"^([ \t]*)(?:([A-Za-z_][\w.]*(?:[ \t]*,[ \t]*[A-Za-z_][\w.]*)*)[ \t]*=[ \t]*)?"
    r"!(!?)(.*?)(\r?\n)?$"
)


def shell_lines(source: str) -> str | None:
    """The cell with each IPython shell line as a call of the kernel's :class:`Shell`
    (``!cmd``: run it; ``x = !cmd`` and ``!!cmd``: its output's lines), one line for one
    (the traceback's line numbers stay); ``None`` when it has none."""
    import re

    pattern = re.compile(SHELL_LINE)
    lines = source.splitlines(True)
    changed = False
    for i, line in enumerate(lines):
        match = pattern.match(line)
        if match is None or not match.group(4).strip():
            continue
        indent, target, output, command, end = match.groups()
        call = "%s.%s(%r)" % (SHELL, "getoutput" if target or output else "system", command)
        lines[i] = indent + ("%s = %s" % (target, call) if target else call) + (end or "")
        changed = True
    return "".join(lines) if changed else None


class Shell:
    """IPython's shell lines: the command runs in ``/bin/bash`` (else ``/bin/sh``) in the
    context's directory, its stdout and stderr merged (as IPython's), after ``{expr}`` and
    ``$name`` are expanded from the code's namespace (the command as written when one
    does not expand, as IPython's ``var_expand``). An interrupt kills its process group."""

    def __init__(self, namespace: dict[str, Any], flush: Callable[[], None]) -> None:
        self.namespace = namespace  # the code's
        self.flush = flush  # the kernel's streams, before the command writes

    def system(self, command: str) -> None:
        """``!cmd``: its output is the cell's; its status is ``_exit_code``."""
        self.namespace["_exit_code"] = self.run(command, None)

    def getoutput(self, command: str) -> list[str]:
        """``x = !cmd``: its output's lines."""
        sink: list[str] = []
        self.run(command, sink)
        return "".join(sink).splitlines()

    def expand(self, command: str) -> str:
        import re

        namespace = self.namespace

        def one(match: Any) -> str:
            if match.group(0) == "$$":
                return "$"
            if match.group(1) is not None:
                return str(namespace[match.group(1)])
            return str(eval(match.group(2), namespace))  # as IPython's: the code's own

        try:
            return re.sub(r"\$\$|\$([A-Za-z_]\w*)|\{([^{}]+)\}", one, command)
        except Exception:  # noqa: BLE001 - as IPython: the command as written
            return command

    def run(self, command: str, sink: list[str] | None) -> int:
        import codecs
        import subprocess

        shell = "/bin/bash" if os.path.exists("/bin/bash") else "/bin/sh"
        self.flush()
        process = subprocess.Popen(
            [shell, "-c", self.expand(command)],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        decoder = codecs.getincrementaldecoder("utf-8")("replace")
        assert process.stdout is not None
        try:
            while True:
                data = os.read(process.stdout.fileno(), common.CHUNK)
                text = decoder.decode(data, final=not data)
                if sink is not None:
                    sink.append(text)
                elif text:
                    sys.stdout.write(text)
                    sys.stdout.flush()
                if not data:
                    return process.wait()
        except BaseException:
            common.kill(-process.pid)  # interrupted: the command's whole group goes
            process.wait()
            raise
        finally:
            process.stdout.close()


class PostImport:
    """Runs a hook on a module right after it is first imported (so that the code's own
    ``plt.show`` and ``IPython.display.display`` are ours)."""

    def __init__(self, hooks: dict[str, Callable[[Any], None]]) -> None:
        self.hooks = hooks

    def find_spec(self, name: str, path: Any = None, target: Any = None) -> Any:
        hook = self.hooks.get(name)
        if hook is None:
            return None
        for finder in sys.meta_path:
            find = getattr(finder, "find_spec", None)
            if finder is self or find is None:
                continue
            spec = find(name, path, target)
            if spec is not None:
                break
        else:
            return None
        loader = spec.loader
        execute = getattr(loader, "exec_module", None)
        if execute is None:
            return spec

        def exec_module(module: Any) -> None:
            execute(module)
            try:
                hook(module)
            except Exception:  # noqa: BLE001, S110 - the module works without our hook
                pass

        loader.exec_module = exec_module
        return spec
