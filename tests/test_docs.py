"""The README and the documentation say what is true: every code block of theirs is run or
checked, their links lead somewhere, and the site builds with the whole public API in it.

Every fenced block of ``README.md``, ``docs/**/*.md``, the files those pages include and
the distributions' READMEs (their descriptions on the package index):

* ``python``: compiled (top-level ``await`` allowed: fragments of async code), and its
  imports of asyncsandbox run, so a renamed or removed name fails here. A block that is a
  whole program (it calls ``anyio.run`` or ``trio.run``, or an output block follows it)
  runs on the process backend and must exit 0; a following ```` ```text ```` block after an
  ``<!-- output -->`` line holds lines its output must contain.
* ``bash``: parsed by ``bash -n``; each ``asyncsandbox ...`` command in it names a real
  command, and the options it passes are that command's.
* ``toml``: parsed.
"""

from __future__ import annotations

import ast
import functools
import json
import os
import re
import shlex
import subprocess
import sys
import tomllib
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
DOCS = ROOT / "docs"


def _documents() -> list[Path]:
    pages = [README, *sorted(DOCS.rglob("*.md"))]
    pages = [p for p in pages if "_build" not in p.parts]
    pages += sorted(ROOT.glob("backends/*/README.md")) + sorted(
        ROOT.glob("integrations/*/README.md")
    )
    included = [
        (page.parent / target).resolve()
        for page in pages
        for target in re.findall(r"^```\{include\} (\S+)", page.read_text(), flags=re.MULTILINE)
    ]
    return list(dict.fromkeys([*pages, *included]))


DOCUMENTS = _documents()


@dataclass(frozen=True)
class Block:
    document: Path
    line: int  # of the opening fence, 1-based
    language: str
    code: str
    output: str | None  # the ```text block after an <!-- output --> line that follows it
    owner: str = ""  # a docstring's block: the name whose docstring it is in

    @property
    def id(self) -> str:
        if self.owner:
            return f"{self.owner} (docstring), block {self.line}"
        return f"{self.document.relative_to(ROOT)}:{self.line}"

    @property
    def runnable(self) -> bool:
        return self.output is not None or bool(re.search(r"\b(anyio|trio)\.run\(", self.code))


_FENCE = re.compile(r"^(```+)([\w{}-]*)[^\n]*\n(.*?)^\1[ \t]*$", flags=re.MULTILINE | re.DOTALL)


def _blocks(document: Path) -> list[Block]:
    text = document.read_text()
    found = [
        (text.count("\n", 0, m.start()) + 1, m.end(), m[2], m[3]) for m in _FENCE.finditer(text)
    ]
    blocks = []
    for i, (line, end, language, code) in enumerate(found):
        output = None
        if i + 1 < len(found):
            between = text[end : text.index("```", end)]
            if between.strip() == "<!-- output -->" and found[i + 1][2] == "text":
                output = found[i + 1][3]
        blocks.append(Block(document, line, language, code, output))
    return blocks


BLOCKS = [block for document in DOCUMENTS for block in _blocks(document)]
PYTHON = [b for b in BLOCKS if b.language == "python"]
RUNNABLE = [b for b in PYTHON if b.runnable]
BASH = [b for b in BLOCKS if b.language in ("bash", "sh", "shell")]
TOML = [b for b in BLOCKS if b.language == "toml"]
JSON = [b for b in BLOCKS if b.language == "json"]


def _ids(block: Block) -> str:
    return block.id


def test_the_documents_have_code_of_each_kind() -> None:
    """The collection works (a broken fence pattern would make every test below vacuous)."""
    assert DOCS / "getting-started.md" in DOCUMENTS
    assert ROOT / "bench" / "README.md" in DOCUMENTS  # included by docs/benchmarks.md
    assert len(PYTHON) > 30
    assert len(RUNNABLE) > 5
    assert len(BASH) > 15
    assert any(b.document == README for b in RUNNABLE)


# Blocks no test reads: output shown (```text) and the site's directives (MyST).
UNCHECKED = ("text", "{toctree}", "{include}")


def test_every_block_says_its_language_and_is_checked() -> None:
    """A block without a language, or in one no test reads, would escape every check."""
    checked = {"python", "bash", "sh", "shell", "toml", "json", *UNCHECKED}
    assert [b.id for b in BLOCKS if b.language not in checked] == []


@pytest.mark.parametrize("block", PYTHON, ids=_ids)
def test_python_block_compiles(block: Block) -> None:
    compile(block.code, block.id, "exec", flags=ast.PyCF_ALLOW_TOP_LEVEL_AWAIT)


