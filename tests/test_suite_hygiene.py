"""The test suite's own rules, checked on its source: no test synchronises by sleeping, no
test module imports another or runs past 700 lines (a family of modules split by subject
shares its fixtures through tests/_<family>_support.py), and the helpers shared across
families exist once (in tests/_support/)."""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

TESTS = Path(__file__).resolve().parent
SUPPORT = TESTS / "_support"  # a package: a module per subject
DATA = {"seed_blocks"}  # the guides' code, kept as they wrote it: not ours

# The sleeps that are the behaviour under test, not a wait for another task or process:
# (file, the function it is in, the call) -> why. Anything else that sleeps fails the check
# below; wait for an event, for anyio.wait_all_tasks_blocked(), or poll a condition under a
# deadline with _support.eventually()/eventually_async().
SLEEPS_UNDER_TEST = {
    ("_support/_waiting.py", "eventually", "time.sleep(POLL_INTERVAL)"): (
        "the poll interval of a condition under a deadline (what another process does "
        "cannot be awaited)"
    ),
    ("_support/_waiting.py", "eventually_async", "anyio.sleep(POLL_INTERVAL)"): (
        "the poll interval of a condition under a deadline"
    ),
    ("_support/_waiting.py", "watch", "anyio.sleep(every)"): (
        "an observer's sampling interval, until cancelled: it waits for nothing"
    ),
    ("test_docker_exec.py", "test_executor_releases_every_job_and_idles", "anyio.sleep(1.0)"): (
        "the window over which an idle executor's CPU time is measured"
    ),
    ("test_docker_exec.py", "test_a_slow_reader_is_not_a_stalled_executor", "anyio.sleep(5)"): (
        "past the 2 s call deadline, which must not fire: a deadline that does not fire is "
        "shown by waiting past it"
    ),
    (
        "torture/test_escapes.py",
        "test_commands_of_other_sandboxes_cannot_be_signalled",
        "anyio.sleep(1)",
    ): (
        "code injected by the attack kit strikes when its process's system call returns: "
        "a proof by absence waits"
    ),
    ("test_smolagents.py", "__init__", "time.sleep(2)"): (
        "a tool's definition that outlasts a step's timeout (it runs in the sandbox)"
    ),
    ("torture/_proxy.py", "_gate", "anyio.sleep(self.delay)"): (
        "the fault injected: a slow daemon"
    ),
    ("torture/test_load.py", "chaos", "anyio.sleep(rng.uniform(0.2, 0.6))"): (
        "the fault injected: a kill from outside at a random moment"
    ),
    ("torture/test_load.py", "cancel_later", "anyio.sleep(rng.uniform(0, 1.5))"): (
        "the fault injected: a cancellation at a random point of an operation"
    ),
}
SLEEP_NAMES = {"sleep", "sleep_until"}  # anyio, trio, asyncio and time; sleep_forever waits
# for cancellation, not for a while


def suite_files() -> Iterator[Path]:
    """The suite's Python files (its data aside)."""
    for path in sorted(TESTS.rglob("*.py")):
        if not DATA.intersection(path.relative_to(TESTS).parts):
            yield path


def sleeps(tree: ast.AST) -> Iterator[tuple[str, ast.Call]]:
    """Every sleep call in ``tree``, with the name of the function it is in."""

    def visit(node: ast.AST, scope: str) -> Iterator[tuple[str, ast.Call]]:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef):
                yield from visit(child, child.name)
                continue
            if isinstance(child, ast.Call):
                name = (
                    child.func.attr
                    if isinstance(child.func, ast.Attribute)
                    else child.func.id
                    if isinstance(child.func, ast.Name)
                    else None
                )
                if name in SLEEP_NAMES:
                    yield scope, child
            yield from visit(child, scope)

    yield from visit(tree, "<module>")


