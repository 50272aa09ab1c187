"""What the asyncsandbox documentation needs beyond Sphinx, autodoc and MyST.

* **Attribute docs of public objects.** Every public object reports its public module
  (``asyncsandbox.Limits``, not ``asyncsandbox._config.Limits``), so autodoc looks for the
  docstrings written under a class's fields (``max_live: int | None = None`` then
  ``\"\"\"...\"\"\"``) in the public module's source, where they are not. The source analyzer of
  a public module is given the attribute docs of the private modules that define its
  objects: the reference shows them, under the public names.
* **Public bases.** A class deriving from a private helper class shows the helper's public
  bases instead.
* **Links out of the docs.** The Markdown pages are written to be read on GitHub too, so
  they link to the repository's files by relative paths (``../examples/x.py``). Sphinx
  makes a download of a linked file; a linked Markdown file outside ``docs/`` would be
  taken for a missing page, so it is made a download too (``path:`` links).
"""

from __future__ import annotations

import importlib
import re
import sys
from pathlib import Path
from typing import Any

from sphinx.application import Sphinx
from sphinx.errors import PycodeError
from sphinx.pycode import ModuleAnalyzer

REPOSITORY = Path(__file__).resolve().parents[2]


def public_modules() -> list[str]:
    """The public modules of the core and of every distribution of the workspace: each
    wheel's packages and their submodules, but those with a private name (``_x``)."""
    import pkgutil
    import tomllib

    packages = ["asyncsandbox"]
    for pyproject in sorted(REPOSITORY.glob("*/*/pyproject.toml")):
        with pyproject.open("rb") as file:
            build = tomllib.load(file).get("tool", {}).get("hatch", {}).get("build", {})
        packages += build.get("targets", {}).get("wheel", {}).get("packages", [])
    found = []
    for package in packages:
        module = importlib.import_module(package)
        found.append(package)
        walked = pkgutil.walk_packages(module.__path__, prefix=f"{package}.")
        found += [info.name for info in walked if not _is_private(info.name)]
    return found


def _is_private(modname: str) -> bool:
    return any(part.startswith("_") for part in modname.split("."))


_PUBLIC: set[str] = set()  # filled when the extension is set up
_original_analyze = ModuleAnalyzer.analyze


def _analyze(self: ModuleAnalyzer) -> None:
    merge = not self._analyzed and self.modname in _PUBLIC
    _original_analyze(self)
    if merge:
        _merge_private_sources(self)


def _merge_private_sources(analyzer: ModuleAnalyzer) -> None:
    """Give ``analyzer`` (a public module's) the attribute docs, annotations, ``@final``
    marks and source order that private modules wrote for the objects the public module exports: entries of
    a name whose object the private module holds (it defines it or imports it; only the
    definer has entries)."""
    public = importlib.import_module(analyzer.modname)
    exported = {name: getattr(public, name) for name in getattr(public, "__all__", ())}
    root = analyzer.modname.split(".")[0]
    for modname, module in list(sys.modules.items()):
        if module is None or not modname.startswith(root) or not _is_private(modname):
            continue
        try:
            other = ModuleAnalyzer.for_module(modname)
            other.analyze()
        except PycodeError:  # no source to read (a namespace package): nothing to give
            continue
        held = {
            name: obj for name, obj in vars(module).items() if exported.get(name, module) is obj
        }

        def ours(qualname: str, attr: str, held: dict[str, object] = held) -> bool:
            return (qualname.split(".")[0] if qualname else attr) in held

        for key, doc in other.attr_docs.items():
            if ours(*key):
                analyzer.attr_docs.setdefault(key, doc)
        for key, annotation in other.annotations.items():
            if ours(*key):
                analyzer.annotations.setdefault(key, annotation)
        for name in other.finals:  # ``@final``: shown as "final class"
            if ours(*name.rpartition(".")[::2]) and name not in analyzer.finals:
                analyzer.finals.append(name)
        offset = len(analyzer.tagorder)
        for name, order in other.tagorder.items():
            if ours(*name.rpartition(".")[::2]):
                analyzer.tagorder.setdefault(name, offset + order)


_MD_LINK = re.compile(r"(\]\()(?!(?:[a-z]+:|#|/))([^)\s#]+)(#[^)\s]*)?(\))")


def _link_out(app: Sphinx, docname: str, source: list[str]) -> None:
    """Relative Markdown links to Markdown files outside the docs become downloads."""
    if app.env.doc2path(docname).suffix != ".md":
        return
    here = Path(app.env.doc2path(docname)).parent
    srcdir = Path(app.srcdir).resolve()

    def replace(match: re.Match[str]) -> str:
        target = (here / match[2]).resolve()
        if target.suffix == ".md" and target.is_file() and not target.is_relative_to(srcdir):
            return f"{match[1]}path:{match[2]}{match[4]}"
        return match[0]

    source[0] = _MD_LINK.sub(replace, source[0])


def _public_bases(app: Sphinx, name: str, obj: object, options: object, bases: list[type]) -> None:
    """A private base class (``_Config``) is shown as the public classes it derives from."""
    public: list[type] = []
    pending = list(bases)
    while pending:
        base = pending.pop(0)
        if isinstance(base, type) and (
            base.__name__.startswith("_") or _is_private(base.__module__)
        ):
            pending[:0] = [b for b in base.__bases__ if b is not object]
        elif base not in public:
            public.append(base)
    bases[:] = public or [object]


def setup(app: Sphinx) -> dict[str, Any]:
    # Every public module claims its objects when it is imported: import them all before any
    # page is read, so that a signature naming a type of another public module (Session.judge
    # and asyncsandbox.judge.TestCase) names it by its public module.
    _PUBLIC.update(public_modules())
    ModuleAnalyzer.analyze = _analyze  # type: ignore[method-assign]
    app.connect("source-read", _link_out)
    app.connect("autodoc-process-bases", _public_bases)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