def _our_imports(code: str) -> list[str]:
    tree = ast.parse(code)
    lines = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            lines += [f"import {a.name}" for a in node.names if a.name.startswith("asyncsandbox")]
        elif isinstance(node, ast.ImportFrom) and (node.module or "").startswith("asyncsandbox"):
            lines.append(ast.unparse(node))
    return lines


def _imports_of(document: Path) -> list[str]:
    return sorted(
        {line for b in _blocks(document) if b.language == "python" for line in _our_imports(b.code)}
    )


@pytest.mark.parametrize(
    "document", [d for d in DOCUMENTS if _imports_of(d)], ids=lambda d: str(d.relative_to(ROOT))
)
def test_asyncsandbox_imports_of_the_blocks_exist(document: Path) -> None:
    """Each import line runs here, in the test's process (an interpreter per document
    would import the integrations' heavy dependencies again each time)."""
    for line in _imports_of(document):
        exec(compile(line, str(document), "exec"), {})  # noqa: S102 - the docs' own imports


def _run(block: Block, root: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "ASYNCSANDBOX_PROCESS_ROOT": str(root)}
    return subprocess.run(
        [sys.executable, "-c", block.code],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
        cwd=root.parent,
        check=False,
    )


@pytest.mark.parametrize("block", RUNNABLE, ids=_ids)
def test_runnable_block_runs(block: Block, process_root: Path) -> None:
    done = _run(block, process_root)
    assert done.returncode == 0, done.stderr
    assert "Traceback" not in done.stderr, done.stderr
    if block.output is not None:
        printed = done.stdout.splitlines()
        for expected in block.output.splitlines():
            assert expected in printed, f"{expected!r} not printed; stdout:\n{done.stdout}"


def test_readme_quickstarts_say_what_they_print(process_root: Path) -> None:
    """The README's first example on asyncio and on trio, with the values its comments give."""
    readme = [b for b in RUNNABLE if b.document == README]
    asyncio_block = next(b for b in readme if "anyio.run(" in b.code)
    trio_block = next(b for b in readme if "trio.run(" in b.code)
    done = _run(asyncio_block, process_root)
    assert done.returncode == 0, done.stderr
    assert "0 45" in done.stdout
    # Killed at its 1 s timeout, not before (when it says so on a busy machine is not the
    # example's point: 1.3 s was seen).
    said = re.search(r"timed out after (\d+\.\d) s", done.stdout)
    assert said, done.stdout
    assert float(said[1]) >= 1.0, done.stdout
    done = _run(trio_block, process_root)
    assert done.returncode == 0, done.stderr
    assert done.stdout == "hello from trio\n"


@pytest.mark.parametrize("block", BASH, ids=_ids)
def test_bash_block_parses(block: Block) -> None:
    done = subprocess.run(
        ["bash", "-n"], input=block.code, capture_output=True, text=True, check=False
    )
    assert done.returncode == 0, done.stderr


