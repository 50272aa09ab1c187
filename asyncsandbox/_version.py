"""The version of the ``asyncsandbox`` distribution: the one place it is written (hatchling
reads it from here when it builds, see ``[tool.hatch.version]`` in pyproject.toml)."""

__version__ = "0.1.0.dev0"
