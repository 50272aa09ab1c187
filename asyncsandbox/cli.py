"""The ``asyncsandbox`` command line, for plugins that add commands to it.

A distribution adds a command by registering a :class:`Command` under the entry-point
group ``asyncsandbox.commands`` (:data:`COMMAND_GROUP`). The remote backend's
distribution adds ``serve`` this way::

    [project.entry-points."asyncsandbox.commands"]
    serve = "asyncsandbox_remote.server:main"

``asyncsandbox [-v ...] NAME ARGS ...`` then loads it and exits with
``main(ARGS, verbosity=V)``, ``V`` being the number of ``-v`` given (structlog is
configured for it by then). The command parses its own arguments, ``--help`` included.
``asyncsandbox --help`` lists the commands that plugins add; the names of the built-in
commands cannot be taken. The core never imports a plugin: it only reads entry points.

Commands that take a backend accept ``--backend NAME`` and repeated
``--backend-option KEY=VALUE``, parsed by :func:`parse_backend_options` as the built-in
commands parse them.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from typing import Any, Protocol

__all__ = ("COMMAND_GROUP", "Command", "parse_backend_options")

COMMAND_GROUP = "asyncsandbox.commands"
"""The entry-point group of commands added by plugins (``name = "module:callable"``)."""


class Command(Protocol):
    """What a plugin registers under :data:`COMMAND_GROUP`: the command's ``main``."""

    def __call__(self, argv: Sequence[str], *, verbosity: int) -> int:
        """Run the command with the arguments that follow its name; return the exit status.

        :param verbosity: how many ``-v`` were given before the command's name.
        """
        ...


def parse_backend_options(pairs: Iterable[str]) -> dict[str, Any]:
    """``--backend-option KEY=VALUE`` pairs as keyword arguments for
    :func:`asyncsandbox.create_backend`: a value that is JSON (a number, ``true``,
    ``false``, ``null``, a quoted string, a list or an object) is decoded, anything else is
    kept as the string given. A later pair overrides an earlier one with the same key.

    Meant for command lines: a pair without ``=`` or without a key exits with a usage
    message (``SystemExit``), as argparse does for malformed arguments.
    """
    options: dict[str, Any] = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key:
            raise SystemExit(f"--backend-option needs KEY=VALUE, got {pair!r}")
        try:
            options[key] = json.loads(value)
        except ValueError:
            options[key] = value
    return options
