"""Sphinx configuration of the asyncsandbox documentation.

Built, warnings as errors, with the command the README gives::

    uv run --group docs sphinx-build -W --keep-going -b html docs docs/_build/html
"""

import sys
from pathlib import Path

import asyncsandbox

sys.path.insert(0, str(Path(__file__).parent / "_ext"))

project = "asyncsandbox"
author = "the asyncsandbox authors"
copyright = "2026, the asyncsandbox authors"
release = asyncsandbox.__version__
version = release

extensions = [
    "sphinx.ext.autodoc",
    "sphinx.ext.intersphinx",
    "myst_parser",
    "asyncsandbox_docs",  # _ext/: public module names, links out of the docs
]
source_suffix = {".rst": "restructuredtext", ".md": "markdown"}
exclude_patterns = ["_build"]
root_doc = "index"

html_theme = "furo"
html_title = f"asyncsandbox {release}"
html_static_path: list[str] = []

# Markdown pages (MyST): GitHub's heading anchors, so that links written for GitHub work here.
myst_heading_anchors = 3
myst_enable_extensions = ["colon_fence", "deflist"]

# The API reference: public names only (every public module's objects claim it: see
# asyncsandbox._util.claim_public), in source order, with their bases.
autodoc_default_options = {
    "members": True,
    "show-inheritance": True,
    "member-order": "bysource",
}
autodoc_typehints = "signature"
autodoc_preserve_defaults = True
# Implementations document what is theirs; the contract they fulfil is documented once, on
# the abstract class (inspect_ai's docstrings, in another style, stay with inspect_ai).
autodoc_inherit_docstrings = False

# Python's own inventory when the machine has it (Debian: python3.11-doc, which CI installs);
# there is no network to fetch it from, and without it the names stay plain text.
_PYTHON_INVENTORY = Path("/usr/share/doc/python3.11/html/objects.inv")
intersphinx_mapping = (
    {"python": ("https://docs.python.org/3", str(_PYTHON_INVENTORY))}
    if _PYTHON_INVENTORY.is_file()
    else {}
)