@functools.cache
def _help(command: str) -> str:
    done = subprocess.run(
        [sys.executable, "-m", "asyncsandbox", *([command] if command else []), "--help"],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, f"asyncsandbox {command} --help: {done.stderr}"
    return done.stdout


def _commands(code: str) -> list[list[str]]:
    """The ``asyncsandbox ...`` commands of a shell block, continuation lines joined."""
    joined = re.sub(r"\\\n", " ", code)
    commands = []
    for line in joined.splitlines():
        line = line.split(" #", 1)[0].strip()
        words = shlex.split(line, comments=True) if line else []
        while words and re.match(r"[A-Za-z_]\w*=", words[0]):  # VAR=value before it
            words = words[1:]
        if words[:2] == ["uv", "run"]:
            words = words[2:]
        if words[:1] == ["asyncsandbox"]:
            commands.append(words[1:])
    return commands


@pytest.mark.parametrize("block", [b for b in BASH if _commands(b.code)], ids=_ids)
def test_asyncsandbox_commands_in_blocks_exist(block: Block) -> None:
    _check_commands(block)


def _check_commands(block: Block) -> None:
    for words in _commands(block.code):
        given = [w.split("=", 1)[0] for w in words if w.startswith("-")]
        if "--" in words:
            given = [w.split("=", 1)[0] for w in words[: words.index("--")] if w.startswith("-")]
        command = next((w for w in words if not w.startswith("-")), "")
        if command and command not in _help(""):
            pytest.fail(f"{block.id}: asyncsandbox has no command {command!r}")
        # options given before the command belong to asyncsandbox itself
        position = words.index(command) if command else len(words)
        for option in given:
            where = "" if words.index(option) < position else command
            if option not in ("--help", "-h", "-v", "-vv") and option not in _help(where):
                pytest.fail(f"{block.id}: `asyncsandbox {where}` has no option {option}")


@pytest.mark.parametrize("block", TOML, ids=_ids)
def test_toml_block_parses(block: Block) -> None:
    tomllib.loads(block.code)


@pytest.mark.parametrize("block", JSON, ids=_ids)
def test_json_block_parses(block: Block) -> None:
    json.loads(block.code)


# -- the code blocks of the docstrings, which the API reference shows ------------------

# A docstring's literal block (after ``::``) is Python unless listed here, by the name
# whose docstring holds it and its first line.
DOCSTRING_BLOCKS_NOT_PYTHON = {
    ("asyncsandbox.cli", '[project.entry-points."asyncsandbox.commands"]'): "toml",
    ("asyncsandbox.tools", "Exit code: 0"): "text",  # the observations the model reads
    ("asyncsandbox.tools", "exit=1"): "text",
    ("asyncsandbox_remote.server", 'ASYNCSANDBOX_API_KEYS="alice:$(openssl rand -hex 24)" \\'): (
        "bash"
    ),
}


def _literal_blocks(docstring: str) -> list[str]:
    """The literal blocks of a reST docstring: the indented lines after a ``::`` line."""
    lines = docstring.splitlines()
    blocks = []
    for i, line in enumerate(lines):
        if not line.rstrip().endswith("::") or line.lstrip().startswith(".."):
            continue
        j = i + 1
        while j < len(lines) and not lines[j].strip():
            j += 1
        indent = len(line) - len(line.lstrip())
        if j == len(lines) or len(lines[j]) - len(lines[j].lstrip()) <= indent:
            continue
        inner = len(lines[j]) - len(lines[j].lstrip())
        block = []
        while j < len(lines) and (
            not lines[j].strip() or len(lines[j]) - len(lines[j].lstrip()) >= inner
        ):
            block.append(lines[j][inner:])
            j += 1
        blocks.append("\n".join(block).strip("\n") + "\n")
    return blocks


def _docstring_blocks() -> list[Block]:
    """Every literal block of the docstrings of the public modules, their public names and
    those names' public members (what the API reference renders)."""
    import importlib
    import inspect

    docstrings: dict[str, str] = {}

    def add(name: str, obj: object) -> None:
        obj = getattr(obj, "__func__", getattr(obj, "fget", obj))
        docstring = inspect.getdoc(obj) if not isinstance(obj, (str, int, float)) else None
        if docstring and "::" in docstring and name not in docstrings:
            docstrings[name] = docstring

    for modname in _public_modules():
        module = importlib.import_module(modname)
        add(modname, module)
        for name in module.__all__:
            obj = getattr(module, name)
            add(f"{modname}.{name}", obj)
            if inspect.isclass(obj):
                for member, value in vars(obj).items():
                    if not member.startswith("_"):
                        add(f"{modname}.{name}.{member}", value)
    blocks = []
    for owner, docstring in docstrings.items():
        for index, code in enumerate(_literal_blocks(docstring)):
            first = code.splitlines()[0]
            language = DOCSTRING_BLOCKS_NOT_PYTHON.get((owner, first), "python")
            # document: the module's file; line: the block's index in the docstring
            source = Path(inspect.getfile(importlib.import_module(owner.split(".")[0])))
            blocks.append(Block(source, index + 1, language, code, None, owner))
    return blocks


@pytest.mark.slow  # imports every public module, integrations included (~40 s here)
def test_the_code_blocks_of_the_docstrings_are_checked() -> None:
    """The API reference's examples: Python compiled and its asyncsandbox imports run,
    TOML parsed, shell parsed and its asyncsandbox commands checked; the non-Python ones
    are exactly those listed (so a Python example that stops compiling fails here)."""
    blocks = _docstring_blocks()
    assert sum(b.language == "python" for b in blocks) > 10  # the collection works
    listed = {(b.owner, b.code.splitlines()[0]) for b in blocks if b.language != "python"}
    assert listed == set(DOCSTRING_BLOCKS_NOT_PYTHON)
    imports = []
    for block in blocks:
        if block.language == "python":
            test_python_block_compiles(block)
            imports += _our_imports(block.code)
        elif block.language == "toml":
            test_toml_block_parses(block)
        elif block.language == "bash":
            test_bash_block_parses(block)
            assert _commands(block.code), block.id
            _check_commands(block)
    done = subprocess.run(
        [sys.executable, "-c", "\n".join(sorted(set(imports)))],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr


def test_the_error_tree_of_the_docs_is_the_code_s() -> None:
    import asyncsandbox._errors

    tree = [b for b in BLOCKS if b.language == "text" and b.code.startswith("SandboxError\n")]
    assert len(tree) == 1
    source = asyncsandbox._errors.__doc__ or ""
    drawn = [line[4:] for line in source.splitlines() if line.startswith("    ")]
    assert tree[0].code.splitlines() == drawn[: len(tree[0].code.splitlines())]


_LINK = re.compile(r"\]\(([^)\s]+)\)")


@pytest.mark.parametrize("document", DOCUMENTS, ids=lambda d: str(d.relative_to(ROOT)))
def test_relative_links_lead_to_files(document: Path) -> None:
    text = _FENCE.sub("", document.read_text())
    missing = []
    for target in _LINK.findall(text):
        if re.match(r"[a-z]+:", target) or target.startswith("#"):
            continue
        path = target.split("#", 1)[0]
        if not (document.parent / path).exists():
            missing.append(target)
    assert missing == []


# -- the site ------------------------------------------------------------------------------


def _public_modules() -> list[str]:
    """The core's public modules and every workspace distribution's (each wheel's packages
    and their submodules whose names have no private part)."""
    import importlib
    import pkgutil

    packages = ["asyncsandbox"]
    for pyproject in sorted(ROOT.glob("*/*/pyproject.toml")):
        with pyproject.open("rb") as file:
            wheel = tomllib.load(file)["tool"]["hatch"]["build"]["targets"]["wheel"]
        packages += wheel["packages"]
    found = []
    for package in packages:
        found.append(package)
        path = importlib.import_module(package).__path__
        walked = pkgutil.walk_packages(path, f"{package}.")
        found += [m.name for m in walked if not any(p.startswith("_") for p in m.name.split("."))]
    return found


# The command the README gives, but for the output directory.
BUILD = ("-m", "sphinx", "-W", "--keep-going", "-b", "html")


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The site, built here; or, in CI, the one its docs step built from this checkout with
    the README's command moments before (``ASYNCSANDBOX_TEST_DOCS_SITE``: not twice)."""
    if built := os.environ.get("ASYNCSANDBOX_TEST_DOCS_SITE"):
        assert (Path(built) / "objects.inv").is_file(), f"no site built at {built}"
        return Path(built)
    out = tmp_path_factory.mktemp("site")
    done = subprocess.run(
        [sys.executable, *BUILD, "-d", str(out / "doctrees"), str(DOCS), str(out / "html")],
        capture_output=True,
        text=True,
        timeout=900,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-5000:]
    return out / "html"


def _inventory(site: Path) -> dict[str, str]:
    """The documented objects (``objects.inv``): name -> role, for the Python domain."""
    import zlib

    raw = (site / "objects.inv").read_bytes()
    body = zlib.decompress(raw.split(b"\n", 4)[4]).decode()
    found = {}
    for line in body.splitlines():
        name, role = line.split(" ", 2)[:2]
        if role.startswith("py:"):
            found[name] = role
    return found


def _private(name: str) -> bool:
    return any(part.startswith("_") and not part.startswith("__") for part in name.split("."))


@pytest.mark.slow
@pytest.mark.timeout(900)  # a whole Sphinx build (about 20 s of CPU)
def test_the_reference_documents_every_public_name_and_no_private_module(site: Path) -> None:
    import importlib

    documented = _inventory(site)
    missing = []
    modules = _public_modules()
    assert "asyncsandbox_remote.server" in modules  # the discovery works
    for modname in modules:
        module = importlib.import_module(modname)
        assert documented.get(modname) == "py:module", modname
        for name in module.__all__:
            obj = getattr(module, name)
            home = getattr(obj, "__module__", None)
            qualname = getattr(obj, "__qualname__", name)
            if f"{modname}.{name}" not in documented and f"{home}.{qualname}" not in documented:
                missing.append(f"{modname}.{name}")
    assert missing == []
    assert [name for name in documented if _private(name)] == []
    for page in sorted((site / "api").glob("*.html")):
        named = re.findall(r"asyncsandbox\w*(?:\.\w+)*\._[a-z]\w*", page.read_text())
        assert named == [], page.name


def test_the_readme_is_a_landing_page() -> None:
    """At most 200 lines, with the two commands a newcomer runs and the docs command, each
    under the marker CI reads it by; the rest lives in the documentation it links to."""
    text = README.read_text()
    assert len(text.splitlines()) <= 200
    blocks = {b.code.strip() for b in BLOCKS if b.document == README and b.language == "bash"}
    assert "uv run asyncsandbox demo" in blocks
    for marker, command in (
        ("<!-- ci: test command -->", "uv run pytest -n auto"),
        (
            "<!-- ci: docs command -->",
            "uv run --group docs sphinx-build -W --keep-going -b html docs docs/_build/html",
        ),
    ):
        after = text.split(marker + "\n", 1)[1]
        assert after.startswith(f"```bash\n{command}\n```"), marker
    linked = set(_LINK.findall(text))
    for page in ("docs/getting-started.md", "docs/concepts.md", "docs/api/index.rst"):
        assert page in linked
