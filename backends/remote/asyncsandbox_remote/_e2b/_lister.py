"""envd's file descriptions and file metadata, inside an E2B sandbox of ``asyncsandbox
serve``.

Runs in the sandbox as ``python3 -I -S -c <this file> MODE ...`` (stdlib only, Python >=
3.6; never imported by the server), so a path names nothing outside the sandbox:

``list PATH DEPTH USER``
    Describe PATH (DEPTH 0) or what it holds down to DEPTH levels (symlinks are not
    followed into). Each entry is a record of NUL-terminated fields: type and target type
    (``find -printf %y %Y`` letters), size, permission bits (octal), ``ls`` permissions,
    owner, group (USER for the sandbox's own user and group), modification time, link
    target, metadata (JSON: the ``user.e2b.*`` extended attributes, prefix stripped),
    path. Exit 2: no such path; 3: not a directory.

``tag PATH JSON``
    Replace the ``user.e2b.*`` extended attributes of PATH by those of the JSON object.
"""

import json
import os
import stat
import sys

# Annotations stay unevaluated strings (Python 3.6 has no dict[str, str]); typing is never
# imported at run time.
TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Dict, List, Tuple

PREFIX = "user.e2b."
TYPES = (
    (stat.S_ISDIR, "d"),
    (stat.S_ISREG, "f"),
    (stat.S_ISLNK, "l"),
    (stat.S_ISFIFO, "p"),
    (stat.S_ISSOCK, "s"),
    (stat.S_ISCHR, "c"),
    (stat.S_ISBLK, "b"),
)
NAMES: "Dict[Tuple[int, bool], str]" = {}


def kind(mode: int) -> str:
    for test, letter in TYPES:
        if test(mode):
            return letter
    return "U"


def name(number: int, user: str, group: bool) -> str:
    mine = os.getgid() if group else os.getuid()
    if number == mine:
        return user
    key = (number, group)
    if key not in NAMES:
        try:
            if group:
                import grp

                NAMES[key] = grp.getgrgid(number).gr_name
            else:
                import pwd

                NAMES[key] = pwd.getpwuid(number).pw_name
        except (KeyError, ImportError):
            NAMES[key] = str(number)
    return NAMES[key]


def metadata(path: str) -> "Dict[str, str]":
    found: "Dict[str, str]" = {}
    try:
        keys = os.listxattr(path, follow_symlinks=False)
    except OSError:
        return found
    for key in keys:
        if key.startswith(PREFIX):
            try:
                value = os.getxattr(path, key, follow_symlinks=False)
            except OSError:
                continue
            found[key[len(PREFIX) :]] = value.decode("utf-8", "replace")
    return found


def describe(path: str, user: str, out: "List[bytes]") -> None:
    try:
        st = os.lstat(path)
    except OSError:
        return  # (gone while it was listed)
    letter = kind(st.st_mode)
    target = letter
    link = ""
    if letter == "l":
        try:
            link = os.readlink(path)
            target = kind(os.stat(path).st_mode)
        except OSError:
            target = "N"
    fields = (
        letter,
        target,
        str(st.st_size),
        "%o" % stat.S_IMODE(st.st_mode),
        stat.filemode(st.st_mode),
        name(st.st_uid, user, False),
        name(st.st_gid, user, True),
        repr(st.st_mtime),
        link,
        json.dumps(metadata(path)),
        path,
    )
    out.append(b"".join(os.fsencode(f) + b"\0" for f in fields))


def walk(path: str, depth: int, user: str, out: "List[bytes]") -> None:
    try:
        names = sorted(os.listdir(path))
    except OSError:
        return
    for child in names:
        full = os.path.join(path, child)
        describe(full, user, out)
        if depth > 1 and os.path.isdir(full) and not os.path.islink(full):
            walk(full, depth - 1, user, out)


def fail(code: int, message: str) -> None:
    sys.stderr.write(message + "\n")
    sys.exit(code)


def main() -> None:
    mode = sys.argv[1]
    path = sys.argv[2]
    if mode == "tag":
        wanted = json.loads(sys.argv[3])
        try:
            for key in os.listxattr(path):
                if key.startswith(PREFIX):
                    os.removexattr(path, key)
            for key, value in wanted.items():
                os.setxattr(path, PREFIX + key, value.encode("utf-8"))
        except OSError as exc:
            fail(1, "cannot set metadata: %s" % exc.strerror)
        return
    depth, user = int(sys.argv[3]), sys.argv[4]
    if not os.path.lexists(path):
        fail(2, "no such file or directory")
    out: "List[bytes]" = []
    if depth == 0:
        describe(path, user, out)
    else:
        if not os.path.isdir(path):
            fail(3, "path is not a directory")
        if not os.access(path, os.R_OK | os.X_OK):
            fail(1, "permission denied")
        walk(path, depth, user, out)
    sys.stdout.buffer.write(b"".join(out))
    sys.stdout.buffer.flush()


main()
