"""Drop-in modules for code written against other sandbox APIs, over asyncsandbox's own.

* :mod:`asyncsandbox.compat.cwsandbox`: the CoreWeave sandbox SDK (``cwsandbox``), as its
  RL guides use it. Change only the imports::

      import asyncsandbox.compat.cwsandbox as cwsandbox
      from asyncsandbox.compat.cwsandbox import Sandbox, SandboxDefaults, Session

* :mod:`asyncsandbox.compat.aviato`: the same SDK under its earlier name (``aviato``), with
  that spelling's metric names (``aviato/exec_successes``...) and ``execution_stats``.

Both are thin layers over :mod:`asyncsandbox.sync`: the sandboxes, limits and cleanup are
asyncsandbox's. Cloud-only features raise :class:`~asyncsandbox.compat.cwsandbox.
CloudOnlyFeatureError` naming what is not available locally.
"""

__all__ = ()
