"""An inspect_ai sandbox provider backed by asyncsandbox: ``sandbox="asyncsandbox"``.

inspect_ai imports this package through its ``inspect_ai`` entry point, which registers
the provider.
"""

from ._provider import (
    AsyncSandboxConfig as AsyncSandboxConfig,
    AsyncSandboxEnvironment as AsyncSandboxEnvironment,
)

__all__ = ("AsyncSandboxConfig", "AsyncSandboxEnvironment")

# Show public objects as `asyncsandbox_inspect.X` (in reprs, tracebacks and the API reference),
# as anyio does for its own.
for _obj in (AsyncSandboxConfig, AsyncSandboxEnvironment):
    _obj.__module__ = __name__
del _obj