def test_no_test_sleeps_to_synchronise() -> None:
    """A sleep that "gives it time" is a flake waiting for a busy machine: every sleep call
    in the tests is one of the few that are the behaviour under test (listed above, each
    with its reason). The commands the tests run in sandboxes are programs under test:
    their sleeps are theirs."""
    found = set()
    unlisted = []
    for path in suite_files():
        relative = path.relative_to(TESTS).as_posix()
        for function, call in sleeps(ast.parse(path.read_text(), str(path))):
            key = (relative, function, ast.unparse(call))
            found.add(key)
            if key not in SLEEPS_UNDER_TEST:
                unlisted.append(f"{relative}:{call.lineno} in {function}: {ast.unparse(call)}")
    assert not unlisted, (
        "tests that sleep to synchronise (wait for an event, anyio.wait_all_tasks_blocked(), "
        "or poll a condition with tests/_support.eventually/eventually_async):\n"
        + "\n".join(unlisted)
    )
    assert set(SLEEPS_UNDER_TEST) <= found, (
        f"allowed sleeps that are gone (remove them from the list): "
        f"{sorted(set(SLEEPS_UNDER_TEST) - found)}"
    )


def _is_test_module(name: str) -> bool:
    last = name.rsplit(".", 1)[-1]
    return last.startswith("test_") or last == "conftest"


def _package(path: Path) -> list[str]:
    return ["tests", *path.relative_to(TESTS).parent.parts]


def imported_modules(path: Path, source: str | None = None) -> Iterator[tuple[int, str]]:
    """The modules the file at ``path`` imports (relative imports resolved), with their
    line."""
    text = path.read_text() if source is None else source
    for node in ast.walk(ast.parse(text, str(path))):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield node.lineno, alias.name
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                package = _package(path)
                base = package[: len(package) - node.level + 1]
                module = ".".join([*base, *([node.module] if node.module else [])])
            else:
                module = node.module or ""
            yield node.lineno, module
            for alias in node.names:  # `from . import test_x` imports a module too
                yield node.lineno, f"{module}.{alias.name}"


def test_no_test_module_imports_another() -> None:
    """Shared helpers live in tests/_support/; a test module (or a conftest) is never
    imported by another module of the suite."""
    offenders = []
    for path in suite_files():
        for line, module in imported_modules(path):
            if module.startswith("tests.") and _is_test_module(module):
                offenders.append(f"{path.relative_to(TESTS)}:{line} imports {module}")
    assert not offenders, "\n".join(offenders)


def test_the_import_check_sees_relative_and_absolute_imports() -> None:
    source = (
        "from .test_remote import Server\n"
        "from ..conftest import x\n"
        "from . import test_state\n"
        "import tests.test_docker\n"
        "from ._support import eventually\n"
    )
    found = {name for _, name in imported_modules(TESTS / "torture" / "x.py", source)}
    assert {"tests.torture.test_remote", "tests.conftest", "tests.torture.test_state"} <= found
    assert "tests.test_docker" in found
    assert not _is_test_module("tests._support.eventually")
    assert all(
        _is_test_module(n)
        for n in ("tests.torture.test_remote", "tests.conftest", "tests.test_docker")
    )


def test_shared_helpers_are_defined_once() -> None:
    """The functions the tests/_support package defines are not defined again in a test
    module (there were three eventually() and three processes_with())."""
    support = [path for path in suite_files() if SUPPORT in path.parents]
    shared = {
        node.name
        for path in support
        for node in ast.parse(path.read_text(), str(path)).body
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef)
    }
    again = [
        f"{path.relative_to(TESTS)}:{node.lineno} defines {node.name}"
        for path in suite_files()
        if path not in support
        for node in ast.parse(path.read_text(), str(path)).body
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) and node.name in shared
    ]
    assert not again, "\n".join(again)


MAX_LINES = 700  # as the package's modules (tests/test_structure.py)


def test_no_test_module_too_long() -> None:
    long = [
        f"{path.relative_to(TESTS)}: {lines} lines"
        for path in sorted(TESTS.rglob("*.py"))
        if not DATA & set(path.relative_to(TESTS).parts)
        and (lines := path.read_text().count("\n")) > MAX_LINES
    ]
    assert long == []
